"""Command-line flags derived from a declaration's field rules (``kale_dagster.rules``).

A flag per ruled field, named after it (``max_workers`` -> ``--max-workers``), with the field's type,
default and description, so a new field of ``Limits`` is a new flag of every command that takes limits,
with nothing written here.  Errors name the flag, not the field.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from kale_dagster.cli import Parser
from kale_dagster.rules import flag, flag_arguments, renamed, rule_of


def add_flags(parser: Parser, cls: type, exclude: tuple[str, ...] = ()) -> None:
    """One flag per ruled field of the dataclass ``cls`` (but the ``exclude``d, which the command sets itself)."""
    for f in dataclasses.fields(cls):
        rule = rule_of(f)
        if rule is None or f.name in exclude:
            continue
        bounds = {"ge": rule.ge, "gt": rule.gt, "le": rule.le, "lt": rule.lt}
        parser.add_argument(
            flag(f.name),
            **flag_arguments(cls, f),
            **({"choices": list(rule.choices)} if isinstance(rule.choices, tuple) else {}),
            **{k: v for k, v in bounds.items() if v is not None},
        )


def from_flags(cls: Any, args: argparse.Namespace, **overrides: Any) -> Any:
    """``cls`` built from the flags ``add_flags`` declared (and ``overrides``); an error names each bad flag."""
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)
        if rule_of(f) is not None and f.name not in overrides
    }
    return renamed(flag, cls, **{**values, **overrides})
