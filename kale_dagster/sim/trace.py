"""Synthetic arrival traces shaped like the paper's production traffic.

Kale's 7-day trace swings about 7.65x between the night trough (around
04:00) and the evening peak (around 20:00), with busier weekends, noise and
occasional bursts.  :func:`synth_trace` reproduces those features from a
seed, so tests, demos and benchmarks share one reproducible workload.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kale_dagster.errors import KaleConfigError
from kale_dagster.forecast.history import MAX_GRID_POINTS

PEAK_TO_TROUGH = 7.65
START = "2026-01-05 00:00:00"  # a Monday at midnight: where a synthetic trace starts by default


def diurnal_shape(hour_of_day: np.ndarray) -> np.ndarray:
    """0 at 04:00, 1 at 20:00: a slow 16-hour rise and an 8-hour evening fall."""
    h = (np.asarray(hour_of_day, dtype=float) - 4.0) % 24.0
    rise = 0.5 - 0.5 * np.cos(np.pi * np.minimum(h, 16.0) / 16.0)
    fall = 0.5 + 0.5 * np.cos(np.pi * (h - 16.0) / 8.0)
    return np.where(h <= 16.0, rise, fall)


def synth_trace(
    days: float = 7.0,
    seed: int = 0,
    step_s: float = 60.0,
    peak_rate: float = 10_000.0,
    weekend_boost: float = 0.15,
    noise: float = 0.05,
    bursts_per_day: float = 1.0,
    start: str = START,
) -> pd.DataFrame:
    """A ``timestamp,value`` frame: ``value`` is arrivals per ``step_s`` interval."""
    if days <= 0:
        raise KaleConfigError("days", f"must be > 0, got {days}")
    if step_s <= 0:
        raise KaleConfigError("step_s", f"must be > 0, got {step_s}")
    if peak_rate <= 0:
        raise KaleConfigError("peak_rate", f"must be > 0, got {peak_rate}")
    n = int(round(days * 86_400 / step_s))
    if n > MAX_GRID_POINTS:  # the bound every history is read under: a trace that no backtest could load
        raise KaleConfigError(
            "days", f"{days:g} days at {step_s:g} s is {n:,} steps, over the {MAX_GRID_POINTS:,} a trace may have"
        )
    rng = np.random.default_rng(seed)
    ts = pd.Timestamp(start, tz="UTC") + pd.to_timedelta(np.arange(n) * step_s, unit="s")
    hours = (ts.hour + ts.minute / 60.0 + ts.second / 3600.0).to_numpy()
    trough = 1.0 / PEAK_TO_TROUGH
    level = trough + (1.0 - trough) * diurnal_shape(hours)
    level = level * np.where(ts.dayofweek.to_numpy() >= 5, 1.0 + weekend_boost, 1.0)
    # AR(1) multiplicative noise: traffic wanders, it does not jitter independently.
    eps = np.empty(n)
    eps[0] = 0.0
    phi = 0.98 ** (step_s / 60.0)
    shocks = rng.normal(0.0, noise * np.sqrt(1 - phi**2), n)
    for i in range(1, n):
        eps[i] = phi * eps[i - 1] + shocks[i]
    level = level * np.exp(eps)
    for _ in range(rng.poisson(bursts_per_day * days)):
        at = rng.integers(0, n)
        length = int(rng.uniform(20, 60) * 60 / step_s) + 1
        level[at : at + length] *= 1.0 + rng.uniform(0.3, 0.8)
    rate = peak_rate * level / (1.0 + weekend_boost)
    return pd.DataFrame({"timestamp": ts.tz_localize(None), "value": np.round(rate * step_s).astype(np.int64)})
