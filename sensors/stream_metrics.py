"""Stream-metrics sensor: record Kafka telemetry at every tick and, given a pipeline's control, decide.

Modelled on dagster-dbt's polling sensor builder: a builder returns a
``SensorDefinition``; the cursor is a typed, JSON-serialisable dataclass;
each tick is time-boxed and says why it skipped.

A tick reads a snapshot through the ``KafkaStreamResource``, converts it to
the pipeline's time (``control.clock``: the identity unless a demo or a
benchmark compresses time), records it as an ``AssetObservation`` of the
``stream_metrics`` asset and in the metrics history, and keeps the offsets
in the cursor for the next tick's rates.  When the broker cannot be
reached the tick skips with the reason, keeps its cursor and records
nothing: no invented zero rate, and no decision on missing data.  The same
holds when the metrics history's database does not answer (down, locked):
the next tick that reaches it computes its rates over the longer interval.

With ``control`` (a ``control.tick.Decider``, ``definitions.control.PipelineControl``) the same tick
runs the pipeline's controller on the reading: the decision is a
``gpu_allocation`` materialization, a change a rescale ``RunRequest``, a
stale forecast a refit ``RunRequest`` (see that module).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd
from dagster import (
    AssetKey,
    AssetObservation,
    DefaultSensorStatus,
    JobDefinition,
    MetadataValue,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)
from sqlalchemy.exc import DBAPIError as DatabaseError

from kale_dagster.control.clock import PipelineClock
from kale_dagster.control.tick import ControlCursor, Decider, TickOutcome, reading_from
from kale_dagster.model.types import PartitionOffsets
from kale_dagster.sensors.cursor import JsonCursor, is_number
from kale_dagster.stream.history import MetricsHistory, describe_database_error
from kale_dagster.stream.telemetry import PreviousOffsets, StreamSnapshot, previous_from

if TYPE_CHECKING:  # what define_asset_job returns; Dagster does not export the type
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

    from kale_dagster.definitions.resources import KafkaStreamResource


@dataclass(frozen=True)
class StreamMetricsCursor(JsonCursor):
    """What a tick hands to the next: the last offsets (wall time) and the controller's memory."""

    time: float | None = None
    offsets: dict = field(default_factory=dict)
    control: dict = field(default_factory=dict)
    warned_partitions: bool = False

    def previous(self) -> PreviousOffsets | None:
        return PreviousOffsets(self.time, self.offsets) if self.time is not None else None

    def valid(self) -> bool:
        """The offsets' shapes; the control part is the decider's (``ControlCursor.from_dict`` checks its own)."""
        offsets_ok = isinstance(self.offsets, dict) and all(
            isinstance(parts, dict)
            and all(
                isinstance(pair, list) and len(pair) == 2 and is_number(pair[0]) and is_number(pair[1], optional=True)
                for pair in parts.values()
            )
            for parts in self.offsets.values()
        )
        return (
            is_number(self.time, optional=True)
            and isinstance(self.warned_partitions, bool)
            and isinstance(self.control, dict)
            and offsets_ok
        )


def pipeline_figures(snap: StreamSnapshot, clock: PipelineClock) -> dict:
    """The snapshot's figures in the pipeline's time: rates per pipeline second, time lag in pipeline seconds."""
    figures = snap.metadata()
    for name in ("arrival_rate", "consumption_rate"):
        if figures[name] is not None:
            figures[name] = clock.rate(figures[name])
    figures["time_lag_s"] = clock.duration(figures["time_lag_s"])
    return figures


def snapshot_metadata(snap: StreamSnapshot, figures: dict) -> dict:
    def num(value):
        return MetadataValue.float(float(value)) if value is not None else MetadataValue.text("n/a (first snapshot)")

    return {
        "arrival_rate": num(figures["arrival_rate"]),
        "consumption_rate": num(figures["consumption_rate"]),
        "sample_lag": MetadataValue.int(int(snap.sample_lag)),
        "time_lag_s": MetadataValue.float(float(figures["time_lag_s"])),
        "time_lag_complete": MetadataValue.bool(snap.time_lag_complete),
        "unusable_record_timestamps": MetadataValue.int(snap.unusable_stamps),
        "end_offset_total": MetadataValue.int(int(snap.end_offset_total)),
        "committed_total": MetadataValue.int(int(snap.committed_total)),
        "partitions": MetadataValue.int(len(snap.partitions)),
        "snapshot_time": MetadataValue.timestamp(snap.time),
    }


class SensorSkip(Exception):
    """A tick that ends early, saying why (the cursor is kept)."""


@dataclass(frozen=True)
class MetricsTick:
    """One tick of a pipeline's stream-metrics sensor, in stages: read the stream, read the recent history, decide
    (with a ``control``), record the reading, and hand the events, run requests and cursor to Dagster."""

    pipeline: str
    history: MetricsHistory | Callable[[], MetricsHistory]
    stream: KafkaStreamResource
    key: AssetKey
    clock: PipelineClock
    tick_timeout_s: float
    control: Decider | None
    max_workers: int | None

    def __call__(self, context: SensorEvaluationContext) -> SensorResult | SkipReason:
        cursor = StreamMetricsCursor.from_json(context.cursor)
        try:
            snap = self._read(cursor)
            now, figures = self.clock.at(snap.time), pipeline_figures(snap, self.clock)
            store, recent = self._recent(now)
            meta, warned = self._observation(context, snap, figures, cursor.warned_partitions)
            outcome, undecided = self._decide(context, cursor, snap, figures, now, recent)
            quality = outcome.model_metric if outcome else None
            if quality is not None:
                meta[f"model_{quality[0]}"] = MetadataValue.float(round(quality[1], 4))
            self._record(store, now, figures, outcome, quality)
        except SensorSkip as skip:
            return SkipReason(str(skip))
        if undecided:
            return SkipReason(
                f"a database did not answer while deciding ({undecided}); the reading is recorded, nothing decided, "
                "cursor kept"
            )
        # A reading is an event when its decision is (at every reading without a decider); the history keeps all.
        observed = outcome is None or bool(outcome.events)
        events = [
            *([AssetObservation(asset_key=self.key, metadata=meta)] if observed else []),
            *(outcome.events if outcome else ()),
        ]
        control_cursor = outcome.cursor.to_dict() if outcome else cursor.control
        new_cursor = StreamMetricsCursor(snap.time, previous_from(snap).offsets, control_cursor, warned)
        return SensorResult(
            run_requests=list(outcome.run_requests) if outcome else [], asset_events=events, cursor=new_cursor.to_json()
        )

    def _read(self, cursor: StreamMetricsCursor) -> StreamSnapshot:
        """The stream's snapshot, within the tick's budget."""
        started = time.monotonic()
        try:
            snap = self.stream.snapshot(previous=cursor.previous(), fetch_timeout_s=max(self.tick_timeout_s / 2, 1.0))
        except Exception as exc:  # broker down, auth failure, timeout: skip, keep the cursor
            raise SensorSkip(
                f"could not read the stream at {self.stream.bootstrap_servers} ({type(exc).__name__}: {exc}); cursor "
                "kept, nothing recorded, nothing decided"
            ) from None
        if time.monotonic() - started > self.tick_timeout_s:
            raise SensorSkip(
                f"snapshot took {time.monotonic() - started:.1f} s, over the {self.tick_timeout_s:.0f} s tick budget; "
                "nothing recorded"
            )
        return snap

    def _recent(self, now: float) -> tuple[MetricsHistory, pd.DataFrame | None]:
        """The metrics history, and with a decider the readings of its rate window."""
        try:
            store = self.history() if callable(self.history) else self.history
            control = self.control
            return store, store.stream(self.pipeline, start=now - control.rate_window_s) if control else None
        except DatabaseError as exc:
            raise _unanswered(exc) from None

    def _observation(
        self, context: SensorEvaluationContext, snap: StreamSnapshot, figures: dict, warned: bool
    ) -> tuple[dict, bool]:
        """The observation's metadata, and whether max_workers above the partitions has been warned about."""
        meta = snapshot_metadata(snap, figures)
        if self.max_workers is None or len(snap.partitions) >= self.max_workers:
            return meta, warned
        meta["warning"] = MetadataValue.text(
            f"max_workers {self.max_workers} exceeds the {len(snap.partitions)} partitions: workers without a "
            "partition only train forwarded samples"
        )
        if not warned:
            context.log.warning(meta["warning"].value)
        return meta, True

    def _decide(
        self,
        context: SensorEvaluationContext,
        cursor: StreamMetricsCursor,
        snap: StreamSnapshot,
        figures: dict,
        now: float,
        recent: pd.DataFrame | None,
    ) -> tuple[TickOutcome | None, str]:
        """The controller's outcome on this reading (None without a decider), or why a database kept it from one."""
        if self.control is None or recent is None:
            return None, ""
        partitions = tuple(PartitionOffsets(p.partition, p.end_offset, p.committed) for p in snap.partitions)
        recorded = pd.concat([recent, pd.DataFrame([{**figures, "ts": now}])], ignore_index=True)
        reading = reading_from(recorded, self.control.rate_window_s, partitions, snap.time_lag_complete)
        try:
            return self.control.tick(context.instance, reading, ControlCursor.from_dict(cursor.control)), ""
        except DatabaseError as exc:  # the reading is still recorded; the decision waits for the database
            return None, describe_database_error(exc)

    def _record(
        self,
        store: MetricsHistory,
        now: float,
        figures: dict,
        outcome: TickOutcome | None,
        quality: tuple[str, float] | None,
    ) -> None:
        """One row per reading, with the workers the decision saw and the model's quality."""
        try:
            store.append_stream(
                self.pipeline,
                now,
                figures,
                workers=outcome.running_workers if outcome else None,
                model_metric=quality,
                decided=(outcome.step.decision.workers, outcome.step.decision.reason) if outcome else None,
                restarting=outcome.step.observation.restarting if outcome and outcome.step.observation else None,
            )
        except DatabaseError as exc:
            raise _unanswered(exc) from None


def _unanswered(exc: DatabaseError) -> SensorSkip:
    return SensorSkip(
        f"the metrics history did not answer ({describe_database_error(exc)}); cursor kept, nothing recorded, "
        "nothing decided"
    )


def build_stream_metrics_sensor(
    *,
    name: str,
    pipeline: str,
    history: MetricsHistory | Callable[[], MetricsHistory],
    stream: KafkaStreamResource,
    asset_key: str | AssetKey = "stream_metrics",
    clock: PipelineClock = PipelineClock(),
    minimum_interval_seconds: int = 60,
    tick_timeout_s: float = 20.0,
    control: Decider | None = None,
    jobs: Sequence[JobDefinition | UnresolvedAssetJobDefinition] = (),
    max_workers: int | None = None,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
) -> SensorDefinition:
    """Build the telemetry (and, with ``control``, decision) sensor for one pipeline.

    ``stream`` reads the topics and the group; it is the sensor's own, not a resource the sensor requires:
    Dagster would initialize a required resource at every evaluation, which costs more CPU than the reading.
    ``history`` may be a factory so the database is opened on the first
    tick, not at code-location load.  ``jobs`` are the jobs ``control`` may
    request (rescale, refit).  ``max_workers`` above the topic's partition
    count is warned about once (workers without a partition only train
    forwarded samples).
    """
    key = AssetKey.from_coercible(asset_key)
    tick = MetricsTick(pipeline, history, stream, key, clock, tick_timeout_s, control, max_workers)

    @sensor(
        name=name,
        minimum_interval_seconds=minimum_interval_seconds,
        jobs=list(jobs) or None,
        default_status=default_status,
        description=f"Records Kafka lag and arrival metrics of pipeline {pipeline!r} as observations of "
        f"{key.to_user_string()}" + ("; decides its allocation at every reading." if control is not None else "."),
    )
    def _sensor(context: SensorEvaluationContext):
        return tick(context)

    return _sensor
