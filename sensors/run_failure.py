"""Run-failure sensor: failed plan, allocate or rescale runs show up on gpu_allocation, where operators look.

A builder with keyword arguments; the cursor is Dagster's own (run-status
sensors track the run records they have seen).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dagster import (
    AssetKey,
    AssetObservation,
    DefaultSensorStatus,
    JobDefinition,
    RunFailureSensorContext,
    SensorDefinition,
    run_failure_sensor,
)

if TYPE_CHECKING:  # what define_asset_job returns; Dagster does not export the type
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition


def build_run_failure_sensor(
    *,
    name: str,
    pipeline: str,
    allocation_key: AssetKey,
    monitored_jobs: Sequence[JobDefinition | UnresolvedAssetJobDefinition],
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
) -> SensorDefinition:
    """Build the sensor that records each failed run of ``monitored_jobs`` as an observation of ``allocation_key``."""

    @run_failure_sensor(
        name=name,
        monitored_jobs=list(monitored_jobs),
        default_status=default_status,
        description=f"Records failed Kale runs of pipeline {pipeline!r} on its gpu_allocation asset.",
    )
    def _sensor(context: RunFailureSensorContext):
        message = context.failure_event.message or "run failed"
        context.instance.report_runless_asset_event(
            AssetObservation(
                allocation_key,
                metadata={
                    "failed_run": context.dagster_run.run_id,
                    "failed_job": context.dagster_run.job_name,
                    "failure": message[:1000],
                },
            )
        )

    return _sensor
