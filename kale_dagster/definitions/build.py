"""Pipelines to ``dagster.Definitions``: the assets, checks, jobs, schedules and sensors of each."""

from __future__ import annotations

from dagster import AssetKey, Definitions

from kale_dagster.definitions.assets import pipeline_assets
from kale_dagster.definitions.checks import pipeline_checks
from kale_dagster.definitions.jobs import asset_jobs, rescale_job, schedules
from kale_dagster.definitions.pipeline import OnlineTrainingPipeline
from kale_dagster.definitions.resources import KafkaStreamResource
from kale_dagster.errors import KaleConfigError
from sensors import build_allocation_sensor, build_run_failure_sensor, build_stream_metrics_sensor


def pipeline_definitions(p: OnlineTrainingPipeline) -> Definitions:
    """Everything one pipeline needs; names are prefixed by the pipeline's."""
    allocation_key = AssetKey(p.key("gpu_allocation"))
    stream_key = f"kale_stream_{p.name}"
    jobs = asset_jobs(p)
    sensors = [
        build_stream_metrics_sensor(
            name=f"{p.name}_stream_metrics",
            pipeline=p.name,
            history=p.history,
            stream_resource_key=stream_key,
            asset_key=AssetKey(p.key("stream_metrics")),
            minimum_interval_seconds=p.metrics_interval_seconds,
            emergency_lag_s=p.emergency_lag_s,
            emergency_job=jobs["allocate"],
        )
    ]
    monitored = [jobs["plan"], jobs["allocate"]]
    if not p.advisory:
        rescale = rescale_job(p)
        jobs["rescale"] = rescale
        monitored.append(rescale)
        sensors.append(build_allocation_sensor(name=f"{p.name}_allocation_changed", pipeline=p.name, allocation_key=allocation_key, rescale_job=rescale))
    sensors.append(build_run_failure_sensor(name=f"{p.name}_run_failure", pipeline=p.name, allocation_key=allocation_key, monitored_jobs=monitored))
    return Definitions(
        assets=pipeline_assets(p),
        asset_checks=pipeline_checks(p),
        jobs=list(jobs.values()),
        schedules=schedules(p, jobs),
        sensors=sensors,
        resources={stream_key: KafkaStreamResource.from_source(p.source)},
    )


def build_definitions(*pipelines: OnlineTrainingPipeline) -> Definitions:
    """Merge several pipelines into one ``dagster.Definitions``; names must be unique."""
    names = [p.name for p in pipelines]
    if len(set(names)) != len(names):
        raise KaleConfigError("name", f"pipeline names must be unique, got {names}")
    return Definitions.merge(*(pipeline_definitions(p) for p in pipelines))
