"""Jobs and the schedule of one pipeline, and the rescale job that applies a decision.

* ``<name>_refit``: refit the forecaster and the throughput model (the
  metrics sensor requests it at the pipeline's refit cadence);
* ``<name>_decide``: decide once more from the latest metrics, by hand;
* ``<name>_backtest``: replay recorded traffic through every policy (daily);
* ``<name>_backfill``: rebuild the arrival history from the records Kafka
  retains, so the forecaster starts warm (``definitions.backfill``);
* ``<name>_rescale``: apply a decision through the launcher the pipeline
  declares: the target its run was requested with (tag
  ``kale/target_workers``), or the latest ``gpu_allocation`` when run by
  hand; one run at a time per pipeline (an op pool and a run tag the queued
  run coordinator can limit).  What happened (downtime, or nothing to do) is
  an observation of ``gpu_allocation``.  While it runs, it passes a retarget
  decided meanwhile (a burst met by its restart) to the launcher
  (``RetargetWatch``): the restart forms the larger group instead.
"""

from __future__ import annotations

import threading
import time
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

from kale_dagster.definitions.control import RETARGET_KEY, TARGET_TAG, latest_metadata
from kale_dagster.definitions.pipeline import OnlineTrainingPipeline
from kale_dagster.launchers.base import RescaleFailed, RescaleRecord

if TYPE_CHECKING:  # what define_asset_job returns; Dagster does not export the type
    from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition


def asset_jobs(p: OnlineTrainingPipeline) -> dict[str, JobDefinition | UnresolvedAssetJobDefinition]:
    """refit, decide and backtest, keyed by role."""
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
    }


def schedules(
    p: OnlineTrainingPipeline, jobs: dict[str, JobDefinition | UnresolvedAssetJobDefinition]
) -> list[ScheduleDefinition]:
    status = DefaultScheduleStatus.RUNNING if p.autostart else DefaultScheduleStatus.STOPPED
    return [
        ScheduleDefinition(
            name=f"{p.name}_backtest_schedule",
            cron_schedule=p.backtest_cron,
            job=jobs["backtest"],
            default_status=status,
        )
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

    @op(name=f"{p.name}_rescale_workers", pool=f"kale_rescale_{p.name}", tags={"kale/pipeline": p.name})
    def rescale_workers(context) -> None:
        decision = latest_metadata(context.instance, allocation_key)
        requested = context.run.tags.get(TARGET_TAG)
        if requested is None and not decision:
            raise Failure(f"no gpu_allocation for {p.name!r} yet; run {p.name}_decide first")
        target = int(requested if requested is not None else decision["workers"])
        launcher = p.launcher.build(p.name, p.source, p.trainer_spec)
        watch = RetargetWatch(context.instance, allocation_key, launcher, target, context.log.info)
        if p.launcher.retargets:
            watch.start()
        try:
            record = launcher.rescale(target, reason=str(decision.get("reason", "requested by hand"))[:200])
        except RescaleFailed as exc:
            raise Failure(str(exc), metadata={"target_workers": target, "restored_workers": exc.restored or 0}) from exc
        except RuntimeError as exc:  # the launcher cannot be reached or refused
            raise Failure(
                f"rescale to {target} workers through {p.launcher.describe()} failed: {exc}",
                metadata={"target_workers": target},
            ) from exc
        finally:
            watch.stop()
        if record is None:
            context.log.info(f"already running {target} workers; nothing to do")
        elif record.to_workers != target:
            context.log.info(f"retargeted while under way: {record.reason}")
        context.log_event(rescale_observation(allocation_key, record.to_workers if record else target, record))

    # In process: a rescale is one op, and a step subprocess would only delay it.
    @job(
        name=f"{p.name}_rescale",
        tags={"kale/rescale": p.name},
        executor_def=in_process_executor,
        description="Restart the workers at the decided allocation.",
    )
    def rescale():
        rescale_workers()

    return rescale


class RetargetWatch(threading.Thread):
    """Passes a retarget decided while a rescale runs to its launcher.

    A burst that meets a restart is a decision like any other (``gpu_allocation``, metadata ``retarget_to``),
    made by the sensor while the rescale run waits on the launcher; the run that owns the restart is the one
    place that can redirect it (a Kubernetes launcher's restart lives in this process).  Every ``poll_s`` the
    latest decision is read; one made since the run started that asks for more than the restart aims at is passed
    on, and passed again until the launcher takes it or the restart ends."""

    def __init__(self, instance, key: AssetKey, launcher, target: int, log, poll_s: float = 1.0):
        super().__init__(daemon=True, name="kale-retarget-watch")
        self.instance, self.key, self.launcher = instance, key, launcher
        self.aim, self.log, self.poll_s = target, log, poll_s
        self.since = time.time()
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.poll_s):
            meta = latest_metadata(self.instance, self.key, since=self.since)
            wanted = meta.get(RETARGET_KEY)
            if not isinstance(wanted, int) or wanted <= self.aim:
                continue
            try:
                taken = self.launcher.retarget(wanted, reason=str(meta.get("reason", "retarget"))[:200])
            except RuntimeError as exc:  # the launcher cannot be reached: the restart runs on as it was asked
                self.log(f"retarget to {wanted} workers failed: {exc}"[:500])
                continue
            if taken:
                self.aim = wanted
                self.log(f"the restart under way now forms {wanted} workers: {meta.get('reason', '')}"[:500])

    def stop(self) -> None:
        self._done.set()
        if self.is_alive():
            self.join(timeout=self.poll_s + 30)


def rescale_observation(allocation_key: AssetKey, workers: int, record: RescaleRecord | None) -> AssetObservation:
    meta = {"workers": workers, "changed": record is not None}
    if record is not None:
        meta.update(
            {"from_workers": record.from_workers, "downtime_s": round(record.downtime_s, 3), "reason": record.reason}
        )
        if record.output:  # a rescale command's output, kept on the run
            meta["output"] = MetadataValue.text(record.output)
    return AssetObservation(asset_key=allocation_key, metadata=meta)
