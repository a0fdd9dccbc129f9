"""A control loop outside Dagster: telemetry -> policy -> launcher, one tick at a time.

Dagster's schedules tick at most once a minute, too slow for a day
compressed into minutes; the demo and the end-to-end benchmark run this
loop instead, with the same telemetry, policies and launchers the Dagster
assets and jobs use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from .forecast import make_forecaster
from .history import MetricsHistory
from .launchers.base import RescaleRecord
from .policy import Decision, Observation, ScalingPolicy
from .resources import KafkaStreamResource
from .telemetry import PreviousOffsets, previous_from
from .throughput import ThroughputModel


@dataclass(frozen=True)
class LiveTick:
    time: float
    arrival_rate: float
    time_lag_s: float
    sample_lag: int
    workers: int
    decision: Decision
    record: Optional[RescaleRecord]


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
    ):
        """Durations are wall seconds: a compressed-time run divides them by its speed-up."""
        self.stream, self.launcher, self.policy, self.model = stream, launcher, policy, model
        self.history, self.pipeline = history, pipeline
        self.forecast_horizon_s, self.forecast_halflife_s = forecast_horizon_s, forecast_halflife_s
        self.on_rescale = on_rescale
        self.previous: Optional[PreviousOffsets] = None
        self.per_worker_rate: Optional[float] = None  # measured capacity of one worker, samples/s

    def tick(self) -> LiveTick:
        """One round: read the stream, record it, decide, rescale if needed.  Raises if the stream cannot be read."""
        self.launcher.supervise_once()
        snap = self.stream.snapshot(previous=self.previous, fetch_timeout_s=1.0)
        self.previous = previous_from(snap)
        workers = self.launcher.workers
        self.history.append_stream(self.pipeline, snap.time, snap.metadata(), workers=workers)
        measured = self.launcher.record_throughput(self.history, self.pipeline)
        busy = snap.sample_lag > 2 * (snap.arrival_rate or 0.0)  # more than two seconds of arrivals waiting
        if measured is not None and busy and measured["total"] > 0:
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
            backlog=snap.sample_lag, time_lag_s=snap.time_lag_s, utilization=utilization, forecast=forecast,
        )
        decision = self.policy.decide(obs)
        record = None
        if decision.workers != workers:
            record = self.launcher.rescale(decision.workers, reason=decision.reason[:500])
            if record is not None and self.on_rescale:
                self.on_rescale(record)
        return LiveTick(snap.time, snap.arrival_rate or 0.0, snap.time_lag_s, snap.sample_lag, self.launcher.workers, decision, record)

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
