"""Project lag over the planning horizon for "keep" versus "rescale now".

This is the restart-cost test the paper leaves out: a rescale pauses
consumption for the restart time, so it is worth making only when what it
buys over the horizon exceeds what the pause costs.  Both options are played
through the same FIFO backlog model the simulator uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kale_dagster.model.backlog import FifoBacklog


@dataclass(frozen=True)
class Projection:
    accumulated_lag_min: float  # sum of per-minute lag, in minutes
    max_lag_s: float
    violation_min: float  # minutes with lag above the SLO
    gpu_minutes: float


def project(
    start: FifoBacklog,
    rates: np.ndarray,
    step_s: float,
    capacity: float,
    workers: int,
    slo_s: float,
    downtime_s: float = 0.0,
    tick_s: float = 60.0,
) -> Projection:
    """Play ``rates`` (samples/s per ``step_s``) against ``capacity`` after ``downtime_s`` of zero consumption."""
    queue = start.copy()
    horizon = len(rates) * step_s
    acc = max_lag = violation = 0.0
    t = 0.0
    while t < horizon - 1e-9:
        rate = rates[min(int(t // step_s), len(rates) - 1)]
        cap = 0.0 if t < downtime_s else capacity
        queue.step(tick_s, rate * tick_s, cap)
        lag = queue.time_lag()
        acc += lag / 60.0 * (tick_s / 60.0)
        max_lag = max(max_lag, lag)
        if lag > slo_s:
            violation += tick_s / 60.0
        t += tick_s
    return Projection(acc, max_lag, violation, workers * horizon / 60.0)
