"""Data balancing (the paper's data shuffling), as pure functions.

Partitions carry uneven traffic.  Two mechanisms keep every worker busy:

1. assignment: partitions go to workers by measured rate, largest first
   onto the least-loaded worker (LPT), not round robin;
2. forwarding: a worker whose own queue is above the high watermark sends
   the overflow to randomly chosen workers that are accepting; a receiver
   stops accepting at the high watermark and accepts again only below the
   low one (hysteresis); forwarded samples are never forwarded again (no
   cascades).

The plan is computed identically on every worker from the same gathered
queue lengths and a shared seed, so no coordinator is needed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


def round_robin(partitions: Sequence[int], workers: int) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(workers)]
    for i, p in enumerate(sorted(partitions)):
        out[i % workers].append(p)
    return out


def assign_by_rate(rates: Mapping[int, float], workers: int) -> list[list[int]]:
    """LPT assignment: heaviest partition first onto the least-loaded worker (ties by index)."""
    out: list[list[int]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for p in sorted(rates, key=lambda k: (-rates[k], k)):
        w = min(range(workers), key=lambda i: (load[i], len(out[i]), i))
        out[w].append(p)
        load[w] += max(rates[p], 0.0)
    return out


@dataclass
class AcceptState:
    """A receiver's hysteresis between the low and high watermarks."""

    high: int
    low: int
    accepting: bool = True

    def __post_init__(self):
        if not 0 <= self.low <= self.high:
            raise ValueError(f"need 0 <= low ({self.low}) <= high ({self.high})")

    def update(self, queue_len: int) -> bool:
        if queue_len >= self.high:
            self.accepting = False
        elif queue_len < self.low:
            self.accepting = True
        return self.accepting


def forwarding_plan(
    own: Sequence[int], total: Sequence[int], accepting: Sequence[bool], high: int, seed: int
) -> list[tuple[int, int, int]]:
    """(sender, receiver, count) transfers for one step.

    ``own`` are the lengths of each worker's own (never forwarded) queue,
    ``total`` its whole queue.  Senders give away own samples above ``high``;
    receivers take at most ``high - total`` each.
    """
    rng = np.random.default_rng(seed)
    room = [max(high - t, 0) if a else 0 for t, a in zip(total, accepting)]
    plan = []
    for sender in rng.permutation(len(own)):
        overflow = own[sender] - high
        while overflow > 0:
            candidates = [r for r in range(len(own)) if r != sender and room[r] > 0]
            if not candidates:
                break
            receiver = int(rng.choice(candidates))
            n = min(overflow, room[receiver])
            plan.append((int(sender), receiver, int(n)))
            room[receiver] -= n
            overflow -= n
    return plan
