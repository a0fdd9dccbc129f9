"""The paper's metrics, from a simulated timeline or from readings of a live run.

Definitions (Kale, SoCC'24): accumulated lag is the integral of lag over
time in minutes (the sum of per-minute lag); the SLO violation rate is the
share of time with lag above the SLO; downtime is the time spent
restarting; GPU hours integrate the allocated workers over time.

Readings may be irregular (a live run's ticks drift under load): each one
holds until the next, so every figure is time-weighted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import ArrayLike

from kale_dagster.model.schedule import Objective


@dataclass(frozen=True)
class PaperMetrics:
    """The paper's metrics over the scored period."""

    accumulated_lag_minutes: float  # integral of lag over time, in minutes
    slo_violation_rate: float  # share of time with lag above the SLO
    downtime_minutes: float  # time spent restarting
    gpu_hours: float  # allocated workers integrated over time
    rescales: int
    max_lag_minutes: float

    def to_json(self) -> dict:
        return asdict(self)


def score_readings(
    minutes: ArrayLike,
    lag_s: ArrayLike,
    workers: ArrayLike,
    end_minute: float,
    slo_s: float,
    downtime_minutes: float,
    rescales: int,
) -> PaperMetrics:
    """Metrics from readings at ``minutes`` (each holds until the next; the last until ``end_minute``)."""
    t = np.asarray(minutes, dtype=float)
    lag = np.asarray(lag_s, dtype=float)
    dt = np.diff(np.append(t, end_minute))
    total = float(dt.sum())
    return PaperMetrics(
        accumulated_lag_minutes=float(np.sum(lag / 60.0 * dt)),
        slo_violation_rate=float(dt[lag > slo_s].sum() / total) if total > 0 else 0.0,
        downtime_minutes=float(downtime_minutes),
        gpu_hours=float(np.sum(np.asarray(workers, dtype=float) * dt) / 60.0),
        rescales=int(rescales),
        max_lag_minutes=float(lag.max() / 60.0) if len(lag) else 0.0,
    )


def cost_parts(
    metrics: dict,
    minutes: float,
    lag_weight: float = Objective.lag_weight,
    violation_weight: float = Objective.violation_weight,
) -> dict:
    """Kale's own cost over ``minutes`` scored minutes, by part, in GPU-minutes: the GPU-minutes, ``lag_weight``
    x lag-minutes, ``violation_weight`` x minutes above the SLO (the defaults are Kale's)."""
    return {
        "gpu": metrics["gpu_hours"] * 60.0,
        "lag": lag_weight * metrics["accumulated_lag_minutes"],
        "slo": violation_weight * metrics["slo_violation_rate"] * minutes,
    }


def objective(metrics: dict, minutes: float) -> float:
    """Kale's own cost, at its weights: the sum of ``cost_parts``."""
    return sum(cost_parts(metrics, minutes).values())


def excess_cost(kale: dict, perfect: dict, optimum: dict, minutes: float) -> dict:
    """Where Kale's cost over the optimum's goes, by part (GPU, lag, SLO), each split into forecast error (Kale
    against Kale with a perfect forecast) and planning error (Kale with a perfect forecast against the optimum),
    in GPU-minutes; with the rescales of each."""
    k, p, o = (cost_parts(m, minutes) for m in (kale, perfect, optimum))
    return {
        "forecast": {part: k[part] - p[part] for part in k},
        "planning": {part: p[part] - o[part] for part in k},
        "rescales": {"kale": kale["rescales"], "perfect_forecast": perfect["rescales"], "optimum": optimum["rescales"]},
    }
