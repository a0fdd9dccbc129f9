"""Trace-driven simulator: replay arrivals through any scaling policy.

The policies are the same objects the Dagster assets drive; only the world
around them is simulated:

* arrivals follow the trace (a rate per minute, spread evenly in the minute);
* the allocated workers consume at the throughput model's F(w), FIFO, so a
  sample's lag is its age when consumed (``kale_dagster.model.backlog``);
* a rescale pauses consumption for ``restart_s`` (pause-and-restart, the
  paper's 10 minutes for a 1B-parameter model);
* policies are called every ``sync_period_s`` of their own (HPA 15 s, KEDA
  15 s, Kale 60 s) with what telemetry would report (utilization is the
  workers' busy share since the last sync, what GPU utilization reads);
* Kale's forecaster is refitted every ``refit_every_s`` and re-predicted
  from the latest observations every ``forecast_every_s`` (the paper's
  10 minutes);
* with ``commit_interval_s``, offsets are committed only that often (and at
  each rescale's graceful stop), as a trainer that commits at checkpoints
  does: telemetry, and so the policies and the metrics, see the age of the
  oldest *uncommitted* sample, which lags the consumed one by up to the
  interval;
* with ``metrics_window_s``, a restarted group reports no metrics until it
  has worked one full window (HPA likewise ignores a pod's metric until a
  window after it became ready): until then the policies are told it is
  still restarting;
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
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pandas as pd

from kale_dagster.errors import KaleConfigError
from kale_dagster.forecast.base import Forecast
from kale_dagster.forecast.evaluate import smape
from kale_dagster.model.backlog import FifoBacklog
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.model.types import Observation, ScalingPolicy
from kale_dagster.model.utilization import utilization
from kale_dagster.sim.metrics import PaperMetrics, score_readings

TICK_S = 15.0
MINUTE = 60.0


@dataclass
class SimResult:
    metrics: PaperMetrics
    timeline: pd.DataFrame  # per minute: time, arrival_rate, workers, capacity, lag_s, restarting, scored
    decisions: list  # (time, workers, policy, reason) for every change


@dataclass(frozen=True)
class SimConfig:
    restart_s: float = 600.0
    slo_s: float = 1200.0
    warmup_steps: int = 0  # minutes simulated but not scored
    initial_workers: Optional[int] = None  # default: enough for the first minute
    max_workers: int = 32
    refit_every_s: float = 86_400.0
    forecast_every_s: float = 600.0
    forecast_horizon_s: float = 7200.0
    rate_window_s: float = 300.0  # telemetry's averaging window for rates
    error_window_s: float = 3600.0  # window of the recent forecast error fed to Kale's fallback
    commit_interval_s: float = 0.0  # offsets committed this often (checkpoints); 0 = as consumed
    pipeline_latency_s: float = 0.0  # a sample's time inside the trainer before it can be committed...
    pipeline_latency_per_worker_s: float = 0.0  # ...plus this per worker
    metrics_window_s: float = 0.0  # a restarted group's first metrics come this long after it resumes

    def __post_init__(self):
        may_be_zero = ("restart_s", "commit_interval_s", "pipeline_latency_s", "pipeline_latency_per_worker_s", "metrics_window_s")
        for name in (*may_be_zero, "refit_every_s", "forecast_every_s", "forecast_horizon_s", "rate_window_s", "error_window_s"):
            if getattr(self, name) < 0 or (name not in may_be_zero and getattr(self, name) == 0):
                raise KaleConfigError(name, f"must be > 0, got {getattr(self, name)}")
        if self.slo_s <= 0:
            raise KaleConfigError("slo_s", f"must be > 0, got {self.slo_s}")
        if self.warmup_steps < 0:
            raise KaleConfigError("warmup_steps", f"must be >= 0, got {self.warmup_steps}")


class _ForecastFeed:
    """Keeps Kale's forecast current: refit on cadence, re-predict from fresh history."""

    def __init__(self, factory: Callable, times: pd.DatetimeIndex, rates: np.ndarray, cfg: SimConfig, prior: Optional[pd.DataFrame] = None):
        self.factory = factory
        self.times = times
        self.rates = rates
        self.cfg = cfg
        self.prior = prior if prior is not None else pd.DataFrame({"timestamp": pd.DatetimeIndex([], tz="UTC"), "rate": []})
        self.model = None
        self.next_refit = 0
        self.forecast: Optional[Forecast] = None
        self.one_step: dict[int, float] = {}  # minute index -> forecast made before it

    def update(self, minute: int) -> Optional[Forecast]:
        """Called at minute boundaries; ``minute`` observations are known."""
        if minute + len(self.prior) < 2 or minute % max(int(self.cfg.forecast_every_s // MINUTE), 1):
            return self.forecast
        history = pd.concat([self.prior, pd.DataFrame({"timestamp": self.times[:minute], "rate": self.rates[:minute]})], ignore_index=True)
        steps = max(int(self.cfg.forecast_horizon_s // MINUTE), 1)
        if self.model is None or minute >= self.next_refit:
            self.model = self.factory().fit(history)
            self.next_refit = minute + int(self.cfg.refit_every_s // MINUTE)
            fc = self.model.predict(steps)
        else:
            fc = self.model.predict(steps, history=history)
        self.forecast = fc
        for k, value in enumerate(fc.point[: int(self.cfg.forecast_every_s // MINUTE)]):
            self.one_step[minute + k] = float(value)
        return fc

    def recent_error(self, minute: int) -> Optional[float]:
        window = int(self.cfg.error_window_s // MINUTE)
        idx = [m for m in range(max(minute - window, 0), minute) if m in self.one_step]
        if len(idx) < window // 2:
            return None
        return smape(self.rates[idx], np.array([self.one_step[m] for m in idx]))


def simulate(
    rates: np.ndarray,
    times: pd.DatetimeIndex,
    policy: ScalingPolicy,
    model: ThroughputModel,
    config: SimConfig = SimConfig(),
    forecaster_factory: Optional[Callable] = None,
    progress: Optional[Callable[[int, int], None]] = None,
    forecast_history: Optional[pd.DataFrame] = None,
) -> SimResult:
    """Run ``policy`` over per-minute arrival ``rates`` (samples/s) at ``times``.

    ``forecast_history`` (``timestamp``, ``rate``) is what was recorded before
    ``times[0]``: the forecaster sees it, the simulated workers never did
    (a pipeline whose history was seeded, or that ran under another policy).
    """
    rates = np.asarray(rates, dtype=float)
    n = len(rates)
    if n == 0:
        raise KaleConfigError("rates", "the trace is empty")
    if n <= config.warmup_steps:
        raise KaleConfigError("warmup_steps", f"warm-up ({config.warmup_steps} min) covers the whole trace ({n} min)")
    epoch = times[0].timestamp()
    workers = config.initial_workers if config.initial_workers is not None else model.min_workers_for(rates[0], config.max_workers)
    queue = FifoBacklog(now=epoch)
    # What telemetry reads: committed offsets.  Same arrivals, consumed only at commits.
    committed = FifoBacklog(now=epoch) if config.commit_interval_s > 0 else None
    seen = committed or queue
    next_commit = epoch + config.commit_interval_s
    restart_until = -math.inf
    busy_consumed = busy_capacity = 0.0  # since the last sync

    def commit() -> None:
        committed.take(queue.consumed_total - committed.consumed_total)

    def reported_lag(minute: int) -> float:
        lag = seen.time_lag()
        latency = config.pipeline_latency_s + config.pipeline_latency_per_worker_s * workers
        return lag + latency if lag > 0 or rates[minute] > 0 else 0.0
    feed = _ForecastFeed(forecaster_factory, times, rates, config, forecast_history) if forecaster_factory else None
    ticks_per_min = int(MINUTE // TICK_S)
    sync_ticks = max(int(round(policy.sync_period_s / TICK_S)), 1)
    consumed_log: list[float] = []
    rows = np.zeros((n, 5))  # workers, capacity, lag_s, restarting, consumed
    decisions = []
    rescales_scored = 0
    forecast = None
    for minute in range(n):
        if feed is not None:
            forecast = feed.update(minute)
        restarting_ticks = 0
        consumed_minute = 0.0
        for k in range(ticks_per_min):
            now = epoch + minute * MINUTE + k * TICK_S
            restarting = now < restart_until
            if (minute * ticks_per_min + k) % sync_ticks == 0:
                window = max(int(config.rate_window_s // MINUTE), 1)
                lo = max(minute - window, 0)
                measured = float(np.mean(rates[lo:minute])) if minute > 0 else rates[0]
                consumption = float(np.mean(consumed_log[-window:])) / MINUTE if consumed_log else 0.0
                capacity_now = 0.0 if restarting else model.predict(workers)
                # The workers' busy share since the last sync is what GPU utilization reads.
                busy_share = busy_consumed / busy_capacity if busy_capacity > 0 else None
                busy = utilization(busy_share, queue.backlog, measured, capacity_now)
                busy_consumed = busy_capacity = 0.0
                obs = Observation(
                    time=now, workers=workers, arrival_rate=measured, consumption_rate=consumption,
                    backlog=seen.backlog, time_lag_s=reported_lag(minute), utilization=busy,
                    forecast=forecast, forecast_error=feed.recent_error(minute) if feed else None,
                    restarting=now < restart_until + config.metrics_window_s,
                )
                decision = policy.decide(obs)
                target = max(min(decision.workers, config.max_workers), 0)
                if minute == 0 and k == 0 and config.initial_workers is None:
                    workers = target  # the job starts at the policy's first answer, no restart
                elif target != workers:
                    decisions.append((now, target, decision.policy, decision.reason))
                    workers = target
                    restart_until = now + config.restart_s
                    restarting = config.restart_s > 0
                    rescales_scored += minute >= config.warmup_steps
                    if committed is not None:  # the graceful stop checkpoints and commits; the next group's clock starts after the restart
                        commit()
                        next_commit = restart_until + config.commit_interval_s
            capacity = 0.0 if restarting else model.predict(workers)
            consumed = queue.step(TICK_S, rates[minute] * TICK_S, capacity)
            consumed_minute += consumed
            busy_consumed += consumed
            busy_capacity += capacity * TICK_S
            if committed is not None:
                committed.step(TICK_S, rates[minute] * TICK_S, 0.0)
                if now + TICK_S >= next_commit and not restarting:
                    commit()
                    next_commit += config.commit_interval_s
            restarting_ticks += restarting
        consumed_log.append(consumed_minute)
        restarting_share = restarting_ticks / ticks_per_min
        rows[minute] = (workers, model.predict(workers) * (1 - restarting_share), reported_lag(minute), restarting_share, consumed_minute)
        if progress:
            progress(minute + 1, n)
    timeline = pd.DataFrame(
        {
            "time": times,
            "arrival_rate": rates,
            "workers": rows[:, 0].astype(int),
            "capacity": rows[:, 1],
            "lag_s": rows[:, 2],
            "restarting": rows[:, 3],  # share of the minute spent restarting
            "consumed": rows[:, 4],
            "scored": np.arange(n) >= config.warmup_steps,
        }
    )
    return SimResult(score(timeline, config.slo_s, rescales_scored), timeline, decisions)


def score(timeline: pd.DataFrame, slo_s: float, rescales: int) -> PaperMetrics:
    """The paper's metrics over the scored minutes of a timeline (one reading a minute)."""
    t = timeline[timeline["scored"]]
    minutes = np.arange(len(t), dtype=float)
    return score_readings(minutes, t["lag_s"], t["workers"], float(len(t)), slo_s, float(t["restarting"].sum()), rescales)
