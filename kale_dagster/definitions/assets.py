"""The assets of one pipeline, one builder each.

Asset graph per pipeline (keys prefixed by the pipeline name):

    stream_metrics (observed by the metrics sensor)
        -> traffic_forecast -> gpu_allocation
    throughput_model ------------^
    throughput_model -> policy_backtest
    stream_metrics -> savings (``definitions.savings``)

``gpu_allocation`` is the decision: workers now, the stabilized plan, the
policy that acted and why.  The metrics sensor materializes it at every
reading (``definitions.control``); materializing it by hand decides once
more, the same way.  The rescale job (``jobs``) applies it.  Times are the
pipeline's (``control.clock``).
"""

import time
from datetime import timedelta

import numpy as np
import pandas as pd
from dagster import (
    AssetExecutionContext,
    AssetIn,
    AssetKey,
    AssetsDefinition,
    AssetSpec,
    FreshnessPolicy,
    MetadataValue,
    Output,
    asset,
)

from kale_dagster.control.controller import StreamReading
from kale_dagster.control.tick import reading_from
from kale_dagster.definitions.control import PipelineControl
from kale_dagster.definitions.decision import allocation_metadata
from kale_dagster.definitions.pipeline import OnlineTrainingPipeline
from kale_dagster.forecast import make_forecaster
from kale_dagster.forecast.base import Forecast
from kale_dagster.forecast.evaluate import realised_error, smape
from kale_dagster.forecast.history import infer_step_s, prepare_history
from kale_dagster.forecast.naive import DAY_S, WEEK_S
from kale_dagster.launchers.kubernetes import KubernetesLauncherConfig
from kale_dagster.model.throughput import FIT_WINDOW_S, ThroughputModel, estimate_throughput
from kale_dagster.policies import POLICIES

#: Stream metrics older than this (pipeline seconds) are not "current" for a decision.
STALE_METRICS_S = 600.0


def plot_dir(instance) -> str:
    """Where a pipeline's plots are kept: beside the instance's storage, one folder per pipeline."""
    return f"{instance.storage_directory()}/kale/plots"


def plot_path(context: AssetExecutionContext, p: OnlineTrainingPipeline, what: str):
    from kale_dagster.definitions.plots import plot_file

    return plot_file(plot_dir(context.instance), p.name, what, time.time())


def readings_freshness(p: OnlineTrainingPipeline) -> FreshnessPolicy:
    """Stale when the metrics sensor stops reading (the sensor or the daemon stopped, the code server is down).
    Readings reach the event log at least every ``record_every_minutes``: a warning when 5 more readings are
    missing past that, a failure after 15, never sooner than 5 and 15 wall minutes past it (a daemon's tick may
    slip by a minute)."""
    interval, every = p.sensor_interval_s, p.clock.wall_duration(p.record_every_minutes * 60)
    return FreshnessPolicy.time_window(
        warn_window=timedelta(seconds=every + max(5 * interval, 300)),
        fail_window=timedelta(seconds=every + max(15 * interval, 900)),
    )


def stream_metrics_spec(p: OnlineTrainingPipeline) -> AssetSpec:
    return AssetSpec(
        AssetKey(p.key("stream_metrics")),
        description="Kafka lag, arrival and consumption rates and time lag of the trainer's group, observed each "
        "minute "
        "by the metrics sensor.",
        group_name=p.name,
        kinds={"kafka"},
        freshness_policy=readings_freshness(p),
    )


def forecast_figures(history: pd.DataFrame, fc: Forecast, step_s: float) -> dict:
    """Held-out accuracy of the model and of the seasonal-naive baseline on the same last day."""
    out = {}
    model = fc.extras.get("holdout_smape")
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


def traffic_forecast_asset(p: OnlineTrainingPipeline) -> AssetsDefinition:
    @asset(
        key=p.key("traffic_forecast"),
        deps=[AssetKey(p.key("stream_metrics"))],
        group_name=p.name,
        kinds={"prophet"} if p.forecaster.startswith("prophet") else {"python"},
        description=f"Forecast of sample arrivals over the next {p.forecast_horizon_minutes:g} min ({p.forecaster}).",
    )
    def traffic_forecast(context: AssetExecutionContext) -> Output:
        from kale_dagster.definitions.plots import plot_forecast, plot_metadata

        store = p.history()
        recorded = store.stream(p.name)
        history = store.arrival_history(p.name)
        if len(history) < 2:
            raise RuntimeError(
                f"no arrival-rate history for pipeline {p.name!r} yet: is the {p.name}_stream_metrics sensor running?"
            )
        started, fitted_at = time.perf_counter(), p.clock.now()
        clean = prepare_history(history)
        step_s = infer_step_s(clean["timestamp"])
        steps = max(1, int(round(p.forecast_horizon_s / step_s)))
        # How the previous fit's forecast fared against what then arrived (the check reads these).
        previous = store.latest_forecaster(p.name)
        realised = (
            realised_error(previous[1]["model"].predict(previous[1]["steps"]), clean) if previous is not None else None
        )
        model = make_forecaster(p.forecaster, horizon_s=p.forecast_horizon_s).fit(clean)
        fc = model.predict(steps)
        # The controller re-anchors this fit on fresh metrics at every reading until the next refit.
        store.save_forecaster(p.name, fitted_at, {"model": model, "steps": steps})
        holdout = getattr(model, "holdout_smape", None)
        if holdout is not None and not fc.fallback:
            fc.extras["holdout_smape"] = holdout
        fit_s = time.perf_counter() - started
        figures = forecast_figures(clean, fc, step_s)
        png = plot_forecast(
            history, fc.to_frame(), plot_path(context, p, "forecast"), title=f"{p.name}: traffic forecast ({fc.model})"
        )
        metadata = {
            "model": fc.model,
            "fallback": fc.fallback or "none",
            "fitted_at": fitted_at,
            "horizon_minutes": p.forecast_horizon_minutes,
            "fit_seconds": round(fit_s, 3),
            "history_points": len(history),
            "seeded_points": int(recorded["seeded"].fillna(False).astype(bool).sum()),
            "peak_forecast": float(fc.upper.max()),
            "plot": plot_metadata(png),
            **{k: float(v) for k, v in figures.items()},
            **(realised or {}),
        }
        return Output(fc, metadata=metadata)

    return traffic_forecast


def throughput_model_asset(p: OnlineTrainingPipeline) -> AssetsDefinition:
    @asset(
        key=p.key("throughput_model"),
        group_name=p.name,
        kinds={"scipy"},
        description="Resource-throughput model F(w) fitted by NNLS on measured worker throughput; the configured prior "
        "until enough worker counts were measured.",
    )
    def throughput_model(context: AssetExecutionContext) -> Output:
        measured = p.history().throughput(p.name, start=p.clock.now() - FIT_WINDOW_S)
        model, source = estimate_throughput(
            measured["workers"],
            measured["samples_per_s"],
            p.throughput_prior,
            form="sync" if p.global_batch else "async",
            global_batch=p.global_batch,
        )
        metadata = {
            "source": source,
            "model": MetadataValue.json(model.to_dict()),
            "formula": model.describe(),
            "measurements": len(measured),
            "distinct_worker_counts": int(measured["workers"].nunique()),
            "peak_workers": model.peak_workers(p.limits.max_workers),
            "peak_rate": float(model.predict(model.peak_workers(p.limits.max_workers))),
        }
        if model.fit_mape is not None:
            metadata["fit_mape_pct"] = model.fit_mape
        if model.holdout_mape is not None:
            metadata["holdout_mape_pct"] = model.holdout_mape
        return Output(model, metadata=metadata)

    return throughput_model


def gpu_allocation_asset(p: OnlineTrainingPipeline, control: PipelineControl) -> AssetsDefinition:
    @asset(
        key=p.key("gpu_allocation"),
        group_name=p.name,
        kinds={"pytorch", *(["kubernetes"] if isinstance(p.launcher, KubernetesLauncherConfig) else [])},
        freshness_policy=readings_freshness(p),
        deps=[AssetKey(p.key(k)) for k in ("stream_metrics", "traffic_forecast", "throughput_model")],
        description="Workers to run now, the stabilized plan, the policy that acted and why. "
        "The metrics sensor decides at every reading and records here each decision that changes something, and one "
        "every record_every_minutes (all are in the metrics history); materializing it decides once more.",
    )
    def gpu_allocation(context: AssetExecutionContext) -> Output:
        decision = control.decide(context.instance, latest_reading(p, control.rate_window_s))
        control.record(decision)
        d = decision.step.decision
        value = {
            "workers": d.workers,
            "plan": list(d.plan),
            "plan_step_s": d.plan_step_s,
            "policy": d.policy,
            "reason": d.reason,
            "advisory": p.advisory,
            "time": decision.time,
        }
        metadata = allocation_metadata(p, decision)
        metadata["plot"] = control.plot(decision.step, decision.time, plot_dir(context.instance))
        return Output(value, metadata=metadata)

    return gpu_allocation


def latest_reading(p: OnlineTrainingPipeline, rate_window_s: float) -> StreamReading:
    """The latest recorded stream metrics as a reading (what the last sensor tick saw)."""
    now = p.clock.now()
    recorded = p.history().stream(p.name, start=now - max(STALE_METRICS_S, rate_window_s))
    if recorded.empty:
        raise RuntimeError(
            f"no stream metrics for {p.name!r} in the last {STALE_METRICS_S / 60:.0f} min; is the "
            f"{p.name}_stream_metrics sensor running?"
        )
    return reading_from(recorded, rate_window_s)


def policy_backtest_asset(p: OnlineTrainingPipeline) -> AssetsDefinition:
    @asset(
        key=p.key("policy_backtest"),
        group_name=p.name,
        kinds={"pandas"},
        ins={"model": AssetIn(key=AssetKey(p.key("throughput_model")))},
        description="What-if: every registered policy replayed on this pipeline's own recorded arrivals (last 14 "
        "days).",
    )
    def policy_backtest(context: AssetExecutionContext, model: ThroughputModel) -> Output:
        from kale_dagster.definitions.plots import plot_backtest, plot_metadata
        from kale_dagster.sim.backtest import Backtest, BacktestSettings, Run

        history = p.history().arrival_history(p.name, start=p.clock.now() - 14 * DAY_S)
        if len(history) < 60:
            raise RuntimeError(
                f"only {len(history)} recorded points for {p.name!r}; a backtest needs at least an hour of stream "
                "metrics"
            )
        span_days = (history["timestamp"].iloc[-1] - history["timestamp"].iloc[0]).total_seconds() / DAY_S
        settings = BacktestSettings(
            limits=p.limits,
            peak_workers=min(model.peak_workers(p.limits.max_workers), p.limits.max_workers),
            warmup_days=min(2.0, span_days / 2),
            forecaster=p.forecaster,
            model=model,
            scale_trace=False,
            retargets=p.launcher_instance.supports_retarget,
        )
        bt = Backtest(history, settings)
        names = list(dict.fromkeys([*POLICIES.compared(), p.policy]))  # and the pipeline's own, a variant of Kale's
        runs = dict(zip(names, bt.run_many([Run(name) for name in names])[0]))
        value = {name: r.metrics.to_json() for name, r in runs.items()}
        png = plot_backtest(
            {name: r.timeline for name, r in runs.items()}, p.limits.slo_minutes, plot_path(context, p, "backtest")
        )
        return Output(
            value,
            metadata={
                "days_replayed": round(span_days, 2),
                "results": MetadataValue.md(backtest_table(value)),
                "plot": plot_metadata(png),
            },
        )

    return policy_backtest


def backtest_table(results: dict) -> str:
    """The paper's metrics per policy as a Markdown table."""
    head = (
        "| policy | acc. lag (min) | SLO violation | downtime (min) | GPU h | rescales | max lag (min) |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    rows = "".join(
        f"| {name} | {m['accumulated_lag_minutes']:,.0f} | {m['slo_violation_rate']:.2%} | "
        f"{m['downtime_minutes']:,.0f} "
        "| "
        f"{m['gpu_hours']:,.1f} | {m['rescales']} | {m['max_lag_minutes']:.1f} |\n"
        for name, m in results.items()
    )
    return head + rows


def pipeline_assets(p: OnlineTrainingPipeline, control: PipelineControl) -> list:
    return [
        stream_metrics_spec(p),
        traffic_forecast_asset(p),
        throughput_model_asset(p),
        gpu_allocation_asset(p, control),
        policy_backtest_asset(p),
    ]
