"""Typed sensor cursors: a frozen dataclass that round-trips through the JSON string Dagster stores.

Reading is lenient in the ways an upgrade needs: a key the dataclass no
longer has is dropped, a missing key takes its default, and an empty,
unreadable or wrongly shaped cursor (``valid`` says) starts fresh, so a
sensor never crashes on a cursor written by another version.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import Any, ClassVar, TypeVar

C = TypeVar("C", bound="JsonCursor")


class JsonCursor:
    """Mixin for ``@dataclass(frozen=True)`` cursors."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # a dataclass's, declared for type checkers

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls: type[C], text: str | None) -> C:
        try:
            data = json.loads(text) if text else {}
        except ValueError:
            data = {}
        known = {f.name for f in fields(cls)}
        try:
            cursor = cls(**{k: v for k, v in (data if isinstance(data, dict) else {}).items() if k in known})
        except (TypeError, ValueError):
            return cls()
        return cursor if cursor.valid() else cls()

    def valid(self) -> bool:
        """Whether the fields have the shapes this version writes; a subclass checks its own."""
        return True


def is_number(value, optional: bool = False) -> bool:
    """A JSON number (not a boolean), or None when ``optional``."""
    return (optional and value is None) or (isinstance(value, (int, float)) and not isinstance(value, bool))
