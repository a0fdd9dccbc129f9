"""The one definition of utilization every policy sees (HPA's metric), live and simulated.

GPU utilization is the share of time the workers' GPUs are busy.  Workers
that report it (the trainer's ``busy_share``; a GPU's own counter) are
taken at their word.  Without a report (a group still starting, a launcher
that cannot see its pods' GPUs), it is inferred from the stream: workers
are fully busy while a backlog waits for them, otherwise busy for the share
of their capacity the consumption takes.
"""

from __future__ import annotations


def utilization(busy_share: float | None, backlog: float, consumption_rate: float, capacity: float) -> float:
    """Busy share of the workers in [0, 1]; ``capacity`` is what they could consume (samples/s)."""
    if busy_share is not None:
        return min(max(busy_share, 0.0), 1.0)
    if capacity <= 0:
        return 0.0
    if backlog > 0:
        return 1.0
    return min(max(consumption_rate, 0.0) / capacity, 1.0)
