"""CTR-style training samples: a compact wire format and a hidden ground truth.

Each sample is 29 bytes: user id (u32), item id (u32), 8 dense features
(float16), a click label (u8) and the producer's sequence number (u32, for
end-to-end accounting in tests and benchmarks).  Labels are drawn from a
fixed hidden model (user and item factors plus a dense weight vector), so
a trainer that learns it shows a rising AUC: the number means something.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RECORD = np.dtype([("user", "<u4"), ("item", "<u4"), ("dense", "<f2", (8,)), ("label", "u1"), ("seq", "<u4")])
RECORD_SIZE = RECORD.itemsize
N_USERS = 50_000
N_ITEMS = 5_000
N_DENSE = 8
FACTORS = 8


@dataclass(frozen=True)
class GroundTruth:
    """The hidden click model; the same seed gives the same world everywhere."""

    seed: int = 7

    def _params(self):
        rng = np.random.default_rng(self.seed)
        users = rng.normal(0, 0.6, (N_USERS, FACTORS)).astype(np.float32)
        items = rng.normal(0, 0.6, (N_ITEMS, FACTORS)).astype(np.float32)
        weights = rng.normal(0, 0.8, N_DENSE).astype(np.float32)
        return users, items, weights

    def sample(self, n: int, rng: np.random.Generator, start_seq: int = 0) -> np.ndarray:
        users, items, weights = _cached(self)
        out = np.empty(n, dtype=RECORD)
        # Zipf-like popularity: a few users and items are much more frequent.
        out["user"] = np.minimum(rng.zipf(1.3, n) - 1, N_USERS - 1)
        out["item"] = np.minimum(rng.zipf(1.2, n) - 1, N_ITEMS - 1)
        dense = rng.normal(0, 1, (n, N_DENSE)).astype(np.float32)
        out["dense"] = dense
        logit = np.sum(users[out["user"]] * items[out["item"]], axis=1) + dense @ weights - 1.0
        out["label"] = rng.random(n) < 1 / (1 + np.exp(-logit))
        out["seq"] = (start_seq + np.arange(n)) % (2**32)
        return out


_CACHE: dict = {}


def _cached(truth: GroundTruth):
    if truth.seed not in _CACHE:
        _CACHE[truth.seed] = truth._params()
    return _CACHE[truth.seed]


def encode(records: np.ndarray, samples_per_record: int = 1) -> list[bytes]:
    """Kafka record values: ``samples_per_record`` samples each (the last one may carry fewer)."""
    raw = records.astype(RECORD, copy=False).tobytes()
    size = RECORD_SIZE * samples_per_record
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def decode(values: list[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
    """Samples from record values, and how many samples each value carried.

    A value that is not whole samples with a 0/1 label and finite features
    (a poison record: another producer, a truncated write, a tombstone's
    None) carries 0: it is skipped, and the caller counts it, rather than
    stopping training on it.
    """
    if not values:
        return np.empty(0, dtype=RECORD), np.empty(0, dtype=np.int64)
    blobs = [v or b"" for v in values]  # a tombstone's None carries no sample
    lengths = np.fromiter((len(v) for v in blobs), dtype=np.int64, count=len(blobs))
    whole = (lengths % RECORD_SIZE == 0) & (lengths > 0)
    counts = np.where(whole, lengths // RECORD_SIZE, 0)
    samples = np.frombuffer(b"".join(v for v, ok in zip(blobs, whole) if ok), dtype=RECORD)
    valid = (samples["label"] <= 1) & np.isfinite(samples["dense"]).all(axis=1)
    if not valid.all():  # a value with any invalid sample is skipped whole
        owner = np.repeat(np.flatnonzero(whole), counts[whole])
        bad_values = np.unique(owner[~valid])
        counts[bad_values] = 0
        samples = samples[~np.isin(owner, bad_values)]
    return samples, counts


def partition_weights(partitions: int, hot_share: float = 0.0) -> np.ndarray:
    """Traffic share per partition: partition 0 carries ``hot_share``, the rest split the remainder."""
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    if not 0 <= hot_share < 1:
        raise ValueError(f"hot share must be in [0, 1), got {hot_share}")
    if partitions == 1:
        return np.ones(1)
    if hot_share == 0:
        return np.full(partitions, 1 / partitions)
    return np.concatenate([[hot_share], np.full(partitions - 1, (1 - hot_share) / (partitions - 1))])
