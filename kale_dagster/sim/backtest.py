"""Backtest: Kale against HPA, KEDA and static allocations on one trace, one run.

The trace is resampled to minutes and scaled so its peak rate equals the
throughput of ``peak_workers`` workers.  Each policy (any name in
``kale_dagster.policies.POLICIES``) runs through the simulator under the
pipeline's ``Controller`` with identical settings; the warm-up is the
forecaster's history and what Kale measures, so a policy that does neither
starts ``lead_in_days`` before the scored span.  Kale plans with what it
estimates (F(w) fitted on a noisy profile and on saturated minutes, the
restart time from the restarts it saw); ``oracle=True`` hands it the truth
to show what estimation costs.  Each baseline is also swept over the
settings a user would tune (its spec's grid); the Pareto frontier of (GPU
hours, accumulated lag) per baseline, and the best setting with at least
Kale's GPU hours, are what Kale is compared with (``sim.comparison``).
Independent runs go to parallel processes.
"""

from __future__ import annotations

import copy
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
import pandas as pd

from kale_dagster.control.controller import Controller, ControlSettings
from kale_dagster.errors import KaleConfigError
from kale_dagster.forecast import FORECASTERS, make_forecaster
from kale_dagster.model.limits import Limits
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.policies import POLICIES, Sizing
from kale_dagster.policies.kale import KaleConfig
from kale_dagster.rules import check, need, setting
from kale_dagster.sim.oracle import Hindsight, OracleSchedule, SchedulePolicy, optimal_schedule
from kale_dagster.sim.simulate import ForecastFeed, SimConfig, SimResult, simulate

#: Default worker model for backtests: ~1,000 samples/s per worker with a
#: small synchronisation cost, peaking far beyond 32 workers.
DEFAULT_MODEL = ThroughputModel.asynchronous((1e-3, 0.0, 2e-6))
#: The offline optimum's label cap (``model.schedule``): its cost is an upper bound on the true optimum's.
OPTIMUM_LABELS = 24


@dataclass(frozen=True)
class BacktestSettings:
    """One backtest: the pipeline's ``limits``, the trace's scaling and the simulated world's noise."""

    limits: Limits = field(default_factory=Limits)
    peak_workers: int = setting(28, ge=1, description="the trace is scaled so its peak needs this many workers")
    warmup_days: float = setting(0.0, ge=0, unit="days", description="the forecaster's history, not scored")
    lead_in_days: float = setting(
        1.0, ge=0, unit="days", description="a policy that neither forecasts nor learns starts this long before scoring"
    )
    forecaster: str = setting("prophet", choices=lambda: FORECASTERS)
    refit_minutes: float = setting(1440.0, gt=0, unit="min")
    forecast_minutes: float = setting(10.0, gt=0, unit="min")
    horizon_minutes: float = setting(120.0, gt=0, unit="min")
    model: ThroughputModel = field(default=DEFAULT_MODEL)
    scale_trace: bool = True  # False: replay recorded rates as they are (a pipeline's own history)
    policy_options: Mapping[str, Mapping] = field(default_factory=dict)  # policy name -> options of its build
    throughput_noise: float = setting(0.05, ge=0, description="relative noise of each throughput measurement")
    restart_jitter: float = setting(0.2, ge=0, description="lognormal sigma of each restart around the declared one")
    retargets: bool = True  # the pipeline's launcher can redirect a restart under way (``Launcher.retargets``)
    seed: int = 0
    processes: int | None = setting(None, ge=1, description="parallel simulations; None: the machine's cores")

    def __post_init__(self):
        limits = self.limits
        check(
            self,
            lambda: (
                need(
                    limits.min_workers <= self.peak_workers <= limits.max_workers,
                    "peak_workers",
                    f"must lie within min_workers and max_workers ({limits.min_workers}-{limits.max_workers}), "
                    f"got {self.peak_workers}",
                )
                or need(
                    self.model.peak_workers(limits.max_workers) >= self.peak_workers,
                    "peak_workers",
                    f"the throughput model peaks at {self.model.peak_workers(limits.max_workers)} workers, below "
                    f"{self.peak_workers}",
                )
            ),
            [
                KaleConfigError("policy_options", f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
                for name in self.policy_options
                if name not in POLICIES
            ],
        )


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


class Foresight(NamedTuple):
    """Which forecasts a run reads: the forecaster's, or the trace's true future (with its bursts cut off above
    ``burst_cap`` times the hour's median)."""

    perfect: bool = False
    burst_cap: float | None = None

    @classmethod
    def of(cls, perfect: bool, burst_cap: float | None) -> Foresight:
        """A cap only cuts the true future: without ``perfect`` it is dropped, so equal forecasts share one key."""
        return cls(perfect, burst_cap if perfect else None)


class Backtest:
    """Prepared trace and settings; runs registered policies and their sweeps."""

    def __init__(self, history: pd.DataFrame, settings: BacktestSettings = BacktestSettings()):
        self.settings = settings
        rates, self.times = minute_rates(history)
        self.rates = scale_to_peak(rates, settings.model, settings.peak_workers) if settings.scale_trace else rates
        warmup = int(settings.warmup_days * 1440)
        if warmup >= len(self.rates):
            raise KaleConfigError(
                "warmup_days",
                f"warm-up of {settings.warmup_days:g} days covers the whole {len(self.rates) / 1440:.1f}-day trace",
            )
        s = settings
        # The "adequate" allocation covers the trace's peak: peak_workers by construction when scaled.
        limits = s.limits
        adequate = limits.whole_pods(
            s.peak_workers
            if s.scale_trace
            else s.model.min_workers_for(float(self.rates.max()), limits.max_workers, limits.min_workers)
        )
        self.sizing = Sizing(limits, s.model, adequate_workers=adequate)
        # Before going live, F(w) is profiled at a few counts up to the peak (the paper's section 3.3), in whole pods.
        peak = s.peak_workers
        profile = tuple(sorted({limits.whole_pods(max(1, -(-peak // k))) for k in (peak, 4, 2, 1)}))
        self.sim_config = SimConfig(
            limits=limits,
            warmup_steps=warmup,
            refit_every_s=s.refit_minutes * 60,
            forecast_every_s=s.forecast_minutes * 60,
            forecast_horizon_s=s.horizon_minutes * 60,
            throughput_noise=s.throughput_noise,
            restart_jitter=s.restart_jitter,
            retargets=s.retargets,
            profile_workers=profile,
            seed=s.seed,
        )
        # What depends on the trace alone, so every seed of it (``with_seed``) shares it: the recorded forecasts
        # (their kind -> feed) and the offline optimum's schedule (label cap -> schedule).
        self._feeds: dict[Foresight, ForecastFeed] = {}
        self._schedules: dict[int, OracleSchedule] = {}

    def with_seed(self, seed: int) -> Backtest:
        """The same trace in another draw of the simulated world's noise (restart times, throughput measurements).
        The forecasts and the optimum's schedule depend on the trace alone: recorded once, shared by every seed."""
        other = copy.copy(self)
        other.settings = replace(self.settings, seed=seed)
        other.sim_config = replace(self.sim_config, seed=seed)
        return other

    def control_settings(self, name: str, options: Mapping | None = None) -> ControlSettings:
        """The controller's settings for policy ``name`` with ``options`` (default: the settings' for it)."""
        s, z = self.settings, self.sizing
        options = s.policy_options.get(name, {}) if options is None else options
        return ControlSettings(
            policy=name,
            limits=z.limits,
            policy_options=dict(options),
            adequate_workers=z.adequate_workers,
            partitions=z.partitions,
        )

    def controller(self, name: str, options: Mapping | None = None) -> Controller:
        """The pipeline's controller for a registered policy."""
        return Controller(self.control_settings(name, options))

    def _feed(self, kind: Foresight) -> ForecastFeed:
        s = self.settings
        factory = (
            (lambda: Hindsight(self.times, self.rates, kind.burst_cap))
            if kind.perfect
            else (lambda: make_forecaster(s.forecaster, horizon_s=s.horizon_minutes * 60))
        )
        return ForecastFeed(factory, self.times, self.rates, self.sim_config)

    def forecasts(self, perfect: bool = False, burst_cap: float | None = None) -> ForecastFeed:
        """The forecasts a forecasting policy reads over this trace (``perfect``: the trace's true future, with
        ``burst_cap`` its bursts cut off; see ``Hindsight``), recorded once: they depend on the trace alone, so every
        run replays the same."""
        kind = Foresight.of(perfect, burst_cap)
        if kind not in self._feeds:
            self._feeds[kind] = self._feed(kind).record()
        return self._feeds[kind]

    def run(
        self,
        name: str,
        options: Mapping | None = None,
        oracle: bool = False,
        perfect_forecast: bool = False,
        burst_cap: float | None = None,
    ) -> SimResult:
        """One registered policy over the trace.  ``oracle`` plans with the true F(w) and restart time;
        ``perfect_forecast`` forecasts with the trace's true future, with ``burst_cap`` its bursts cut off."""
        spec = POLICIES[name]
        forecasts = self.forecasts(perfect_forecast, burst_cap) if spec.uses_forecast else None
        config = replace(self.sim_config, oracle=oracle) if oracle else self.sim_config
        # The warm-up is a forecaster's history and what a learning policy measures.  A policy that does neither
        # remembers only its queue and minutes of replica history: a lead-in before the scored span makes those.
        warmup = config.warmup_steps
        start = (
            0
            if spec.uses_forecast or spec.uses_estimates
            else max(warmup - round(self.settings.lead_in_days * 1440), 0)
        )
        return simulate(
            self.rates[start:],
            self.times[start:],
            self.controller(name, options),
            self.settings.model,
            replace(config, warmup_steps=warmup - start),
            forecasts=forecasts,
        )

    def run_many(
        self, runs: Sequence[Run], done: Callable[[int, int], None] | None = None, optimum: bool = False
    ) -> tuple[list[SimResult], tuple[OracleSchedule, SimResult] | None]:
        """Runs, and with ``optimum`` the offline optimum, in parallel processes; ``done(k, n)`` as they finish."""
        total = len(runs) + optimum
        finished = 0

        def finish(result):
            nonlocal finished
            finished += 1
            if done:
                done(finished, total)
            return result

        workers = min(self.settings.processes or os.cpu_count() or 1, total)
        if workers <= 1:
            results = [finish(self.run(*run)) for run in runs]
            return results, finish(self.optimum()) if optimum else None
        needs = [
            run.foresight if POLICIES[run.name].uses_forecast and run.foresight not in self._feeds else None
            for run in runs
        ]
        # Longest first, so that no long run is left for the end while the other processes idle: the forecasts
        # (one refit period per task), each forecasting run as soon as its forecasts are in, the optimum, the rest.
        # The pool is handed no more than it can start, so a forecasting run that becomes ready waits for no queue.
        ready = deque(i for i, kind in enumerate(needs) if kind is None and POLICIES[runs[i].name].uses_forecast)
        ready += [-1] if optimum else []
        ready += [i for i, kind in enumerate(needs) if kind is None and not POLICIES[runs[i].name].uses_forecast]
        # fork: the children share the prepared trace instead of pickling it per run.
        with ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("fork"), initializer=_adopt, initargs=(self,)
        ) as pool:
            futures = self._submit_as_ready(pool, workers, runs, needs, ready)
            results = [finish(futures[i].result()) for i in range(len(runs))]
            if not optimum:
                return results, None
            best = finish(futures[-1].result())
            self._schedules.setdefault(OPTIMUM_LABELS, best[0])  # solved in a child: kept for this trace's other seeds
            return results, best

    def _submit_as_ready(
        self, pool: ProcessPoolExecutor, workers: int, runs: Sequence[Run], needs: list, ready: deque
    ) -> dict[int, Future]:
        """Record the forecasts the runs ``need`` (one refit period per task), then submit each run as it becomes
        ``ready`` (its forecasts in; -1 is the optimum), no more at once than ``workers``; every run's future."""
        futures: dict[int, Future] = {}
        recording = {
            kind: (
                self._feed(kind),
                [pool.submit(_record_adopted, kind, *period) for period in self._feed(kind).periods()],
            )
            for kind in {k for k in needs if k is not None}
        }
        in_flight = {part for _, parts in recording.values() for part in parts}
        while ready or in_flight:
            while ready and len(in_flight) < workers:
                i = ready.popleft()
                futures[i] = (
                    pool.submit(_optimum_adopted)
                    if i < 0
                    else pool.submit(_run_adopted, runs[i], self._recorded(needs[i]))
                )
                in_flight.add(futures[i])
            in_flight = wait(in_flight, return_when=FIRST_COMPLETED).not_done
            for kind, (feed, parts) in list(recording.items()):
                if all(part.done() for part in parts):
                    self._feeds[kind] = feed.replay([part.result() for part in parts])
                    del recording[kind]
                    ready.extendleft(reversed([i for i, k in enumerate(needs) if k == kind]))
        return futures

    def _recorded(self, kind: Foresight | None) -> ForecastFeed | None:
        """The forecasts recorded since the pool forked, for a run that needed them (None: it did not)."""
        return self._feeds.get(kind) if kind is not None else None

    def optimum(self, max_labels: int = OPTIMUM_LABELS) -> tuple[OracleSchedule, SimResult]:
        """The offline optimum of Kale's own cost (``sim.oracle``), replayed in the simulator."""
        s, z, kale = self.settings, self.sizing, KaleConfig()
        if max_labels not in self._schedules:
            self._schedules[max_labels] = optimal_schedule(
                self.rates,
                s.model,
                z.limits,
                kale.plan_step_s,
                kale.lag_weight,
                kale.violation_weight,
                max_labels,
            )
        schedule = self._schedules[max_labels]
        policy = SchedulePolicy(schedule.workers, self.times[0].timestamp())
        replay = Controller.fixed(policy, self.control_settings(policy.name))
        return schedule, simulate(self.rates, self.times, replay, s.model, self.sim_config)


class Run(NamedTuple):
    """One simulation of a comparison."""

    name: str
    options: Mapping | None = None
    oracle: bool = False
    perfect_forecast: bool = False
    burst_cap: float | None = None  # with perfect_forecast: its bursts cut off above this multiple of the hour's median

    @property
    def foresight(self) -> Foresight:
        return Foresight.of(self.perfect_forecast, self.burst_cap)


_ADOPTED: Backtest | None = None


def _adopt(backtest: Backtest) -> None:
    global _ADOPTED
    _ADOPTED = backtest


def _run_adopted(run: Run, forecasts: ForecastFeed | None = None) -> SimResult:
    assert _ADOPTED is not None  # set by the pool's initializer
    if forecasts is not None:  # recorded in another process after this one was forked
        _ADOPTED._feeds.setdefault(run.foresight, forecasts)
    return _ADOPTED.run(*run)


def _record_adopted(kind: Foresight, start: int, stop: int) -> tuple[list, np.ndarray]:
    assert _ADOPTED is not None
    return _ADOPTED._feed(kind).record_period(start, stop)


def _optimum_adopted() -> tuple[OracleSchedule, SimResult]:
    assert _ADOPTED is not None
    return _ADOPTED.optimum()
