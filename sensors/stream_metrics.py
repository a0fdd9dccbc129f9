"""Stream-metrics sensor: record Kafka telemetry each tick, request a run on emergency lag.

Modelled on dagster-dbt's polling sensor builder: a builder returns a
``SensorDefinition``; the cursor is a typed, JSON-serialisable dataclass;
each tick is time-boxed and says why it skipped.

A tick reads a snapshot through the ``KafkaStreamResource``, records it as
an ``AssetObservation`` of the ``stream_metrics`` asset (figures as
metadata), appends it to the metrics history and keeps the offsets in the
cursor for the next tick's rates.  When the broker cannot be reached the
tick skips with the reason, keeps its cursor and records nothing: no
invented zero rate.  When time lag crosses ``emergency_lag_s`` it requests
one run of ``emergency_job`` per episode (the run key names the episode's
start), and re-arms once lag falls below the threshold.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from dagster import (
    AssetKey,
    AssetObservation,
    DefaultSensorStatus,
    JobDefinition,
    MetadataValue,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from kale_dagster.stream.history import MetricsHistory
from kale_dagster.stream.telemetry import PreviousOffsets, StreamSnapshot, previous_from
from sensors.cursor import JsonCursor


@dataclass(frozen=True)
class StreamMetricsCursor(JsonCursor):
    """What a tick hands to the next: the last offsets and the emergency episode, if any."""

    time: Optional[float] = None
    offsets: dict = field(default_factory=dict)
    emergency_since: Optional[float] = None

    def previous(self) -> Optional[PreviousOffsets]:
        return PreviousOffsets(self.time, self.offsets) if self.time is not None else None


def snapshot_metadata(snap: StreamSnapshot) -> dict:
    def num(value):
        return MetadataValue.float(float(value)) if value is not None else MetadataValue.text("n/a (first snapshot)")

    return {
        "arrival_rate": num(snap.arrival_rate),
        "consumption_rate": num(snap.consumption_rate),
        "sample_lag": MetadataValue.int(int(snap.sample_lag)),
        "time_lag_s": MetadataValue.float(float(snap.time_lag_s)),
        "time_lag_complete": MetadataValue.bool(snap.time_lag_complete),
        "end_offset_total": MetadataValue.int(int(snap.end_offset_total)),
        "committed_total": MetadataValue.int(int(snap.committed_total)),
        "partitions": MetadataValue.int(len(snap.partitions)),
        "snapshot_time": MetadataValue.timestamp(snap.time),
    }


def build_stream_metrics_sensor(
    *,
    name: str,
    pipeline: str,
    history: Union[MetricsHistory, Callable[[], MetricsHistory]],
    stream_resource_key: str = "kale_stream",
    asset_key: Union[str, AssetKey] = "stream_metrics",
    minimum_interval_seconds: int = 60,
    tick_timeout_s: float = 20.0,
    emergency_lag_s: Optional[float] = None,
    emergency_job: Optional[JobDefinition] = None,
    workers: Optional[Callable[[], Optional[int]]] = None,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
) -> SensorDefinition:
    """Build the telemetry sensor for one pipeline.

    ``history`` may be a factory so the database is opened on the first
    tick, not at code-location load.  ``workers`` reports the current
    allocation to store beside the figures.
    """
    key = AssetKey.from_coercible(asset_key)
    if (emergency_lag_s is None) != (emergency_job is None):
        raise ValueError("emergency_lag_s and emergency_job go together: set both or neither")

    @sensor(
        name=name,
        minimum_interval_seconds=minimum_interval_seconds,
        required_resource_keys={stream_resource_key},
        job=emergency_job,
        default_status=default_status,
        description=f"Records Kafka lag and arrival metrics of pipeline {pipeline!r} as observations of {key.to_user_string()}.",
    )
    def _sensor(context: SensorEvaluationContext, **resources):
        # Direct invocation passes required resources as keyword arguments,
        # the daemon puts them on the context.
        cursor = StreamMetricsCursor.from_json(context.cursor)
        stream = resources.get(stream_resource_key) or getattr(context.resources, stream_resource_key)
        started = time.monotonic()
        try:
            snap = stream.snapshot(previous=cursor.previous(), fetch_timeout_s=max(tick_timeout_s / 2, 1.0))
        except Exception as exc:  # broker down, auth failure, timeout: skip, keep the cursor
            return SkipReason(f"could not read the stream at {stream.bootstrap_servers} ({type(exc).__name__}: {exc}); cursor kept, nothing recorded")
        if time.monotonic() - started > tick_timeout_s:
            return SkipReason(f"snapshot took {time.monotonic() - started:.1f} s, over the {tick_timeout_s:.0f} s tick budget; nothing recorded")

        store = history() if callable(history) else history
        store.append_stream(pipeline, snap.time, snap.metadata(), workers=workers() if workers else None)
        emergency_since = cursor.emergency_since
        run_requests = []
        if emergency_lag_s is not None:
            if snap.time_lag_s > emergency_lag_s:
                if emergency_since is None:
                    emergency_since = snap.time
                    run_requests.append(
                        RunRequest(
                            run_key=f"{pipeline}-emergency-{int(emergency_since)}",
                            tags={"kale/pipeline": pipeline, "kale/trigger": "emergency-lag", "kale/time_lag_s": f"{snap.time_lag_s:.0f}"},
                        )
                    )
            else:
                emergency_since = None
        new_cursor = StreamMetricsCursor(snap.time, previous_from(snap).offsets, emergency_since)
        observation = AssetObservation(asset_key=key, metadata=snapshot_metadata(snap))
        return SensorResult(run_requests=run_requests, asset_events=[observation], cursor=new_cursor.to_json())

    return _sensor

