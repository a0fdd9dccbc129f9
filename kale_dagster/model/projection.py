"""Project lag over the planning horizon for "keep" versus "rescale now".

This is the restart-cost test the paper leaves out: a rescale pauses
consumption for the restart time, so it is worth making only when what it
buys over the horizon exceeds what the pause costs.  Both options are played
through the FIFO backlog model the simulator uses (``model.backlog``), in
closed form: per tick the queue follows Lindley's recursion, whose running
minimum gives every tick's backlog at once, and the oldest waiting sample is
read off the cumulative arrivals, as ``FifoBacklog`` reads it off its
cohorts.  A policy projects several options per decision, thousands of
decisions per backtest, so the tick loop is not written in Python.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from kale_dagster.model.backlog import FifoBacklog


@dataclass(frozen=True)
class Projection:
    accumulated_lag_min: float  # sum of per-minute lag, in minutes
    max_lag_s: float
    violation_min: float  # minutes with lag above the SLO
    gpu_minutes: float


class Option(NamedTuple):
    """One way to go on: ``workers`` consuming ``capacity`` samples/s after ``downtime_s`` of a restart."""

    workers: int
    capacity: float
    downtime_s: float = 0.0


def project_options(
    start: FifoBacklog, rates: np.ndarray, step_s: float, options: Sequence[Option], slo_s: float, tick_s: float = 60.0
) -> list[Projection]:
    """Play ``rates`` (samples/s per ``step_s``) from ``start`` under each option, all in one pass.

    The same figures as stepping a copy of ``start`` by ``tick_s`` (``FifoBacklog.step``) and reading its time
    lag after each tick."""
    rates = np.asarray(rates, dtype=float)
    horizon = len(rates) * step_s
    gpu_minutes = [o.workers * horizon / 60.0 for o in options]
    ticks = int(np.ceil((horizon - 1e-9) / tick_s)) if horizon > 1e-9 else 0
    waiting = start.cohorts()  # (first arrival, last arrival, samples) of what waits now, oldest first
    t, step_of_tick = _tick_grid(ticks, tick_s, step_s, len(rates))
    arrivals = rates[step_of_tick] * tick_s
    fresh = arrivals > 0
    if ticks == 0 or not (waiting or fresh.any()):  # nothing waits and nothing arrives
        return [Projection(0.0, 0.0, 0.0, g) for g in gpu_minutes]
    capacity, downtime = np.array([(max(o.capacity, 0.0), o.downtime_s) for o in options]).T
    budget = np.where(t < downtime[:, None], 0.0, capacity[:, None] * tick_s)
    # Lindley: backlog_k = max(backlog_{k-1} + a_k - c_k, 0) = S_k + max(backlog_0, -min_{j<=k} S_j).
    backlog0 = float(sum(n for _, _, n in waiting))
    s = np.cumsum(arrivals - budget, axis=1)
    backlog = s + np.maximum(backlog0, -np.minimum.accumulate(s, axis=1))
    consumed = (backlog0 + np.cumsum(arrivals)) - backlog  # samples consumed since the start, oldest first
    # What arrives, oldest first, as segments of evenly spread samples: what waits now, then each tick's arrivals.
    now = start.now
    if waiting:
        first, last, count = (np.array(column, dtype=float) for column in zip(*waiting))
        seg_start = np.concatenate([first, now + t[fresh]])
        seg_end = np.concatenate([last, now + t[fresh] + tick_s])
        seg_count = np.concatenate([count, arrivals[fresh]])
    else:
        seg_start = now + t[fresh]
        seg_end, seg_count = seg_start + tick_s, arrivals[fresh]
    seg_last = np.cumsum(seg_count)
    # A segment is gone once what is left of it is negligible, as FifoBacklog drops an emptied cohort.
    gone_at = seg_last - 1e-9 * np.maximum(seg_count, 1.0)
    head = np.searchsorted(gone_at, consumed)
    waiting_now = head < (len(waiting) + np.cumsum(fresh))  # the head has arrived: not all so far is consumed
    head = np.minimum(head, len(seg_count) - 1)
    count = seg_count[head]
    into = (consumed - (seg_last[head] - count)) / count
    oldest = seg_start[head] + into * (seg_end[head] - seg_start[head])
    lag = np.where(waiting_now, np.maximum((now + tick_s) + t - oldest, 0.0), 0.0)
    acc = np.sum(lag, axis=1) / 60.0 * (tick_s / 60.0)
    violation = np.count_nonzero(lag > slo_s, axis=1) * tick_s / 60.0
    return [
        Projection(float(a), float(m), float(v), g)
        for a, m, v, g in zip(acc, np.max(lag, axis=1), violation, gpu_minutes)
    ]


@functools.lru_cache(maxsize=64)
def _tick_grid(ticks: int, tick_s: float, step_s: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Each tick's start (s from now) and the plan step it falls in: the same few grids at every decision."""
    t = np.arange(ticks) * tick_s
    step_of_tick = np.minimum((t // step_s).astype(int), steps - 1)
    t.flags.writeable = step_of_tick.flags.writeable = False
    return t, step_of_tick
