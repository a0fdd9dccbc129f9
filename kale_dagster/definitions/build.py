"""Pipelines to ``dagster.Definitions``: the assets, checks, jobs, schedules and sensors of each."""

from __future__ import annotations

from dagster import AssetKey, DefaultSensorStatus, Definitions

from kale_dagster.definitions.assets import pipeline_assets
from kale_dagster.definitions.checks import pipeline_checks
from kale_dagster.definitions.control import PipelineControl
from kale_dagster.definitions.jobs import asset_jobs, backfill_job, rescale_job, schedules
from kale_dagster.definitions.pipeline import OnlineTrainingPipeline
from kale_dagster.definitions.resources import KafkaStreamResource
from kale_dagster.definitions.savings import savings_asset
from kale_dagster.errors import KaleConfigError
from kale_dagster.sensors import build_run_failure_sensor, build_stream_metrics_sensor


def pipeline_definitions(p: OnlineTrainingPipeline) -> Definitions:
    """Everything one pipeline needs; names are prefixed by the pipeline's."""
    allocation_key = AssetKey(p.key("gpu_allocation"))
    stream_key = f"kale_stream_{p.name}"
    jobs = asset_jobs(p)
    jobs["backfill"] = backfill_job(p, stream_key)
    if not p.advisory:
        jobs["rescale"] = rescale_job(p)
    control = PipelineControl(
        p, rescale_job=jobs["rescale"].name if "rescale" in jobs else None, refit_job=jobs["refit"].name
    )
    status = DefaultSensorStatus.RUNNING if p.autostart else DefaultSensorStatus.STOPPED
    stream = KafkaStreamResource.from_source(p.source)
    sensors = [
        build_stream_metrics_sensor(
            name=f"{p.name}_stream_metrics",
            pipeline=p.name,
            history=lambda: control.history,
            stream=stream,
            asset_key=AssetKey(p.key("stream_metrics")),
            clock=p.clock,
            minimum_interval_seconds=p.sensor_interval_s,
            control=control,
            jobs=[jobs["refit"], *([jobs["rescale"]] if "rescale" in jobs else [])],
            max_workers=p.limits.max_workers,
            default_status=status,
        ),
        build_run_failure_sensor(
            name=f"{p.name}_run_failure",
            pipeline=p.name,
            allocation_key=allocation_key,
            monitored_jobs=list(jobs.values()),
            default_status=status,
        ),
    ]
    return Definitions(
        assets=[*pipeline_assets(p, control), savings_asset(p)],
        asset_checks=pipeline_checks(p),
        jobs=list(jobs.values()),
        schedules=schedules(p, jobs),
        sensors=sensors,
        resources={stream_key: stream},
    )


#: Every pipeline built in this process, by name: how the CLI finds a pipeline in any code location (a Python
#: module or file, a workspace, a dg project's YAML) after loading that location's definitions.
_BUILT: dict[str, OnlineTrainingPipeline] = {}


def build_definitions(*pipelines: OnlineTrainingPipeline) -> Definitions:
    """Merge several pipelines into one ``dagster.Definitions``; names must be unique."""
    names = [p.name for p in pipelines]
    if len(set(names)) != len(names):
        raise KaleConfigError("name", f"pipeline names must be unique, got {names}")
    defs = Definitions.merge(*(pipeline_definitions(p) for p in pipelines))
    _BUILT.update({p.name: p for p in pipelines})
    return defs


def built_pipelines() -> dict[str, OnlineTrainingPipeline]:
    """The pipelines ``build_definitions`` has built in this process, by name."""
    return dict(_BUILT)
