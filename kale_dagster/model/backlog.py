"""FIFO fluid model of a topic's backlog, with exact sample ages.

Used twice with the same code: by the planner to project lag over its
horizon (the restart-cost test), and by the simulator to replay a trace.

Arrivals in one step are spread uniformly over the step and consumed oldest
first, so the age of the oldest unconsumed sample (the paper's time lag) is
exact under that assumption, not rounded to the step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass
class _Cohort:
    start: float  # arrival time of the first sample in the cohort (s)
    end: float  # arrival time of the last sample (s)
    count: float
    remaining: float

    def oldest_arrival(self) -> float:
        consumed = 1.0 - self.remaining / self.count
        return self.start + consumed * (self.end - self.start)


class FifoBacklog:
    """Samples waiting to be consumed, oldest first."""

    def __init__(self, now: float = 0.0):
        self.now = now
        self._cohorts: deque[_Cohort] = deque()
        self.backlog = 0.0
        self.consumed_total = 0.0
        self.arrived_total = 0.0

    def step(self, seconds: float, arrivals: float, capacity_per_s: float) -> float:
        """Advance by ``seconds``: ``arrivals`` samples arrive, up to ``capacity_per_s * seconds`` are consumed.

        Returns the number consumed.  Samples arriving during the step can be
        consumed within it (a worker keeps up with a stream it outpaces).
        """
        if arrivals > 0:
            self._cohorts.append(_Cohort(self.now, self.now + seconds, arrivals, arrivals))
            self.backlog += arrivals
            self.arrived_total += arrivals
        self.now += seconds
        return self.take(max(capacity_per_s, 0.0) * seconds)

    def take(self, budget: float) -> float:
        """Consume up to ``budget`` of the oldest samples now; returns the number consumed."""
        consumed = 0.0
        while budget > 0 and self._cohorts:
            head = self._cohorts[0]
            take = min(head.remaining, budget)
            head.remaining -= take
            budget -= take
            consumed += take
            if head.remaining <= 1e-9 * max(head.count, 1.0):
                self._cohorts.popleft()
        self.backlog = max(self.backlog - consumed, 0.0)
        if not self._cohorts:
            self.backlog = 0.0
        self.consumed_total += consumed
        return consumed

    def time_lag(self) -> float:
        """Seconds since the oldest unconsumed sample arrived (0 when caught up)."""
        if not self._cohorts:
            return 0.0
        return max(self.now - self._cohorts[0].oldest_arrival(), 0.0)

    def cohorts(self) -> list[tuple[float, float, float]]:
        """What waits, oldest first: (arrival of its oldest sample, of its newest, how many), each spread evenly."""
        return [(c.oldest_arrival(), c.end, c.remaining) for c in self._cohorts]

    @classmethod
    def from_observation(cls, now: float, backlog: float, time_lag_s: float) -> FifoBacklog:
        """A backlog of ``backlog`` samples whose oldest arrived ``time_lag_s`` ago, spread evenly."""
        model = cls(now)
        if backlog > 0:
            start = now - max(time_lag_s, 0.0)
            model._cohorts.append(_Cohort(start, now, backlog, backlog))
            model.backlog = backlog
        return model
