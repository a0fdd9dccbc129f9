"""Allocation-changed sensor: request a rescale run when a new decision differs from the last applied one.

A dagster-dbt-style builder: keyword arguments in, a ``SensorDefinition``
out; the cursor is a typed, JSON-serialisable dataclass.  Each new
``gpu_allocation`` materialization whose worker count differs from the one
last requested becomes one ``RunRequest`` of the rescale job, keyed by the
materialization's storage id, so a decision is requested exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dagster import (
    AssetKey,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from sensors.cursor import JsonCursor


@dataclass(frozen=True)
class AllocationCursor(JsonCursor):
    """The worker count last requested, and the materialization that decided it."""

    workers: Optional[int] = None
    storage_id: Optional[int] = None


def build_allocation_sensor(
    *,
    name: str,
    pipeline: str,
    allocation_key: AssetKey,
    rescale_job: JobDefinition,
    minimum_interval_seconds: int = 30,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
) -> SensorDefinition:
    """Build the sensor that turns changed ``allocation_key`` decisions into ``rescale_job`` runs."""

    @sensor(name=name, job=rescale_job, minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
            description=f"Requests {rescale_job.name} when pipeline {pipeline!r} decides a different worker count.")
    def _sensor(context: SensorEvaluationContext):
        cursor = AllocationCursor.from_json(context.cursor)
        records = context.instance.fetch_materializations(allocation_key, limit=1).records
        if not records:
            return SkipReason("no allocation decided yet")
        latest = records[0]
        workers = int(latest.asset_materialization.metadata["workers"].value)
        if cursor.workers == workers:
            return SkipReason(f"allocation unchanged at {workers} workers")
        context.update_cursor(AllocationCursor(workers, latest.storage_id).to_json())
        return RunRequest(run_key=f"{pipeline}-rescale-{latest.storage_id}", tags={"kale/pipeline": pipeline, "kale/target_workers": str(workers)})

    return _sensor
