"""Dagster assets, checks, jobs, schedules and sensors of one pipeline.

Asset graph per pipeline (keys prefixed by the pipeline name):

    stream_metrics (observed by the metrics sensor)
        -> traffic_forecast -> gpu_allocation
    throughput_model ------------^

``gpu_allocation`` is the decision: workers now, the stabilized plan, the
policy that acted and why.  The rescale itself (launcher) consumes it.
"""


import base64
import time
from typing import Optional

import numpy as np
import pandas as pd
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetSpec,
    Definitions,
    MetadataValue,
    Output,
    ScheduleDefinition,
    asset,
    asset_check,
    define_asset_job,
)

from .forecast import make_forecaster
from .forecast.base import Forecast
from .forecast.evaluate import smape
from .forecast.naive import DAY_S, WEEK_S
from .pipeline import OnlineTrainingPipeline
from .policies import HPAPolicy, KaleConfig, KalePolicy, StaticPolicy
from .policy import Observation
from .throughput import ThroughputModel

#: Stream metrics older than this are not "current" for a decision.
STALE_METRICS_S = 600.0


def _png_markdown(fig_path) -> MetadataValue:
    data = base64.b64encode(open(fig_path, "rb").read()).decode()
    return MetadataValue.md(f"![plot](data:image/png;base64,{data})")


def _latest_metadata(instance, key: AssetKey) -> dict:
    """Metadata of the asset's latest materialization (its last decision, its last accuracy)."""
    event = instance.get_latest_materialization_event(key)
    if event is None or event.asset_materialization is None:
        return {}
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def forecast_figures(history: pd.DataFrame, fc: Forecast, step_s: float) -> dict:
    """Held-out accuracy of the model and of the seasonal-naive baseline on the same last day."""
    out = {}
    model = getattr(fc, "extras", {}).get("holdout_smape")
    if model is not None:
        out["holdout_smape"] = model
    rate = history["rate"].to_numpy(dtype=float)
    season = int(round((WEEK_S if len(rate) * step_s >= 2 * WEEK_S else DAY_S) / step_s))
    day = int(DAY_S // step_s)
    if len(rate) > season + day:
        tail = np.arange(len(rate) - day, len(rate))
        ok = np.isfinite(rate[tail]) & np.isfinite(rate[tail - season])
        out["baseline_smape"] = smape(rate[tail][ok], rate[tail - season][ok])
    return out


def build_pipeline_definitions(p: OnlineTrainingPipeline) -> Definitions:
    from sensors import build_stream_metrics_sensor

    stream_key = f"kale_stream_{p.name}"
    metrics_key = AssetKey(p.key("stream_metrics"))
    forecast_key = AssetKey(p.key("traffic_forecast"))
    model_key = AssetKey(p.key("throughput_model"))
    allocation_key = AssetKey(p.key("gpu_allocation"))
    backtest_key = AssetKey(p.key("policy_backtest"))
    group = p.name

    stream_metrics = AssetSpec(
        metrics_key,
        description="Kafka lag, arrival and consumption rates and time lag of the trainer's group, observed each minute by the metrics sensor.",
        group_name=group,
        kinds={"kafka"},
    )

    @asset(key=forecast_key, deps=[metrics_key], group_name=group, kinds={"prophet"} if p.forecaster.startswith("prophet") else None,
           description=f"Forecast of sample arrivals over the next {p.forecast_horizon_minutes:g} min ({p.forecaster}).")
    def traffic_forecast(context: AssetExecutionContext) -> Output:
        from .plots import plot_forecast

        history = p.history().arrival_history(p.name)
        if len(history) < 2:
            raise RuntimeError(f"no arrival-rate history for pipeline {p.name!r} yet: is the {p.name}_stream_metrics sensor running?")
        started = time.perf_counter()
        model = make_forecaster(p.forecaster, horizon_s=p.forecast_horizon_minutes * 60).fit(history)
        step_s = getattr(model, "step_s", 60.0)
        fc = model.predict(max(1, int(round(p.forecast_horizon_minutes * 60 / step_s))))
        if hasattr(model, "holdout_smape") and not fc.fallback:
            fc.extras["holdout_smape"] = model.holdout_smape
        fit_s = time.perf_counter() - started
        figures = forecast_figures(model.history if hasattr(model, "history") else history, fc, step_s)
        png = plot_forecast(history, fc.to_frame(), f"{context.instance.storage_directory()}/kale/{p.name}_forecast.png", title=f"{p.name}: traffic forecast ({fc.model})")
        metadata = {
            "model": fc.model,
            "fallback": fc.fallback or "none",
            "horizon_minutes": p.forecast_horizon_minutes,
            "fit_seconds": round(fit_s, 3),
            "history_points": len(history),
            "peak_forecast": float(fc.upper.max()),
            "plot": _png_markdown(png),
            **{k: float(v) for k, v in figures.items()},
        }
        return Output(fc, metadata=metadata)

    @asset(key=model_key, group_name=group, description="Resource-throughput model F(w) fitted by NNLS on measured worker throughput; the configured prior until enough worker counts were measured.")
    def throughput_model(context: AssetExecutionContext) -> Output:
        measured = p.history().throughput(p.name, start=time.time() - 7 * DAY_S)
        form = "sync" if p.global_batch else "async"
        need = 4 if form == "sync" else 3
        model, source = p.throughput_prior, "prior"
        if measured["workers"].nunique() >= need:
            model = ThroughputModel.fit(measured["workers"], measured["samples_per_s"], form=form, global_batch=p.global_batch)
            source = "fitted"
        metadata = {
            "source": source,
            "formula": model.describe(),
            "measurements": len(measured),
            "distinct_worker_counts": int(measured["workers"].nunique()),
            "peak_workers": model.peak_workers(p.max_workers),
            "peak_rate": float(model.predict(model.peak_workers(p.max_workers))),
        }
        if model.fit_mape is not None:
            metadata["fit_mape_pct"] = model.fit_mape
        if model.holdout_mape is not None:
            metadata["holdout_mape_pct"] = model.holdout_mape
        return Output(model, metadata=metadata)

    @asset(key=allocation_key, group_name=group, ins={"forecast": _in(forecast_key), "model": _in(model_key)},
           description="Workers to run now, the stabilized plan, the policy that acted and why.")
    def gpu_allocation(context: AssetExecutionContext, forecast: Forecast, model: ThroughputModel) -> Output:
        previous = _latest_metadata(context.instance, allocation_key)
        obs = current_observation(p, forecast, previous)
        policy = make_policy(p, model, previous)
        decision = policy.decide(obs)
        value = {
            "workers": decision.workers,
            "plan": list(decision.plan),
            "plan_step_s": decision.plan_step_s,
            "policy": decision.policy,
            "reason": decision.reason,
            "advisory": p.advisory,
            "time": obs.time,
        }
        from .plots import plot_allocation

        recent = p.history().stream(p.name, start=obs.time - 2 * DAY_S)
        plan_times = pd.to_datetime(obs.time + decision.plan_step_s * np.arange(len(decision.plan)), unit="s", utc=True)
        png = plot_allocation(recent, plan_times, list(decision.plan), p.slo_minutes,
                              f"{context.instance.storage_directory()}/kale/{p.name}_allocation.png",
                              title=f"{p.name}: {decision.workers} workers ({decision.policy})")
        metadata = {
            "workers": decision.workers,
            "previous_workers": obs.workers,
            "plot": _png_markdown(png),
            "policy": decision.policy,
            "reason": MetadataValue.text(decision.reason),
            "plan": MetadataValue.json({"step_minutes": decision.plan_step_s / 60, "workers": list(decision.plan)}),
            "time_lag_s": obs.time_lag_s,
            "arrival_rate": obs.arrival_rate,
            "advisory": p.advisory,
            "last_change_time": float(getattr(policy, "last_change_time", None) or previous.get("last_change_time") or 0.0),
        }
        return Output(value, metadata=metadata)

    @asset(key=backtest_key, group_name=group, ins={"model": _in(model_key)},
           description="What-if: Kale, HPA, KEDA and static replayed on this pipeline's own recorded arrivals (last 14 days).")
    def policy_backtest(context: AssetExecutionContext, model: ThroughputModel) -> Output:
        from .backtest import Backtest, BacktestSettings
        from .plots import plot_backtest

        history = p.history().arrival_history(p.name, start=time.time() - 14 * DAY_S)
        if len(history) < 60:
            raise RuntimeError(f"only {len(history)} recorded points for {p.name!r}; a backtest needs at least an hour of stream metrics")
        span_days = (history["timestamp"].iloc[-1] - history["timestamp"].iloc[0]).total_seconds() / DAY_S
        settings = BacktestSettings(
            peak_workers=min(model.peak_workers(p.max_workers), p.max_workers), max_workers=p.max_workers,
            min_workers=p.min_workers, restart_minutes=p.restart_minutes, slo_minutes=p.slo_minutes,
            warmup_days=min(2.0, span_days / 2), forecaster=p.forecaster, model=model, scale_trace=False,
        )
        bt = Backtest(history, settings)
        runs = {name: bt.run(getattr(bt, name)()) for name in ("kale", "hpa", "keda", "static")}
        table = backtest_table({name: r.metrics.to_json() for name, r in runs.items()})
        png = plot_backtest({name: r.timeline for name, r in runs.items()}, p.slo_minutes,
                            f"{context.instance.storage_directory()}/kale/{p.name}_backtest.png")
        value = {name: r.metrics.to_json() for name, r in runs.items()}
        return Output(value, metadata={"days_replayed": round(span_days, 2), "results": MetadataValue.md(table), "plot": _png_markdown(png)})

    @asset_check(asset=forecast_key, name="forecast_beats_seasonal_naive",
                 description="Warns when the model's held-out error is worse than repeating the same time a day/week earlier.")
    def forecast_accuracy(context) -> AssetCheckResult:
        meta = _latest_metadata(context.instance, forecast_key)
        model, base = meta.get("holdout_smape"), meta.get("baseline_smape")
        if model is None or base is None:
            return AssetCheckResult(passed=True, severity=AssetCheckSeverity.WARN, metadata={"note": "not enough history to compare yet"})
        return AssetCheckResult(passed=bool(model <= base), severity=AssetCheckSeverity.WARN, metadata={"holdout_smape": model, "baseline_smape": base})

    @asset_check(asset=allocation_key, name="lag_within_slo", description=f"Measured time lag is within the {p.slo_minutes:g}-minute SLO.")
    def lag_slo(context) -> AssetCheckResult:
        latest = p.history().stream(p.name, start=time.time() - STALE_METRICS_S)
        if latest.empty:
            return AssetCheckResult(passed=False, severity=AssetCheckSeverity.WARN, metadata={"note": "no recent stream metrics"})
        lag = float(latest["time_lag_s"].iloc[-1])
        return AssetCheckResult(passed=lag <= p.slo_minutes * 60, metadata={"time_lag_s": lag, "slo_s": p.slo_minutes * 60})

    plan_job = define_asset_job(f"{p.name}_plan", selection=[forecast_key, model_key, allocation_key], description="Refit the forecast and decide the allocation.")
    allocate_job = define_asset_job(f"{p.name}_allocate", selection=[allocation_key], tags={"kale/pipeline": p.name},
                                    description="Re-decide the allocation now (emergency lag).")
    throughput_job = define_asset_job(f"{p.name}_throughput", selection=[model_key], description="Refit the throughput model.")
    backtest_job = define_asset_job(f"{p.name}_backtest", selection=[backtest_key], description="Replay recorded traffic through every policy.")
    schedules = [
        ScheduleDefinition(name=f"{p.name}_forecast_schedule", cron_schedule=p.forecast_cron, job=plan_job, default_status=_running()),
        ScheduleDefinition(name=f"{p.name}_throughput_schedule", cron_schedule=p.throughput_cron, job=throughput_job, default_status=_running()),
    ]
    extra_jobs, extra_sensors, monitored = [], [], [plan_job, allocate_job]
    if not p.advisory:
        rescale_job = build_rescale_job(p, allocation_key)
        extra_jobs.append(rescale_job)
        monitored.append(rescale_job)
        extra_sensors.append(build_allocation_sensor(p, allocation_key, rescale_job))
    extra_sensors.append(build_failure_sensor(p, allocation_key, monitored))
    metrics_sensor = build_stream_metrics_sensor(
        name=f"{p.name}_stream_metrics",
        pipeline=p.name,
        history=p.history,
        stream_resource_key=stream_key,
        asset_key=metrics_key,
        minimum_interval_seconds=p.metrics_interval_seconds,
        emergency_lag_s=p.emergency_lag_s,
        emergency_job=allocate_job,
    )
    return Definitions(
        assets=[stream_metrics, traffic_forecast, throughput_model, gpu_allocation, policy_backtest],
        asset_checks=[forecast_accuracy, lag_slo],
        jobs=[plan_job, allocate_job, throughput_job, backtest_job, *extra_jobs],
        schedules=schedules,
        sensors=[metrics_sensor, *extra_sensors],
        resources={stream_key: p.source.resource()},
    )


def make_launcher(p: OnlineTrainingPipeline):
    """The launcher that runs this pipeline's workers: Kubernetes, or the local trainer service."""
    if p.kubernetes is not None:
        from .launchers.kubernetes import KubernetesLauncher

        return KubernetesLauncher(p.name, p.kubernetes)
    from .launchers.service import LocalTrainerClient

    return LocalTrainerClient(p.local_trainer_url)


def build_rescale_job(p: OnlineTrainingPipeline, allocation_key: AssetKey):
    """``<name>_rescale``: apply the latest gpu_allocation; one at a time per pipeline (pool and run tag)."""
    from dagster import Failure, job, op

    from .launchers.kubernetes import RescaleFailed

    @op(name=f"{p.name}_rescale_workers", pool=f"kale_rescale_{p.name}", tags={"kale/pipeline": p.name})
    def rescale_workers(context) -> None:
        decision = _latest_metadata(context.instance, allocation_key)
        if not decision:
            raise Failure(f"no gpu_allocation for {p.name!r} yet; run {p.name}_plan first")
        target = int(decision["workers"])
        launcher = make_launcher(p)
        try:
            record = launcher.rescale(target, reason=str(decision.get("reason", ""))[:200])
        except RescaleFailed as exc:
            raise Failure(str(exc), metadata={"target_workers": target, "restored_workers": exc.restored or 0}) from exc
        except RuntimeError as exc:  # the local trainer service is unreachable or refused
            raise Failure(str(exc), metadata={"target_workers": target}) from exc
        if record is None:
            context.log.info(f"already running {target} workers; nothing to do")
            context.log_event(_observation(p, target, None))
            return
        context.log_event(_observation(p, target, record))

    @job(name=f"{p.name}_rescale", tags={"kale/rescale": p.name}, description="Restart the workers at the latest gpu_allocation.")
    def rescale():
        rescale_workers()

    return rescale


def _observation(p: OnlineTrainingPipeline, workers: int, record):
    from dagster import AssetObservation

    meta = {"workers": workers, "changed": record is not None}
    if record is not None:
        meta.update({"from_workers": record.from_workers, "downtime_s": round(record.downtime_s, 3), "reason": record.reason})
    return AssetObservation(asset_key=AssetKey(p.key("gpu_allocation")), metadata=meta)


def build_allocation_sensor(p: OnlineTrainingPipeline, allocation_key: AssetKey, rescale_job):
    """Requests a rescale run when a new gpu_allocation differs from the last applied one."""
    from dagster import RunRequest, SkipReason, sensor

    @sensor(name=f"{p.name}_allocation_changed", job=rescale_job, minimum_interval_seconds=30, default_status=_sensor_running())
    def allocation_changed(context):
        records = context.instance.fetch_materializations(allocation_key, limit=1).records
        if not records:
            return SkipReason("no allocation decided yet")
        latest = records[0]
        workers = int(latest.asset_materialization.metadata["workers"].value)
        if context.cursor == str(workers):
            return SkipReason(f"allocation unchanged at {workers} workers")
        context.update_cursor(str(workers))
        return RunRequest(run_key=f"{p.name}-rescale-{latest.storage_id}", tags={"kale/target_workers": str(workers)})

    return allocation_changed


def build_failure_sensor(p: OnlineTrainingPipeline, allocation_key: AssetKey, jobs: list):
    """Failed plan, allocate or rescale runs show up on gpu_allocation, where operators look."""
    from dagster import AssetObservation, RunFailureSensorContext, run_failure_sensor

    @run_failure_sensor(name=f"{p.name}_run_failure", monitored_jobs=jobs, default_status=_sensor_running(),
                        description=f"Records failed Kale runs of pipeline {p.name!r} on its gpu_allocation asset.")
    def run_failure(context: RunFailureSensorContext):
        message = context.failure_event.message or "run failed"
        context.instance.report_runless_asset_event(
            AssetObservation(allocation_key, metadata={"failed_run": context.dagster_run.run_id, "failed_job": context.dagster_run.job_name, "failure": message[:1000]})
        )

    return run_failure


def _sensor_running():
    from dagster import DefaultSensorStatus

    return DefaultSensorStatus.RUNNING


def backtest_table(results: dict) -> str:
    """The paper's metrics per policy as a Markdown table."""
    head = "| policy | acc. lag (min) | SLO violation | downtime (min) | GPU h | rescales | max lag (min) |\n|---|---|---|---|---|---|---|\n"
    rows = "".join(
        f"| {name} | {m['accumulated_lag_minutes']:,.0f} | {m['slo_violation_rate']:.2%} | {m['downtime_minutes']:,.0f} | "
        f"{m['gpu_hours']:,.1f} | {m['rescales']} | {m['max_lag_minutes']:.1f} |\n"
        for name, m in results.items()
    )
    return head + rows


def _in(key: AssetKey):
    from dagster import AssetIn

    return AssetIn(key=key)


def _running():
    from dagster import DefaultScheduleStatus

    return DefaultScheduleStatus.RUNNING


def current_observation(p: OnlineTrainingPipeline, forecast: Optional[Forecast], previous: dict) -> Observation:
    """The policy's view now: latest stream metrics, current workers, the forecast."""
    now = time.time()
    latest = p.history().stream(p.name, start=now - STALE_METRICS_S)
    workers = int(previous.get("workers") or p.min_workers)
    if latest.empty:
        raise RuntimeError(f"no stream metrics for {p.name!r} in the last {STALE_METRICS_S / 60:.0f} min; is the {p.name}_stream_metrics sensor running?")
    row = latest.iloc[-1]
    rate = float(latest["arrival_rate"].dropna().iloc[-5:].mean()) if latest["arrival_rate"].notna().any() else 0.0
    consumption = float(latest["consumption_rate"].dropna().iloc[-5:].mean()) if latest["consumption_rate"].notna().any() else 0.0
    capacity = float(p.throughput_prior.predict(workers))
    backlog = float(row["sample_lag"] or 0)
    utilization = 1.0 if backlog > 0 and consumption >= 0.95 * capacity else min(consumption / capacity, 1.0) if capacity else 0.0
    return Observation(
        time=now, workers=workers, arrival_rate=rate, consumption_rate=consumption, backlog=backlog,
        time_lag_s=float(row["time_lag_s"] or 0.0), utilization=utilization, forecast=forecast,
    )


def make_policy(p: OnlineTrainingPipeline, model: ThroughputModel, previous: dict):
    if p.policy == "hpa":
        return HPAPolicy(min_replicas=p.min_workers, max_replicas=p.max_workers)
    if p.policy == "static":
        return StaticPolicy(p.max_workers)
    cfg = KaleConfig(min_workers=p.min_workers, max_workers=p.max_workers, slo_s=p.slo_minutes * 60, restart_s=p.restart_minutes * 60)
    last = previous.get("last_change_time") or None
    return KalePolicy(model, cfg, last_change_time=last)
