"""Worker estimator: from a forecast and the current backlog to workers per step.

The paper picks, per forecast step, the smallest w with F(w) > L(t).  It
ignores the backlog; we do not: the first steps also carry the rate needed
to drain what is already queued, plus what piles up while a restart pauses
consumption, within a drain window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kale_dagster.errors import KaleConfigError
from kale_dagster.model.throughput import ThroughputModel


def drain_rate(backlog: float, arrival_rate: float, downtime_s: float, window_s: float) -> float:
    """Extra samples/s that clear ``backlog`` plus the arrivals of a ``downtime_s`` pause within ``window_s``."""
    if window_s <= 0:
        raise KaleConfigError("drain_window_s", f"must be > 0, got {window_s}")
    return (max(backlog, 0.0) + max(arrival_rate, 0.0) * max(downtime_s, 0.0)) / window_s


def resample_max(values: np.ndarray, step_s: float, new_step_s: float) -> np.ndarray:
    """Peak of ``values`` (at ``step_s``) within each ``new_step_s`` bucket: capacity must cover the peak."""
    per = max(int(round(new_step_s / step_s)), 1)
    n = math.ceil(len(values) / per)
    padded = np.full(n * per, np.nan)
    padded[: len(values)] = values
    return np.fmax.reduce(padded.reshape(n, per), axis=1)  # nanmax, without its checks


@dataclass(frozen=True)
class WorkerEstimate:
    """Workers per plan step, and the rates that drove them."""

    plan: tuple[int, ...]
    need_rate: np.ndarray
    drain_rate: float
    drain_steps: int


def estimate_workers(
    rates: np.ndarray,
    step_s: float,
    model: ThroughputModel,
    min_workers: int,
    max_workers: int,
    backlog: float = 0.0,
    arrival_rate: float = 0.0,
    downtime_s: float = 0.0,
    drain_window_s: float = 600.0,
) -> WorkerEstimate:
    """Smallest w in [min_workers, min(max_workers, peak)] covering each step's rate.

    Steps starting before ``downtime_s + drain_window_s`` also carry the
    backlog's drain rate.
    """
    rates = np.asarray(rates, dtype=float)
    extra = drain_rate(backlog, arrival_rate, downtime_s, drain_window_s)
    drain_steps = max(1, math.ceil((downtime_s + drain_window_s) / step_s)) if extra > 0 else 0
    need = rates.copy()
    need[:drain_steps] += extra
    plan = tuple(model.min_workers_for_each(need, max_workers=max_workers, min_workers=min_workers).tolist())
    return WorkerEstimate(plan=plan, need_rate=need, drain_rate=extra, drain_steps=drain_steps)
