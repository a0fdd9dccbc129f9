"""Jobs and schedules of one pipeline, and the rescale job that applies a decision.

``<name>_rescale`` applies the latest ``gpu_allocation`` through the
launcher the pipeline declares, one run at a time per pipeline (an op pool
and a run tag the queued run coordinator can limit), and records what
happened (downtime, or nothing to do) as an observation of
``gpu_allocation``.
"""


from dagster import (
    AssetKey,
    AssetObservation,
    DefaultScheduleStatus,
    Failure,
    JobDefinition,
    ScheduleDefinition,
    define_asset_job,
    job,
    op,
)

from kale_dagster.definitions.assets import latest_metadata
from kale_dagster.definitions.pipeline import OnlineTrainingPipeline
from kale_dagster.launchers.base import RescaleFailed, RescaleRecord


def asset_jobs(p: OnlineTrainingPipeline) -> dict[str, JobDefinition]:
    """plan, allocate, throughput and backtest, keyed by role."""
    forecast, model, allocation = (AssetKey(p.key(a)) for a in ("traffic_forecast", "throughput_model", "gpu_allocation"))
    return {
        "plan": define_asset_job(f"{p.name}_plan", selection=[forecast, model, allocation], description="Refit the forecast and decide the allocation."),
        "allocate": define_asset_job(f"{p.name}_allocate", selection=[allocation], tags={"kale/pipeline": p.name},
                                     description="Re-decide the allocation now (emergency lag)."),
        "throughput": define_asset_job(f"{p.name}_throughput", selection=[model], description="Refit the throughput model."),
        "backtest": define_asset_job(f"{p.name}_backtest", selection=[AssetKey(p.key("policy_backtest"))], description="Replay recorded traffic through every policy."),
    }


def schedules(p: OnlineTrainingPipeline, jobs: dict[str, JobDefinition]) -> list[ScheduleDefinition]:
    running = DefaultScheduleStatus.RUNNING
    return [
        ScheduleDefinition(name=f"{p.name}_forecast_schedule", cron_schedule=p.forecast_cron, job=jobs["plan"], default_status=running),
        ScheduleDefinition(name=f"{p.name}_throughput_schedule", cron_schedule=p.throughput_cron, job=jobs["throughput"], default_status=running),
    ]


def rescale_job(p: OnlineTrainingPipeline) -> JobDefinition:
    """``<name>_rescale``: apply the latest gpu_allocation; one at a time per pipeline (pool and run tag)."""
    allocation_key = AssetKey(p.key("gpu_allocation"))

    @op(name=f"{p.name}_rescale_workers", pool=f"kale_rescale_{p.name}", tags={"kale/pipeline": p.name})
    def rescale_workers(context) -> None:
        decision = latest_metadata(context.instance, allocation_key)
        if not decision:
            raise Failure(f"no gpu_allocation for {p.name!r} yet; run {p.name}_plan first")
        target = int(decision["workers"])
        launcher = p.launcher.build(p.name, p.source)
        try:
            record = launcher.rescale(target, reason=str(decision.get("reason", ""))[:200])
        except RescaleFailed as exc:
            raise Failure(str(exc), metadata={"target_workers": target, "restored_workers": exc.restored or 0}) from exc
        except RuntimeError as exc:  # the launcher cannot be reached or refused
            raise Failure(f"rescale to {target} workers through {p.launcher.describe()} failed: {exc}", metadata={"target_workers": target}) from exc
        if record is None:
            context.log.info(f"already running {target} workers; nothing to do")
        context.log_event(rescale_observation(allocation_key, target, record))

    @job(name=f"{p.name}_rescale", tags={"kale/rescale": p.name}, description="Restart the workers at the latest gpu_allocation.")
    def rescale():
        rescale_workers()

    return rescale


def rescale_observation(allocation_key: AssetKey, workers: int, record: "RescaleRecord | None") -> AssetObservation:
    meta = {"workers": workers, "changed": record is not None}
    if record is not None:
        meta.update({"from_workers": record.from_workers, "downtime_s": round(record.downtime_s, 3), "reason": record.reason})
    return AssetObservation(asset_key=allocation_key, metadata=meta)
