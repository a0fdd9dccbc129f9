"""A rank's queue of decoded samples, each with the record it came from.

Samples are the user's own objects (``OnlineTrainer.decode`` made them); beside each the queue keeps where
it came from, ``(partition, offset, index in the record)``, which is what checkpoints, offset commits and
the accounting log reason about.  Own samples were fetched here (FIFO); forwarded ones came from another
rank and are never forwarded again.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

#: Where a sample came from: its record's partition and offset, and its place among the record's samples.
ORIGIN = np.dtype([("partition", "<i8"), ("offset", "<i8"), ("index", "<i8")])


class Samples:
    """Samples and their origins, in order."""

    __slots__ = ("items", "origin")

    def __init__(self, items: list[Any] | None = None, origin: np.ndarray | None = None):
        self.items = items if items is not None else []
        self.origin = origin if origin is not None else np.empty(0, dtype=ORIGIN)

    def __len__(self) -> int:
        return len(self.items)

    def __add__(self, other: Samples) -> Samples:
        return Samples(self.items + other.items, np.concatenate([self.origin, other.origin]))

    def split(self, n: int) -> tuple[Samples, Samples]:
        return Samples(self.items[:n], self.origin[:n]), Samples(self.items[n:], self.origin[n:])

    def select(self, mask: np.ndarray) -> tuple[Samples, Samples]:
        """(the samples where ``mask`` holds, the rest), each in order."""
        keep = np.flatnonzero(mask)
        rest = np.flatnonzero(~mask)
        return (
            Samples([self.items[i] for i in keep], self.origin[keep]),
            Samples([self.items[i] for i in rest], self.origin[rest]),
        )

    def to_bytes(self) -> bytes:
        """For a transfer to another rank (the user's samples are pickled: they came from the same code)."""
        return pickle.dumps((self.items, self.origin), protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def from_bytes(data: bytes) -> Samples:
        items, origin = pickle.loads(data)
        return Samples(items, origin)


class SampleQueue:
    """Own samples (fetched here, FIFO) and forwarded ones (never forwarded again)."""

    def __init__(self):
        self.own = Samples()
        self.forwarded = Samples()

    def __len__(self) -> int:
        return len(self.own) + len(self.forwarded)

    def add_own(self, samples: Samples) -> None:
        self.own = self.own + samples

    def add_forwarded(self, samples: Samples) -> None:
        self.forwarded = self.forwarded + samples

    def give_own(self, n: int) -> Samples:
        """The oldest ``n`` own samples, for a receiver (they are the most overdue)."""
        out, self.own = self.own.split(n)
        return out

    def take(self, n: int) -> Samples:
        """Up to ``n`` samples to train: forwarded first, then own, oldest first."""
        first, self.forwarded = self.forwarded.split(n)
        rest, self.own = self.own.split(n - len(first))
        return first + rest

    def take_through(self, newest: dict[int, int]) -> Samples:
        """Remove and return the queued samples at or below ``newest[partition]`` (the holes a checkpoint must not
        skip)."""
        out = Samples()
        for name in ("forwarded", "own"):
            held: Samples = getattr(self, name)
            limit = np.array([newest.get(int(p), -1) for p in held.origin["partition"]], dtype=np.int64)
            due, rest = held.select(held.origin["offset"] <= limit)
            out = out + due
            setattr(self, name, rest)
        return out

    def min_offsets(self) -> dict[int, int]:
        origin = np.concatenate([self.own.origin, self.forwarded.origin])
        return {int(p): int(origin["offset"][origin["partition"] == p].min()) for p in np.unique(origin["partition"])}
