"""Warm-start a pipeline's metrics history from the records its topics retain (``stream.backfill``).

Used by ``kale history backfill`` and the pipeline's ``<name>_backfill`` job.  Only the span before the
first reading the metrics sensor recorded is written, so live readings are never overwritten; the rows are
marked ``seeded``.
"""

from __future__ import annotations

from collections.abc import Callable

from kale_dagster.definitions.pipeline import OnlineTrainingPipeline
from kale_dagster.definitions.resources import KafkaStreamResource
from kale_dagster.errors import KaleConfigError
from kale_dagster.stream.backfill import ArrivalBackfill, rebuild_arrivals


def backfill_pipeline(
    p: OnlineTrainingPipeline,
    days: float,
    bucket_s: float | None = None,
    stream: KafkaStreamResource | None = None,
    done: Callable[[int, int], None] | None = None,
) -> ArrivalBackfill:
    """Rebuild ``days`` of arrival rates at the sensor's cadence (or ``bucket_s``) and seed them into the history."""
    if p.clock.time_scale != 1.0:
        raise KaleConfigError(
            "clock", "a backfill reads Kafka's wall-clock timestamps; it needs a pipeline on wall time"
        )
    stream = stream or KafkaStreamResource.from_source(p.source)
    history = p.history()
    live = history.stream(p.name)
    live = live[~live["seeded"].fillna(False).astype(bool)]
    until = float(live["ts"].min()) if len(live) else None
    with stream.consumer(max_partition_fetch_bytes=1 << 20, fetch_max_wait_ms=50) as consumer:
        result = rebuild_arrivals(
            consumer,
            stream.topics,
            days=days,
            bucket_s=bucket_s or p.metrics_interval_seconds,
            until=until,
            samples_per_record=stream.samples_per_record,
            done=done,
        )
    if len(result.rows):
        history.seed_stream(p.name, result.rows[["ts", "arrival_rate"]])
    return result
