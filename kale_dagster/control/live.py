"""A control loop outside Dagster: telemetry -> policy -> launcher, one tick at a time.

Dagster's schedules tick at most once a minute, too slow for a day
compressed into minutes; the demo and the end-to-end benchmark run this
loop instead, with the same telemetry, policies and launchers the Dagster
assets and jobs use.

A rescale runs in the background, as a Dagster run would: the loop keeps
reading telemetry while the workers restart (so the lag of a restart is
seen, not skipped), and the policy is told ``restarting``, as the
simulator tells it.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable, Optional

from kale_dagster.definitions.resources import KafkaStreamResource
from kale_dagster.forecast import make_forecaster
from kale_dagster.launchers.base import RescaleRecord
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.model.types import Decision, Observation, ScalingPolicy
from kale_dagster.stream.history import MetricsHistory
from kale_dagster.stream.telemetry import PreviousOffsets, previous_from


@dataclass(frozen=True)
class LiveTick:
    time: float
    arrival_rate: float
    time_lag_s: float
    sample_lag: int
    workers: int  # allocated: the target while a rescale is in flight
    decision: Decision
    record: Optional[RescaleRecord]  # a rescale that finished since the last tick
    restarting: bool = False


class LiveController:
    def __init__(
        self,
        stream: KafkaStreamResource,
        launcher,
        policy: ScalingPolicy,
        model: ThroughputModel,
        history: MetricsHistory,
        pipeline: str,
        forecast_horizon_s: float,
        forecast_halflife_s: float = 1800.0,
        on_rescale: Optional[Callable[[RescaleRecord], None]] = None,
        learn_capacity: bool = True,
    ):
        """Durations are wall seconds: a compressed-time run divides them by its speed-up.

        ``learn_capacity`` replaces ``model`` with what busy workers are measured to
        deliver; switch it off when ``model`` was profiled (``ThroughputModel.fit``).
        """
        self.stream, self.launcher, self.policy, self.model = stream, launcher, policy, model
        self.learn_capacity = learn_capacity
        self.history, self.pipeline = history, pipeline
        self.forecast_horizon_s, self.forecast_halflife_s = forecast_horizon_s, forecast_halflife_s
        self.on_rescale = on_rescale
        self.previous: Optional[PreviousOffsets] = None
        self.per_worker_rate: Optional[float] = None  # measured capacity of one worker, samples/s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rescale")
        self._pending: Optional[tuple[int, Future]] = None  # (target, rescale in flight)

    def tick(self) -> LiveTick:
        """One round: read the stream, record it, decide, start a rescale if needed.

        Raises if the stream cannot be read, or if the last rescale failed.
        """
        record = self._finished_rescale()
        restarting = self._pending is not None
        if not restarting:
            self.launcher.supervise_once()
        snap = self.stream.snapshot(previous=self.previous, fetch_timeout_s=1.0)
        self.previous = previous_from(snap)
        workers = self._pending[0] if restarting else self.launcher.workers
        self.history.append_stream(self.pipeline, snap.time, snap.metadata(), workers=workers)
        measured = self.launcher.record_throughput(self.history, self.pipeline)
        # Until every rank of a new group has reported, it is still starting: like pods not
        # yet ready, it gives HPA no utilization, and no policy acts on it.
        restarting = restarting or measured is None
        busy = snap.sample_lag > 2 * (snap.arrival_rate or 0.0)  # more than two seconds of arrivals waiting
        if self.learn_capacity and measured is not None and busy and measured["total"] > 0:
            self._learn_capacity(measured["total"] / measured["workers"])
        recent = self.history.arrival_history(self.pipeline, start=snap.time - 4 * self.forecast_halflife_s)
        forecast = None
        if len(recent) >= 3:
            # One forecast step per telemetry tick, covering the horizon.
            step_s = max(float(recent["timestamp"].diff().dt.total_seconds().median()), 1e-3)
            steps = max(int(round(self.forecast_horizon_s / step_s)), 1)
            forecast = make_forecaster("ewma", halflife_s=self.forecast_halflife_s).fit(recent).predict(steps)
        consumption = snap.consumption_rate or 0.0
        utilization = self._utilization(snap, workers, measured)
        obs = Observation(
            time=snap.time, workers=workers, arrival_rate=snap.arrival_rate or 0.0, consumption_rate=consumption,
            backlog=snap.sample_lag, time_lag_s=snap.time_lag_s, utilization=utilization, forecast=forecast, restarting=restarting,
        )
        decision = self.policy.decide(obs)
        if not restarting and decision.workers != workers:
            self._pending = (decision.workers, self._executor.submit(self.launcher.rescale, decision.workers, reason=decision.reason[:500]))
            workers, restarting = decision.workers, True
        return LiveTick(snap.time, snap.arrival_rate or 0.0, snap.time_lag_s, snap.sample_lag, workers, decision, record, restarting)

    def wait_idle(self, timeout: Optional[float] = None) -> Optional[RescaleRecord]:
        """Wait for a rescale in flight (before stopping the launcher); its record, if one was."""
        if self._pending is None:
            return None
        wait([self._pending[1]], timeout)
        return self._finished_rescale()

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def _finished_rescale(self) -> Optional[RescaleRecord]:
        if self._pending is None or not self._pending[1].done():
            return None
        future, self._pending = self._pending[1], None
        record = future.result()  # a failed rescale raises here, in the loop's thread
        if record is not None and self.on_rescale:
            self.on_rescale(record)
        return record

    def _utilization(self, snap, workers: int, measured: Optional[dict]) -> float:
        """HPA's metric: the workers' busy share where they report it; otherwise all
        busy while a backlog waits, else consumption over capacity."""
        if measured is not None and measured.get("busy_share") is not None:
            return measured["busy_share"]
        if snap.sample_lag > 0:
            return 1.0
        capacity = float(self.model.predict(workers))
        return min((snap.consumption_rate or 0.0) / capacity, 1.0) if capacity else 0.0

    def _learn_capacity(self, per_worker: float) -> None:
        """Track what a worker really delivers while a backlog keeps it busy, and plan with that.

        Only busy periods count: an idle worker's throughput is the arrival
        rate, not its capacity.  The policy's model becomes linear in the
        measured per-worker rate (an EWMA), so a slower machine than the
        prior assumed is planned for, not discovered through lag.
        """
        self.per_worker_rate = per_worker if self.per_worker_rate is None else 0.8 * self.per_worker_rate + 0.2 * per_worker
        self.model = ThroughputModel.linear(self.per_worker_rate)
        if hasattr(self.policy, "model"):
            self.policy.model = self.model
