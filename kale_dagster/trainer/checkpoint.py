"""Atomic checkpoints: model, optimizer and the consumed offsets, never a partial one.

Written to ``ckpt-<step>.pt.tmp``, flushed and fsynced, then renamed to
``ckpt-<step>.pt`` (rename is atomic on POSIX), then the directory is
fsynced.  Loading takes the newest file that loads; a torn or corrupt one
(e.g. a disk full mid-write that still got renamed by hand) is skipped with
a warning rather than trusted.  The last ``keep`` checkpoints are kept.  A
write that fails (volume full or read-only) removes its partial file and
raises ``CheckpointWriteError``; the previous checkpoint stays the latest.
"""

from __future__ import annotations

import io
import logging
import os
import re
from pathlib import Path

import torch

_NAME = re.compile(r"^ckpt-(\d{12})\.pt$")
log = logging.getLogger(__name__)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (volume full or read-only); the previous one stays the latest."""


def checkpoint_path(directory: Path, step: int) -> Path:
    return Path(directory) / f"ckpt-{step:012d}.pt"


def save_atomic(directory, step: int, state: dict, keep: int = 3) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(directory, step)
    tmp = final.with_suffix(".pt.tmp")
    buffer = io.BytesIO()
    torch.save(state, buffer)  # serialised first: torch.save would hide the write's errno in a RuntimeError
    try:
        with open(tmp, "wb") as fh:
            fh.write(buffer.getbuffer())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except OSError as exc:  # full or read-only volume
        try:
            tmp.unlink(missing_ok=True)  # give back the space the partial file took
        except OSError:
            pass  # a read-only volume keeps it; loading never reads a .tmp file
        latest = list_checkpoints(directory)
        raise CheckpointWriteError(
            f"could not write checkpoint {final.name} to {directory}: {exc}; "
            f"{latest[-1].name if latest else 'no checkpoint'} stays the latest"
        ) from exc
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for old in list_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def list_checkpoints(directory) -> list[Path]:
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _NAME.match(p.name))


def load_latest(directory) -> dict | None:
    """The newest checkpoint that loads, or None when there is none."""
    for path in reversed(list_checkpoints(directory)):
        try:
            return torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:  # torn or corrupt: fall back to an older one
            log.warning("skipping unreadable checkpoint %s: %s", path, exc)
    return None
