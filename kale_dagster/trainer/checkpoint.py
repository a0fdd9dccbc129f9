"""Atomic checkpoints on a shared volume or in object storage: a checkpoint is restored only when it is whole.

A checkpoint is two objects, written in this order:

* ``ckpt-<step>.pt``: model, optimizer, scheduler, the user's state and the consumed offsets (``torch.save``);
* ``ckpt-<step>.json``: its manifest, the data's size and SHA-256, written last.

Loading takes the newest checkpoint whose manifest is there and whose data matches it.  Anything else (an upload
cut off mid-way, data whose manifest was never written, data that does not match its manifest) is skipped with a
warning, never restored.  The last ``keep`` checkpoints are kept; older ones, and the data of writes that never got
a manifest, are pruned (each manifest before its data, so no manifest ever names missing data).

A location is a path (each object written to a temporary name, fsynced, renamed, the directory fsynced) or an
object-store URL (``s3://``, ``gs://``, ``az://``, see ``trainer.location``) opened through fsspec, where an object
is visible only once its upload completed.  Credentials come from the store's own chain (the environment, a
Secret's keys in it, the node's or the workload's identity), never from a flag, a manifest or a log; fsspec's
``FSSPEC_S3_*`` variables set the rest (an endpoint, timeouts).  A write that fails (a full or read-only volume, a
store that stopped answering) raises ``CheckpointWriteError``; the previous checkpoint stays the latest.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kale_dagster.trainer.location import is_object_store, require_store

_DATA = re.compile(r"^ckpt-(\d{12})\.pt$")
_MANIFEST = re.compile(r"^ckpt-(\d{12})\.json$")
log = logging.getLogger(__name__)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full or read-only volume, a store that failed); the previous one stays
    the latest."""


@dataclass(frozen=True, order=True)
class Checkpoint:
    """A complete checkpoint: its manifest is written."""

    step: int

    @property
    def name(self) -> str:
        return f"ckpt-{self.step:012d}.pt"

    @property
    def manifest(self) -> str:
        return f"ckpt-{self.step:012d}.json"


class _Volume:
    """A directory: each object written under a temporary name, fsynced and renamed (atomic on POSIX)."""

    def __init__(self, location: str | os.PathLike):
        self.root = Path(location)
        self.where = str(self.root)

    def names(self) -> list[str]:
        return [p.name for p in self.root.iterdir()] if self.root.is_dir() else []

    def put(self, name: str, data: bytes) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / name
        tmp = final.with_name(name + ".tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        except OSError:
            try:
                tmp.unlink(missing_ok=True)  # give back the space the partial file took
            except OSError:
                pass  # a read-only volume keeps it; loading never reads a .tmp file
            raise
        dir_fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def get(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def remove(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)


class _ObjectStore:
    """A bucket prefix through fsspec: an upload (one PUT, or a multipart upload completed at its end) is visible
    only once whole.  Every call has a deadline: a store that stops answering mid-upload would otherwise hold the
    group's step for good (a client's read timeout does not cover sending a part)."""

    def __init__(self, location: str, options: dict[str, Any] | None, timeout_s: float):
        import fsspec

        require_store(location)
        self.where = location.rstrip("/")
        self.fs, root = fsspec.core.url_to_fs(self.where, **(options or {}))
        self.root = root.rstrip("/")
        self.timeout_s = timeout_s

    def _call(self, method: str, *args, **kwargs) -> Any:
        """``fs.<method>(...)``, cancelled (its connection closed) past the deadline."""
        from fsspec.asyn import sync
        from fsspec.exceptions import FSTimeoutError

        if not getattr(self.fs, "async_impl", False):  # a synchronous store: its own timeouts
            return getattr(self.fs, method)(*args, **kwargs)
        try:
            return sync(self.fs.loop, getattr(self.fs, "_" + method), *args, timeout=self.timeout_s, **kwargs)
        except FSTimeoutError:
            raise TimeoutError(f"no answer from the store within {self.timeout_s:g} s") from None

    def names(self) -> list[str]:
        self.fs.invalidate_cache(self.root)  # another process (the previous group) wrote the latest ones
        try:
            return [posixpath.basename(p.rstrip("/")) for p in self._call("ls", self.root, detail=False)]
        except FileNotFoundError:
            return []

    def put(self, name: str, data: bytes) -> None:
        self._call("pipe_file", f"{self.root}/{name}", data)

    def get(self, name: str) -> bytes:
        return self._call("cat_file", f"{self.root}/{name}")

    def remove(self, name: str) -> None:
        try:
            self._call("rm_file", f"{self.root}/{name}")
        except FileNotFoundError:
            pass


class CheckpointStore:
    """The checkpoints of one location (a path or an object-store URL); ``options`` go to fsspec (tests give an
    endpoint and keys; a deployment leaves them to the environment); ``timeout_s`` bounds each call to a store."""

    def __init__(self, location: str | os.PathLike, options: dict[str, Any] | None = None, timeout_s: float = 600.0):
        location = str(location)
        self.backend: _Volume | _ObjectStore = (
            _ObjectStore(location, options, timeout_s) if is_object_store(location) else _Volume(location)
        )
        self.where = self.backend.where
        self._latest: Checkpoint | None = None  # the newest complete one seen: named when a write fails

    def checkpoints(self) -> list[Checkpoint]:
        """The complete checkpoints (manifest written), oldest first."""
        found = sorted(Checkpoint(int(m.group(1))) for m in map(_MANIFEST.match, self.backend.names()) if m)
        self._latest = found[-1] if found else None
        return found

    def save(self, step: int, state: dict, keep: int = 3) -> str:
        """Write the checkpoint of ``step``; returns where its data is (a path or a URL)."""
        buffer = io.BytesIO()
        torch.save(state, buffer)  # serialised first: torch.save would hide the write's errno in a RuntimeError
        data = buffer.getvalue()
        done = Checkpoint(step)
        manifest = {"step": step, "data": done.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        try:
            self.backend.put(done.name, data)
            self.backend.put(done.manifest, json.dumps(manifest).encode())  # last: the checkpoint is complete
        except Exception as exc:  # a volume's OSError, a store's own errors (a timeout, a refused request)
            raise CheckpointWriteError(
                f"could not write checkpoint {done.name} to {self.backend.where}: {_one_line(exc)}; "
                f"{self._latest_name()} stays the latest"
            ) from exc
        self._latest = done
        self._prune(keep)
        return f"{self.where}/{done.name}"

    def load_latest(self) -> dict | None:
        """The newest complete checkpoint that loads, or None when there is none."""
        for checkpoint in reversed(self.checkpoints()):
            try:
                manifest = json.loads(self.backend.get(checkpoint.manifest))
                data = self.backend.get(checkpoint.name)
                if len(data) != manifest["bytes"] or hashlib.sha256(data).hexdigest() != manifest["sha256"]:
                    raise ValueError(f"its data ({len(data)} bytes) does not match its manifest")
                return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
            except Exception as exc:  # torn, corrupt or unreadable: fall back to an older one
                log.warning("skipping checkpoint %s in %s: %s", checkpoint.name, self.backend.where, _one_line(exc))
        return None

    def _latest_name(self) -> str:
        if self._latest is None:
            try:
                self.checkpoints()
            except Exception:  # the store that refused the write may refuse the listing too
                return "the previous checkpoint"
        return self._latest.name if self._latest is not None else "no checkpoint"

    def _prune(self, keep: int) -> None:
        """Older checkpoints beyond ``keep`` (each manifest before its data), and data that never got a manifest."""
        complete = self.checkpoints()
        kept = {c.step for c in complete[-keep:]}
        for old in complete[:-keep]:
            self.backend.remove(old.manifest)
            self.backend.remove(old.name)
        newest = max(kept, default=-1)
        for name in self.backend.names():
            found = _DATA.match(name)
            if found and int(found.group(1)) < newest and int(found.group(1)) not in kept:
                self.backend.remove(name)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def save_atomic(location, step: int, state: dict, keep: int = 3) -> str:
    return CheckpointStore(location).save(step, state, keep=keep)


def list_checkpoints(location) -> list[Checkpoint]:
    return CheckpointStore(location).checkpoints()


def load_latest(location) -> dict | None:
    """The newest complete checkpoint that loads, or None when there is none."""
    return CheckpointStore(location).load_latest()
