"""Backtest: Kale against HPA, KEDA and static allocations on one trace, one run.

The trace is resampled to minutes and scaled so its peak rate equals the
throughput of ``peak_workers`` workers.  Each policy (any name in
``kale_dagster.policies.POLICIES``) runs through the simulator with
identical settings; each baseline is also swept over the settings its spec
lists, so a reader can check that no setting of it beats Kale at equal or
lower GPU hours.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from kale_dagster.errors import KaleConfigError
from kale_dagster.forecast import make_forecaster
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.model.types import ScalingPolicy
from kale_dagster.policies import POLICIES, Sizing
from kale_dagster.sim.simulate import SimConfig, SimResult, simulate

#: Default worker model for backtests: ~1,000 samples/s per worker with a
#: small synchronisation cost, peaking far beyond 32 workers.
DEFAULT_MODEL = ThroughputModel.asynchronous((1e-3, 0.0, 2e-6))


@dataclass(frozen=True)
class BacktestSettings:
    peak_workers: int = 28
    max_workers: int = 32
    min_workers: int = 1
    restart_minutes: float = 10.0
    slo_minutes: float = 20.0
    warmup_days: float = 0.0
    forecaster: str = "prophet"
    refit_minutes: float = 1440.0
    forecast_minutes: float = 10.0
    horizon_minutes: float = 120.0
    model: ThroughputModel = field(default=DEFAULT_MODEL)
    scale_trace: bool = True  # False: replay recorded rates as they are (a pipeline's own history)
    policy_options: Mapping[str, Mapping] = field(default_factory=dict)  # policy name -> options of its build

    def __post_init__(self):
        if not 1 <= self.min_workers <= self.peak_workers <= self.max_workers:
            raise KaleConfigError("peak_workers", f"need 1 <= min_workers <= peak_workers <= max_workers, got {self.min_workers}, {self.peak_workers}, {self.max_workers}")
        if self.model.peak_workers(self.max_workers) < self.peak_workers:
            raise KaleConfigError("peak_workers", f"the throughput model peaks at {self.model.peak_workers(self.max_workers)} workers, below --peak-workers {self.peak_workers}")
        if self.restart_minutes < 0:
            raise KaleConfigError("restart_minutes", f"must be >= 0, got {self.restart_minutes}")
        if self.slo_minutes <= 0:
            raise KaleConfigError("slo_minutes", f"must be > 0, got {self.slo_minutes}")
        if self.warmup_days < 0:
            raise KaleConfigError("warmup_days", f"must be >= 0, got {self.warmup_days}")
        for name in self.policy_options:
            POLICIES[name]  # an unknown name fails here, naming the choices


def minute_rates(history: pd.DataFrame) -> tuple[np.ndarray, pd.DatetimeIndex]:
    """Per-minute rates from a clean rate history: each interval's rate holds for its minutes."""
    series = history.set_index("timestamp")["rate"]
    step = (series.index[1] - series.index[0]).total_seconds() if len(series) > 1 else 60.0
    if step >= 60:
        end = pd.Series([np.nan], index=[series.index[-1] + pd.Timedelta(seconds=step)])
        minute = pd.concat([series, end]).resample("1min").ffill().iloc[:-1]
    else:
        minute = series.resample("1min").mean()
    minute = minute.interpolate(limit_area="inside").fillna(0.0)
    return minute.to_numpy(dtype=float), minute.index


def scale_to_peak(rates: np.ndarray, model: ThroughputModel, peak_workers: int) -> np.ndarray:
    peak = float(np.max(rates))
    if peak <= 0:
        raise KaleConfigError("trace", "the trace has no arrivals (its peak rate is 0)")
    return rates * (model.predict(peak_workers) / peak)


class Backtest:
    """Prepared trace and settings; runs registered policies and their sweeps."""

    def __init__(self, history: pd.DataFrame, settings: BacktestSettings = BacktestSettings()):
        self.settings = settings
        rates, self.times = minute_rates(history)
        self.rates = scale_to_peak(rates, settings.model, settings.peak_workers) if settings.scale_trace else rates
        warmup = int(settings.warmup_days * 1440)
        if warmup >= len(self.rates):
            raise KaleConfigError("warmup_days", f"warm-up of {settings.warmup_days:g} days covers the whole {len(self.rates) / 1440:.1f}-day trace")
        self.sim_config = SimConfig(
            restart_s=settings.restart_minutes * 60,
            slo_s=settings.slo_minutes * 60,
            warmup_steps=warmup,
            max_workers=settings.max_workers,
            refit_every_s=settings.refit_minutes * 60,
            forecast_every_s=settings.forecast_minutes * 60,
            forecast_horizon_s=settings.horizon_minutes * 60,
        )
        s = settings
        # The "adequate" allocation covers the trace's peak: peak_workers by construction when scaled.
        adequate = s.peak_workers if s.scale_trace else s.model.min_workers_for(float(self.rates.max()), s.max_workers, s.min_workers)
        self.sizing = Sizing(min_workers=s.min_workers, max_workers=s.max_workers, slo_s=s.slo_minutes * 60,
                             restart_s=s.restart_minutes * 60, model=s.model, adequate_workers=adequate)

    def policy(self, name: str) -> ScalingPolicy:
        """A fresh registered policy, built from this backtest's sizing and options."""
        return POLICIES.build(name, self.sizing, **self.settings.policy_options.get(name, {}))

    def run(self, policy: ScalingPolicy, progress: Optional[Callable[[int, int], None]] = None) -> SimResult:
        factory = None
        if POLICIES[policy.name].uses_forecast:
            s = self.settings
            factory = lambda: make_forecaster(s.forecaster, horizon_s=s.horizon_minutes * 60)  # noqa: E731
        return simulate(self.rates, self.times, policy, self.settings.model, self.sim_config, forecaster_factory=factory, progress=progress)

    def sweeps(self, names: Sequence[str], progress: Optional[Callable[[int, int], None]] = None) -> dict[str, list[dict]]:
        """Each named policy over the settings its spec sweeps (none for Kale)."""
        out: dict[str, list[dict]] = {}
        for name in names:
            settings = POLICIES[name].sweep(self.sizing)
            if settings:
                out[name] = [{"setting": label, **self.run(policy, progress).metrics.to_json()} for label, policy in settings]
        return out


def dominating_baselines(kale: dict, sweeps: dict[str, list[dict]]) -> list[str]:
    """Baseline settings with no more GPU hours than Kale and lower accumulated lag."""
    found = []
    for name, rows in sweeps.items():
        for row in rows:
            if row["gpu_hours"] <= kale["gpu_hours"] and row["accumulated_lag_minutes"] < kale["accumulated_lag_minutes"]:
                found.append(f"{name} {row['setting']}")
    return found
