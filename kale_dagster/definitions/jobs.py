"""Jobs and the schedule of one pipeline, and the rescale job that applies a decision.

* ``<name>_refit``: refit the forecaster and the throughput model (the
  metrics sensor requests it at the pipeline's refit cadence);
* ``<name>_decide``: decide once more from the latest metrics, by hand;
* ``<name>_backtest``: replay recorded traffic through every policy (daily);
* ``<name>_savings``: the savings report: what ran beside what Kale would have run (daily);
* ``<name>_backfill``: rebuild the arrival history from the records Kafka
  retains, so the forecaster starts warm (``definitions.backfill``);
* ``<name>_rescale``: apply a decision through the pipeline's launcher: the
  target its run was requested with (its ``RescaleConfig``), or the latest
  ``gpu_allocation`` when run by hand; one run at a time per pipeline (an op
  pool and a run tag the queued run coordinator can limit).  What happened
  (downtime, or nothing to do) is an observation of ``gpu_allocation``.  A
  retarget decided while it runs (a burst met by its restart) reaches the
  restart through the launcher, from the sensor's process
  (``Launcher.retarget``): the restart forms the larger group instead.
"""

from typing import TYPE_CHECKING

from dagster import (
    AssetKey,
    AssetObservation,
    DefaultScheduleStatus,
    Failure,
    Field,
    JobDefinition,
    MetadataValue,
    ScheduleDefinition,
    define_asset_job,
    in_process_executor,
    job,
    op,
)

from kale_dagster.definitions.decision import RescaleConfig, latest_metadata, rescale_op_name
from kale_dagster.definitions.pipeline import OnlineTrainingPipeline
from kale_dagster.launchers.base import RescaleFailed, RescaleRecord

if TYPE_CHECKING:  # what define_asset_job returns; Dagster does not export the type
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition


def asset_jobs(p: OnlineTrainingPipeline) -> "dict[str, JobDefinition | UnresolvedAssetJobDefinition]":
    """refit, decide, backtest and savings, keyed by role."""
    forecast, model, allocation = (
        AssetKey(p.key(a)) for a in ("traffic_forecast", "throughput_model", "gpu_allocation")
    )
    tags = {"kale/pipeline": p.name}
    return {
        "refit": define_asset_job(
            f"{p.name}_refit",
            selection=[forecast, model],
            tags=tags,
            executor_def=in_process_executor,
            description="Refit the forecaster and the throughput model.",
        ),
        "decide": define_asset_job(
            f"{p.name}_decide",
            selection=[allocation],
            tags=tags,
            executor_def=in_process_executor,
            description="Decide the allocation once more from the latest metrics.",
        ),
        "backtest": define_asset_job(
            f"{p.name}_backtest",
            selection=[AssetKey(p.key("policy_backtest"))],
            tags=tags,
            description="Replay recorded traffic through every policy.",
        ),
        "savings": define_asset_job(
            f"{p.name}_savings",
            selection=[AssetKey(p.key("savings"))],
            tags=tags,
            executor_def=in_process_executor,
            description="What ran beside what Kale and the tuned baselines would have run.",
        ),
    }


def schedules(
    p: OnlineTrainingPipeline, jobs: "dict[str, JobDefinition | UnresolvedAssetJobDefinition]"
) -> list[ScheduleDefinition]:
    status = DefaultScheduleStatus.RUNNING if p.autostart else DefaultScheduleStatus.STOPPED
    return [
        ScheduleDefinition(
            name=f"{p.name}_backtest_schedule",
            cron_schedule=p.backtest_cron,
            job=jobs["backtest"],
            default_status=status,
        ),
        ScheduleDefinition(
            name=f"{p.name}_savings_schedule",
            cron_schedule=p.report_cron,
            job=jobs["savings"],
            default_status=status,
        ),
    ]


def backfill_job(p: OnlineTrainingPipeline, stream_key: str) -> JobDefinition:
    """``<name>_backfill``: seed the metrics history from the topics' retained records (``days``, default 7)."""
    from kale_dagster.definitions.backfill import backfill_pipeline

    @op(
        name=f"{p.name}_backfill_history",
        required_resource_keys={stream_key},
        tags={"kale/pipeline": p.name},
        config_schema={
            "days": Field(float, default_value=7.0, description="how far back to rebuild, at most what Kafka retains")
        },
    )
    def backfill_history(context) -> None:
        try:
            result = backfill_pipeline(p, context.op_config["days"], stream=getattr(context.resources, stream_key))
        except (LookupError, TimeoutError, ValueError) as exc:
            raise Failure(f"backfill of {p.name!r} from {p.source.bootstrap_servers} failed: {exc}") from exc
        context.log_event(
            AssetObservation(
                asset_key=AssetKey(p.key("stream_metrics")),
                metadata={
                    "backfilled_buckets": len(result.rows),
                    "backfilled_records": int(result.rows["records"].sum()) if len(result.rows) else 0,
                    "method": result.method,
                    "requests": result.requests,
                    "from": result.start,
                    "to": result.end,
                    "note": result.note or "complete",
                },
            )
        )

    @job(
        name=f"{p.name}_backfill",
        tags={"kale/pipeline": p.name},
        executor_def=in_process_executor,
        description="Rebuild the arrival history from the records Kafka retains (a warm start for the forecaster).",
    )
    def backfill():
        backfill_history()

    return backfill


def rescale_job(p: OnlineTrainingPipeline) -> JobDefinition:
    """``<name>_rescale``: apply the latest gpu_allocation; one at a time per pipeline (pool and run tag)."""
    allocation_key = AssetKey(p.key("gpu_allocation"))

    @op(name=rescale_op_name(p.name), pool=f"kale_rescale_{p.name}", tags={"kale/pipeline": p.name})
    def rescale_workers(context, config: RescaleConfig) -> None:
        target, reason = config.workers, config.reason
        if target is None:  # run by hand: the latest decision
            decision = latest_metadata(context.instance, allocation_key)
            if not decision:
                raise Failure(f"no gpu_allocation for {p.name!r} yet; run {p.name}_decide first")
            target, reason = int(decision["workers"]), str(decision.get("reason", ""))[:200]
        try:
            record = p.launcher_instance.rescale(target, reason=reason or "requested by hand")
        except RescaleFailed as exc:
            raise Failure(str(exc), metadata={"target_workers": target, "restored_workers": exc.restored or 0}) from exc
        except RuntimeError as exc:  # the launcher cannot be reached or refused
            raise Failure(
                f"rescale to {target} workers through {p.launcher.describe()} failed: {exc}",
                metadata={"target_workers": target},
            ) from exc
        if record is None:
            context.log.info(f"already running {target} workers; nothing to do")
        elif record.to_workers != target:
            context.log.info(f"retargeted while under way: {record.reason}")
        context.log_event(rescale_observation(allocation_key, record.to_workers if record else target, record))

    # In process: a rescale is one op, and a step subprocess would only delay it.
    @job(
        name=f"{p.name}_rescale",
        tags={"kale/rescale": p.name, **p.launcher.rescale_run_tags},
        executor_def=in_process_executor,
        description="Restart the workers at the decided allocation.",
    )
    def rescale():
        rescale_workers()

    return rescale


def rescale_observation(allocation_key: AssetKey, workers: int, record: RescaleRecord | None) -> AssetObservation:
    meta = {"workers": workers, "changed": record is not None}
    if record is not None:
        meta.update(
            {"from_workers": record.from_workers, "downtime_s": round(record.downtime_s, 3), "reason": record.reason}
        )
        if record.output:  # a rescale command's output, kept on the run
            meta["output"] = MetadataValue.text(record.output)
    return AssetObservation(asset_key=allocation_key, metadata=meta)
