"""Trace-driven simulator: replay arrivals through any scaling policy.

The policies are the same objects the Dagster assets drive; only the world
around them is simulated:

* arrivals follow the trace (a rate per minute, spread evenly in the minute);
* the allocated workers consume at the throughput model's F(w), FIFO, so a
  sample's lag is its age when consumed (``kale_dagster.model.backlog``);
* a rescale pauses consumption for ``restart_s`` (pause-and-restart, the
  paper's 10 minutes for a 1B-parameter model); one that retargets a
  restart under way (``retargets``) starts that restart over;
* the pipeline's ``Controller`` (the one the Dagster sensor runs) decides
  every ``sync_period_s`` of the policy's own (HPA 15 s, KEDA 15 s, Kale 60
  s) from what telemetry and the launcher would report (utilization is the
  workers' busy share, what GPU utilization reads: since the last sync, or
  over the latest ``metrics_window_s`` when the workers report in windows);
* the controller learns, as a real one: F(w) from noisy measurements of
  saturated minutes (and an optional profiling run), the restart time from
  the restarts it saw, each of which takes ``restart_s`` times a lognormal
  factor (``SimConfig.throughput_noise``, ``restart_jitter``; ``oracle``
  hands it the truth instead, to measure what estimation costs);
* Kale's forecaster is refitted every ``refit_every_s`` and re-predicted
  from the latest observations every ``forecast_every_s`` (the paper's
  10 minutes);
* with ``commit_interval_s``, offsets are committed only that often (and at
  each rescale's graceful stop), as a trainer that commits at checkpoints
  does: telemetry, and so the policies and the metrics, see the age of the
  oldest *uncommitted* sample, which lags the consumed one by up to the
  interval;
* with ``act_latency_s``, a decided rescale starts that long after the
  decision (live, Dagster's tick and the launch of the rescale run), the
  old group working meanwhile and no other decision acted on;
* with ``metrics_window_s``, the workers report their busy share over
  windows of that length, as the trainer does, and a reading is the latest
  window's; a restarted group reports no metrics until it has worked one
  full window (HPA likewise ignores a pod's metric until a window after it
  became ready): until then the policies are told it is still restarting;
* ``pipeline_latency_s`` (plus ``pipeline_latency_per_worker_s`` per
  worker: a synchronous step's collectives grow with the group) is the time
  a sample spends inside the trainer (fetched, queued, in a step) before it
  can be committed; it adds to the lag telemetry reads while samples flow
  (the fluid queue consumes at once).

Metrics follow the paper (``kale_dagster.sim.metrics``); the lag of a minute is
the age of the oldest unconsumed (uncommitted, with ``commit_interval_s``)
sample at its end, which is the lag the next consumed sample has under FIFO,
plus ``pipeline_latency_s``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from kale_dagster.control.controller import (
    ControlInput,
    Controller,
    ControlSettings,
    StreamReading,
)
from kale_dagster.errors import KaleConfigError
from kale_dagster.forecast.base import Forecast
from kale_dagster.launchers.base import GroupLauncher, LauncherStatus
from kale_dagster.model.backlog import FifoBacklog
from kale_dagster.model.throughput import FIT_WINDOW_S, ThroughputModel, estimate_throughput
from kale_dagster.model.types import ScalingPolicy
from kale_dagster.model.utilization import utilization
from kale_dagster.sim.config import MINUTE, TICK_S, SimConfig
from kale_dagster.sim.forecast_feed import ForecastFeed
from kale_dagster.sim.metrics import PaperMetrics, score_readings


@dataclass
class SimResult:
    metrics: PaperMetrics
    timeline: pd.DataFrame  # per minute: time, arrival_rate, workers, capacity, lag_s, restarting, scored
    decisions: list  # (time, workers, policy, reason) for every change


class _Measurements:
    """What the running system tells the controller, and what the controller makes of it.

    The world: each restart takes ``restart_s`` times a lognormal factor;
    each minute the workers never waited for data yields a throughput
    measurement with relative noise (profiling runs before the start yield
    more).  The controller: F(w) refitted on those measurements (profile
    plus the last week) at the forecaster's refit cadence, from ``prior``
    until they cover enough worker counts, and the restart time as the
    median of the last restarts it saw (the declared ``restart_s`` before
    the first), exactly as the Dagster path estimates both.  With
    ``oracle`` the controller is handed the true model and the nominal time.
    """

    def __init__(self, truth: ThroughputModel, prior: ThroughputModel, config: SimConfig):
        self.truth, self.prior, self.config = truth, prior, config
        self._restart_rng = np.random.default_rng([config.seed, 1])
        self._noise_rng = np.random.default_rng([config.seed, 2])
        self.restarts: list[float] = []
        self._downtimes: tuple[float, ...] = ()
        self.profile = [(float(w), self._noisy(float(truth.predict(w)))) for w in config.profile_workers]
        self.online: list[tuple[int, float, float]] = []  # (minute, workers, samples/s)
        self._model, self._next_fit = prior, 0
        self._refit_minutes = max(int(config.refit_every_s // MINUTE), 1)

    def _noisy(self, rate: float) -> float:
        return max(float(rate) * (1.0 + self.config.throughput_noise * self._noise_rng.standard_normal()), 1e-9)

    def restart(self, retarget: bool = False) -> float:
        """How long this restart takes (the world's draw), remembered as the controller measures it.  A retarget's
        replaces the abandoned restart's: the launcher measures a retargeted restart from the retarget on."""
        jitter = self._restart_rng.lognormal(0.0, self.config.restart_jitter) if self.config.restart_jitter > 0 else 1.0
        if retarget:
            self.restarts.pop()
        self.restarts.append(self.config.limits.restart_s * jitter)
        if not self.config.oracle:
            self._downtimes = tuple(self.restarts[-GroupLauncher.recent_restarts :])
        return self.restarts[-1]

    def downtimes(self) -> tuple[float, ...]:
        """What the launcher reports: the latest restarts' downtimes (none to an oracle, which is told the truth)."""
        return self._downtimes

    def saturated(self, minute: int, workers: int, rate: float) -> None:
        self.online.append((minute, float(workers), self._noisy(rate)))

    def model(self, minute: int) -> ThroughputModel:
        if self.config.oracle:
            return self.truth
        if minute >= self._next_fit:
            self._next_fit = minute + self._refit_minutes
            recent = [(w, r) for m, w, r in self.online if m >= minute - FIT_WINDOW_S / MINUTE]
            points = self.profile + recent
            if points:
                ws, rs = zip(*points)
                self._model, _ = estimate_throughput(
                    ws, rs, self.prior, form=self.truth.form, global_batch=self.truth.global_batch
                )
        return self._model


def windowed_means(rates: np.ndarray, window: int) -> np.ndarray:
    """What telemetry reads at each minute: the mean rate of the ``window`` minutes before it (fewer at the start;
    at minute 0, its own).  The same figures as ``np.mean`` of each window, computed at once (``naive.window_means``
    sums by running totals, which round differently)."""
    n = len(rates)
    out = np.empty(n)
    out[0] = rates[0]
    for minute in range(1, min(window, n)):
        out[minute] = np.mean(rates[:minute])
    if n > window:
        out[window:] = sliding_window_view(rates, window)[: n - window].mean(axis=1)
    return out


def simulate(
    rates: np.ndarray,
    times: pd.DatetimeIndex,
    policy: ScalingPolicy | Controller,
    model: ThroughputModel,
    config: SimConfig = SimConfig(),
    forecasts: ForecastFeed | None = None,
    prior: ThroughputModel | None = None,
) -> SimResult:
    """Run a controller (or a policy as built) over per-minute arrival ``rates`` (samples/s) at ``times``.

    ``model`` is the workers' true F(w).  A :class:`Controller` plans, as a
    real one, with what it learns (see :class:`_Measurements`), starting
    from ``prior`` (default: the true model) unless ``config.oracle``; a bare
    policy keeps what it was built with.  ``forecasts`` feeds a forecasting
    policy (built on the same ``rates``, ``times`` and ``config``).
    """
    rates = np.asarray(rates, dtype=float)
    if len(rates) == 0:
        raise KaleConfigError("rates", "the trace is empty")
    if len(rates) <= config.warmup_steps:
        raise KaleConfigError(
            "warmup_steps", f"warm-up ({config.warmup_steps} min) covers the whole trace ({len(rates)} min)"
        )
    if not isinstance(policy, Controller):
        settings = ControlSettings(
            policy=policy.name,
            limits=config.limits,
            rate_window_s=config.rate_window_s,
            error_window_s=config.error_window_s,
            ratio_window_s=config.ratio_window_s,
        )
        policy = Controller.fixed(policy, settings)
    return _Run(rates, times, policy, model, config, forecasts, _Measurements(model, prior or model, config)).run()


class _Run:
    """One simulation: the world (arrivals, the workers' queue, commits, restarts) and the controller's syncs.

    Each minute (``_minute``) is ``TICK_S`` ticks; a tick (``_tick``) first
    starts a rescale whose latency has passed, lets the controller decide
    when its cadence says so (``_sync``), then moves the world on by one
    tick (``_advance``).  All state is declared here; per-tick reads are
    Python floats (numpy scalars' arithmetic is several times slower)."""

    def __init__(
        self,
        rates: np.ndarray,
        times: pd.DatetimeIndex,
        controller: Controller,
        model: ThroughputModel,
        config: SimConfig,
        forecasts: ForecastFeed | None,
        learned: _Measurements,
    ):
        self.rates, self.times, self.controller, self.config = rates, times, controller, config
        self.forecasts, self.learned = forecasts, learned
        max_workers = config.limits.max_workers
        # F(w) per count, once.
        self.capacity_of: list[float] = np.asarray(model.predict(np.arange(max_workers + 1)), dtype=float).tolist()
        self.rate_at: list[float] = rates.tolist()
        self.epoch = times[0].timestamp()
        self.workers: int = (
            config.initial_workers
            if config.initial_workers is not None
            else config.limits.whole_pods(model.min_workers_for(rates[0], max_workers))
        )
        self.queue = FifoBacklog(now=self.epoch)
        # What telemetry reads: committed offsets.  Same arrivals, consumed only at commits.
        self.committed = FifoBacklog(now=self.epoch) if config.commit_interval_s > 0 else None
        self.seen = self.committed or self.queue
        self.next_commit = self.epoch + config.commit_interval_s
        self.restart_until = -math.inf
        self.pending: tuple[float, int, str, str] | None = None  # a decided rescale waiting act_latency_s
        # The busy share's span: since the last sync (running sums), or the latest metrics window (its ticks'
        # (consumed, capacity)).
        self.busy_consumed = self.busy_capacity = 0.0
        self.window_ticks: deque | None = (
            deque(maxlen=max(int(round(config.metrics_window_s / TICK_S)), 1)) if config.metrics_window_s > 0 else None
        )
        self.ticks_per_min = int(MINUTE // TICK_S)
        self.sync_ticks: int | None = None  # the policy's cadence in ticks, known once it is built
        self.rows = np.zeros((len(rates), 5))  # workers, capacity, lag_s, restarting, consumed
        self.decisions: list = []
        self.rescales_scored = 0
        self.forecast: Forecast | None = None
        self.window = max(int(config.rate_window_s // MINUTE), 1)
        self.measured_at: list[float] = windowed_means(rates, self.window).tolist()
        self.rates_read = -1  # the minute telemetry's windowed rates were last read at
        self.measured = self.consumption = 0.0
        self.planning_model = model

    def run(self) -> SimResult:
        for minute in range(len(self.rates)):
            self._minute(minute)
        return self._result()

    # --- stages, in order -------------------------------------------------------------

    def _minute(self, minute: int) -> None:
        """The forecast and the model known at the minute's start, its ticks, then what the minute measured."""
        if self.forecasts is not None:
            self.forecast = self.forecasts.update(minute)
        self.planning_model = self.learned.model(minute)
        restarting_ticks, consumed_minute = 0, 0.0
        for k in range(self.ticks_per_min):
            restarting, consumed = self._tick(minute, k)
            restarting_ticks += restarting
            consumed_minute += consumed
        restarting_share = restarting_ticks / self.ticks_per_min
        workers, capacity = self.workers, self.capacity_of[self.workers]
        if restarting_ticks == 0 and workers > 0 and consumed_minute >= capacity * MINUTE * (1 - 1e-9):
            # Never waited for data: a throughput measurement.
            self.learned.saturated(minute, workers, consumed_minute / MINUTE)
        self.rows[minute] = (
            workers,
            capacity * (1 - restarting_share),
            self._reported_lag(minute),
            restarting_share,
            consumed_minute,
        )

    def _tick(self, minute: int, k: int) -> tuple[bool, float]:
        """One tick: a pending rescale starts, the controller syncs when due, the world moves on.  Returns
        whether the workers were restarting and what they consumed."""
        now = self.epoch + minute * MINUTE + k * TICK_S
        if self.pending is not None and now >= self.pending[0]:
            self._apply(*self.pending, minute)
            self.pending = None
        restarting = now < self.restart_until
        if self.sync_ticks is None or (minute * self.ticks_per_min + k) % self.sync_ticks == 0:
            restarting = self._sync(now, minute, k, restarting)
        return restarting, self._advance(now, minute, restarting)

    def _sync(self, now: float, minute: int, k: int, restarting: bool) -> bool:
        """The controller decides from what telemetry and the launcher report; a rescale is scheduled (or
        started at once, without an act latency).  Returns whether the workers are restarting now."""
        config = self.config
        step = self.controller.step(self._control_input(now, minute, restarting))
        if self.sync_ticks is None:
            policy = self.controller.policy_in_use
            assert policy is not None  # the step built it
            self.sync_ticks = max(int(round(policy.sync_period_s / TICK_S)), 1)
        target = max(min(step.decision.workers, config.limits.max_workers), 0)
        if minute == 0 and k == 0 and config.initial_workers is None:
            self.workers = target  # the job starts at the policy's first answer, no restart
        elif step.rescale_to is not None and target != self.workers:
            # Acted on after act_latency_s (at once by default): the running group works until then.  A retarget of
            # a rescale still pending changes its target, not when it starts.
            at = self.pending[0] if self.pending is not None else now + config.act_latency_s
            self.pending = (at, target, step.decision.policy, step.decision.reason)
            if config.act_latency_s == 0:
                self._apply(*self.pending, minute)
                self.pending = None
                restarting = self.restart_until > now
        return restarting

    def _control_input(self, now: float, minute: int, restarting: bool) -> ControlInput:
        """What telemetry and the launcher report at this sync, as the controller takes it."""
        config, minute_rows = self.config, self.rows
        if self.rates_read != minute:  # telemetry's windowed rates move once a minute
            self.measured = self.measured_at[minute]
            self.consumption = (
                float(np.mean(minute_rows[max(minute - self.window, 0) : minute, 4])) / MINUTE if minute > 0 else 0.0
            )
            self.rates_read = minute
        # The workers' busy share over its span is what GPU utilization reads; with no capacity in it (the first
        # sync, the one a restart ends at), what the stream implies.  A restarted group reports only after a
        # full metrics window.
        if self.window_ticks is not None:
            self.busy_consumed = sum(c for c, _ in self.window_ticks)
            self.busy_capacity = sum(c for _, c in self.window_ticks)
        if self.busy_capacity > 0:
            busy_share = self.busy_consumed / self.busy_capacity
        else:
            capacity = 0.0 if restarting else self.capacity_of[self.workers]
            busy_share = utilization(None, self.queue.backlog, self.measured, capacity)
        starting = now < self.restart_until + config.metrics_window_s
        self.busy_consumed = self.busy_capacity = 0.0
        reading = StreamReading(
            now,
            self.measured,
            self.consumption,
            self.seen.backlog,
            self._reported_lag(minute),
            latest_arrival_rate=self.rate_at[minute - 1] if minute > 0 else None,
        )
        status = LauncherStatus(
            self.pending[1] if self.pending is not None else self.workers,  # the allocation: a rescale's target
            rescaling=restarting,
            measures=True,
            busy_share=None if starting else busy_share,
            downtimes_s=self.learned.downtimes(),
        )
        return ControlInput(
            reading,
            status,
            self.planning_model,
            forecast=self.forecast,
            forecast_error=self.forecasts.recent_error(minute) if self.forecasts else None,
            forecast_ratio=self.forecasts.recent_ratio(minute) if self.forecasts else None,
            rescale_in_flight=self.pending is not None,
            retargetable=config.retargets,
        )

    def _advance(self, now: float, minute: int, restarting: bool) -> float:
        """The world moves on by one tick: arrivals, consumption at the group's capacity, commits.  Returns
        what the workers consumed."""
        capacity = 0.0 if restarting else self.capacity_of[self.workers]
        arrived = self.rate_at[minute] * TICK_S
        consumed = self.queue.step(TICK_S, arrived, capacity)
        if self.window_ticks is not None:
            self.window_ticks.append((consumed, capacity * TICK_S))
        else:
            self.busy_consumed += consumed
            self.busy_capacity += capacity * TICK_S
        if self.committed is not None:
            self.committed.step(TICK_S, arrived, 0.0)
            if now + TICK_S >= self.next_commit and not restarting:
                self._commit(self.committed)
                self.next_commit += self.config.commit_interval_s
        return consumed

    # --- helpers ------------------------------------------------------------------------

    def _apply(self, at: float, target: int, policy: str, reason: str, minute: int) -> None:
        """The rescale starts: the group stops (checkpointing and committing) and restarts at ``target``."""
        self.decisions.append((at, target, policy, reason))
        self.workers = target
        self.restart_until = at + self.learned.restart(retarget=at < self.restart_until)
        self.rescales_scored += minute >= self.config.warmup_steps
        if self.committed is not None:  # the next group's commit clock starts after the restart
            self._commit(self.committed)
            self.next_commit = self.restart_until + self.config.commit_interval_s

    def _commit(self, committed: FifoBacklog) -> None:
        committed.take(self.queue.consumed_total - committed.consumed_total)

    def _reported_lag(self, minute: int) -> float:
        lag = self.seen.time_lag()
        latency = self.config.pipeline_latency_s + self.config.pipeline_latency_per_worker_s * self.workers
        return lag + latency if lag > 0 or self.rate_at[minute] > 0 else 0.0

    def _result(self) -> SimResult:
        rows, n = self.rows, len(self.rates)
        timeline = pd.DataFrame(
            {
                "time": self.times,
                "arrival_rate": self.rates,
                "workers": rows[:, 0].astype(int),
                "capacity": rows[:, 1],
                "lag_s": rows[:, 2],
                "restarting": rows[:, 3],  # share of the minute spent restarting
                "consumed": rows[:, 4],
                "scored": np.arange(n) >= self.config.warmup_steps,
            }
        )
        return SimResult(score(timeline, self.config.limits.slo_s, self.rescales_scored), timeline, self.decisions)


def score(timeline: pd.DataFrame, slo_s: float, rescales: int) -> PaperMetrics:
    """The paper's metrics over the scored minutes of a timeline (one reading a minute)."""
    t = timeline[timeline["scored"]]
    minutes = np.arange(len(t), dtype=float)
    return score_readings(
        minutes, t["lag_s"], t["workers"], float(len(t)), slo_s, float(t["restarting"].sum()), rescales
    )
