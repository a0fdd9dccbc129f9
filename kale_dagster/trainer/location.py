"""Where checkpoints live: a path (a shared volume) or an object-store URL (``s3://``, ``gs://``, ``az://``).

Pure and light: the code server checks a location when it loads a pipeline, without fsspec or a store's package.
A URL is opened through fsspec by ``trainer.checkpoint``; each store's package is an extra of kale-dagster.
"""

from __future__ import annotations

import importlib.util
import re

from kale_dagster.errors import KaleConfigError

#: Each URL scheme a checkpoint location may have: the package fsspec opens it with, and the extra that installs it.
STORES = {
    "s3": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "az": ("adlfs", "azure"),
    "abfs": ("adlfs", "azure"),
    "abfss": ("adlfs", "azure"),
}
_SCHEME_NAME = r"[A-Za-z][A-Za-z0-9+.-]*"  # RFC 3986's
_SCHEME = re.compile(f"^({_SCHEME_NAME})://")
#: A field rule: a URL of a known store (the Kubernetes launcher's checkpoint_url).
STORE_URL = "(?:" + "|".join(STORES) + r")://[^/\s]+(?:/.*)?"
_EXAMPLES = "s3://bucket/prefix, gs://bucket/prefix or az://container/prefix"
STORE_HINT = f"must be an object-store URL: {_EXAMPLES}"
#: A field rule: a path (no scheme), or a URL of a known store.  Written out so the YAML schema can say it too.
PATTERN = f"(?:{STORE_URL}|(?!{_SCHEME_NAME}://)\\S.*)"
HINT = f"must be a path (a shared volume) or an object-store URL: {_EXAMPLES}"


def scheme(location: str) -> str | None:
    """``s3`` for ``s3://bucket/prefix``; None for a path."""
    found = _SCHEME.match(location)
    return found.group(1).lower() if found else None


def is_object_store(location: str) -> bool:
    return scheme(location) is not None


def require_store(location: str, field: str = "checkpoint_dir") -> None:
    """Fail in one line when the package that opens ``location`` is not installed (never a local folder instead)."""
    kind = scheme(location)
    if kind is None:
        return
    if kind not in STORES:
        raise KaleConfigError(field, f"unknown scheme {kind}://; {HINT}")
    package, extra = STORES[kind]
    if importlib.util.find_spec(package) is None:
        raise KaleConfigError(
            field, f"{kind}:// needs {package}, which is not installed: pip install 'kale-dagster[{extra}]'"
        )
