"""Backtest: Kale against HPA, KEDA and static allocations on one trace, one run.

The trace is resampled to minutes and scaled so its peak rate equals the
throughput of ``peak_workers`` workers.  Each policy runs through the
simulator with identical settings; each baseline is also swept over its
main knob so a reader can check that no setting of it beats Kale at equal
or lower GPU hours.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd

from .errors import KaleConfigError
from .forecast import make_forecaster
from .policies import HPAPolicy, KaleConfig, KalePolicy, KedaKafkaPolicy, StaticPolicy
from .policies.keda import KafkaScalerMetadata
from .simulate import SimConfig, SimResult, simulate
from .throughput import ThroughputModel

POLICIES = ("kale", "hpa", "keda", "static")

#: Default worker model for backtests: ~1,000 samples/s per worker with a
#: small synchronisation cost, peaking far beyond 32 workers.
DEFAULT_MODEL = ThroughputModel.asynchronous((1e-3, 0.0, 2e-6))

HPA_TARGETS = (50, 60, 70, 80, 90)
KEDA_SECONDS_OF_WORK = (6, 30, 60, 300, 600)  # lagThreshold = seconds of one worker's throughput
STATIC_SHARES = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
KEDA_PARTITIONS = 800  # the paper's partition count


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
    hpa_target: int = 80
    model: ThroughputModel = field(default=DEFAULT_MODEL)
    scale_trace: bool = True  # False: replay recorded rates as they are (a pipeline's own history)

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
        if not 0 < self.hpa_target <= 100:
            raise KaleConfigError("hpa_target", f"must be a percentage in (0, 100], got {self.hpa_target}")


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
    """Prepared trace and settings; runs policies and sweeps."""

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

    # --- policy construction -------------------------------------------------

    def kale(self) -> KalePolicy:
        s = self.settings
        cfg = KaleConfig(min_workers=s.min_workers, max_workers=s.max_workers, slo_s=s.slo_minutes * 60, restart_s=s.restart_minutes * 60)
        return KalePolicy(s.model, cfg)

    def hpa(self, target: Optional[int] = None) -> HPAPolicy:
        s = self.settings
        return HPAPolicy(min_replicas=s.min_workers, max_replicas=s.max_workers, target_utilization=target or s.hpa_target)

    def keda(self, seconds_of_work: float = KEDA_SECONDS_OF_WORK[2]) -> KedaKafkaPolicy:
        s = self.settings
        per_worker = float(s.model.predict(1))
        meta = KafkaScalerMetadata(lag_threshold=max(int(per_worker * seconds_of_work), 1))
        return KedaKafkaPolicy(meta, min_replicas=s.min_workers, max_replicas=s.max_workers, partition_count=KEDA_PARTITIONS)

    def static(self, workers: Optional[int] = None) -> StaticPolicy:
        """The "adequate" allocation by default: enough workers for the trace's peak."""
        s = self.settings
        adequate = s.peak_workers if s.scale_trace else s.model.min_workers_for(float(self.rates.max()), s.max_workers, s.min_workers)
        return StaticPolicy(workers if workers is not None else adequate)

    # --- running ---------------------------------------------------------------

    def run(self, policy, progress: Optional[Callable[[int, int], None]] = None) -> SimResult:
        factory = None
        if isinstance(policy, KalePolicy):
            s = self.settings
            factory = lambda: make_forecaster(s.forecaster, horizon_s=s.horizon_minutes * 60)  # noqa: E731
        return simulate(self.rates, self.times, policy, self.settings.model, self.sim_config, forecaster_factory=factory, progress=progress)

    def sweeps(self, names: Sequence[str], progress: Optional[Callable[[int, int], None]] = None) -> dict[str, list[dict]]:
        plans = {
            "hpa": [(t, self.hpa(t)) for t in HPA_TARGETS],
            "keda": [(sec, self.keda(sec)) for sec in KEDA_SECONDS_OF_WORK],
            "static": [(w, self.static(w)) for w in sorted({max(1, round(share * self.settings.peak_workers)) for share in STATIC_SHARES})],
        }
        labels = {"hpa": "target_utilization_pct", "keda": "lag_threshold_seconds_of_work", "static": "workers"}
        out: dict[str, list[dict]] = {}
        for name in names:
            if name not in plans:
                continue
            out[name] = []
            for setting, policy in plans[name]:
                metrics = self.run(policy, progress).metrics.to_json()
                out[name].append({"setting": {labels[name]: setting}, **metrics})
        return out


def dominating_baselines(kale: dict, sweeps: dict[str, list[dict]]) -> list[str]:
    """Baseline settings with no more GPU hours than Kale and lower accumulated lag."""
    found = []
    for name, rows in sweeps.items():
        for row in rows:
            if row["gpu_hours"] <= kale["gpu_hours"] and row["accumulated_lag_minutes"] < kale["accumulated_lag_minutes"]:
                found.append(f"{name} {row['setting']}")
    return found
