"""A decision as Dagster carries it: the ``gpu_allocation`` metadata, the SLO check's verdict, and the rescale
run's typed config.

``PipelineControl`` (``definitions.control``) decides; this module is what it writes and what the jobs, the
checks and ``kale status`` read back.  The decision's journey to a launcher is three steps: the controller's
``ControlStep.rescale_to`` (an int), the rescale run's ``RescaleConfig`` (the same int, typed, with its reason and
time), and the launcher's ``rescale(workers)``.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from dagster import AssetCheckSeverity, AssetKey, Config, MetadataValue, RunConfig
from pydantic import Field

from kale_dagster.control.controller import ControlStep
from kale_dagster.definitions.pipeline import OnlineTrainingPipeline
from kale_dagster.forecast.base import Forecast
from kale_dagster.launchers.base import LauncherStatus
from kale_dagster.model.types import Observation

#: A decision's metadata key for the larger group the rescale under way was asked to form instead.
RETARGET_KEY = "retarget_to"
LAG_CHECK = "lag_within_slo"
#: A decision's action when it applies nothing (as the decision's metadata says it).
NO_ACTION, ADVISED = "none", "advisory: nothing applied"


def lag_within_slo(time_lag_s: float, slo_s: float, complete: bool = True) -> tuple[bool, AssetCheckSeverity, dict]:
    """The ``lag_within_slo`` check's verdict on one reading: passed, severity, metadata.  A time lag that some
    partition could not tell (``complete`` False) is a lower bound: its pass is only a warning."""
    passed = time_lag_s <= slo_s
    severity = AssetCheckSeverity.ERROR if complete or not passed else AssetCheckSeverity.WARN
    metadata = {"time_lag_s": round(float(time_lag_s), 3), "slo_s": float(slo_s), "time_lag_complete": complete}
    return passed, severity, metadata


class RescaleConfig(Config):
    """A ``<pipeline>_rescale`` run's config: the decision it applies, as the sensor requested it."""

    workers: int | None = Field(
        default=None, ge=0, description="the workers to run; none: the latest gpu_allocation's (a run by hand)"
    )
    reason: str = Field(default="", description="why, as the decision said")
    decided_at: float | None = Field(default=None, description="the decision's wall time (seconds since the epoch)")

    @classmethod
    def of(cls, run_config: Mapping | None) -> "RescaleConfig":
        """The config in a rescale run's run config (a run's, or a run request's)."""
        ops = dict(run_config or {}).get("ops")
        ops = ops if isinstance(ops, dict) else {}
        return cls(**next(((c or {}).get("config") or {} for c in ops.values()), {}))

    def as_run_config(self, pipeline: str) -> RunConfig:
        return RunConfig(ops={rescale_op_name(pipeline): self})


def rescale_op_name(pipeline: str) -> str:
    return f"{pipeline}_rescale_workers"


def latest_metadata(instance, key: AssetKey) -> dict:
    """Metadata values of the asset's latest materialization ({} when there is none)."""
    event = instance.get_latest_materialization_event(key)
    if event is None or event.asset_materialization is None:
        return {}
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


@dataclass(frozen=True)
class ControlDecision:
    """One decision and what it was made from, typed: what the sensor, the asset and the metadata read."""

    step: ControlStep
    time: float
    status: LauncherStatus | None
    running_workers: int  # as the launcher reported, else as last known
    model_source: str
    forecast: Forecast | None
    forecast_error: float | None
    action: str
    stale_run: str = ""  # a rescale run whose process was gone, marked failed


def what_it_says(decision: ControlDecision, passed: bool) -> str:
    """What an operator acts on in a decision, to tell whether it changed: the workers wanted and running, the
    action, the policy, whether it held, and the lag check's verdict.  A wait after failed rescales counts down
    its seconds and a hold's reason may vary in its figures: neither is a change."""
    step = decision.step
    if step.rescale_to is not None:
        action = "rescale"
    elif decision.action in (NO_ACTION, ADVISED):
        action = decision.action
    else:
        action = "waiting"
    fields = (step.decision.workers, decision.running_workers, action, step.decision.policy, passed, bool(step.held))
    return "|".join(map(str, fields))


def allocation_metadata(p: OnlineTrainingPipeline, decision: ControlDecision) -> dict:
    """The ``gpu_allocation`` materialization's metadata: the decision, its reason, and what it saw."""
    step, status, forecast = decision.step, decision.status, decision.forecast
    metadata = {
        "workers": step.decision.workers,
        "running_workers": decision.running_workers,
        "policy": step.decision.policy,
        "reason": MetadataValue.text(step.decision.reason),
        "action": decision.action,
        "plan": MetadataValue.json(
            {"step_minutes": step.decision.plan_step_s / 60, "workers": list(step.decision.plan)}
        ),
        "policy_state": MetadataValue.json(step.policy_state),
        "restart_s": round(step.restart_s, 1),
        "restart_estimate": step.restart_source,
        "throughput_model": decision.model_source,
        "forecast": "none"
        if forecast is None
        else forecast.model + (f" (fallback: {forecast.fallback})" if forecast.fallback else ""),
        "time": decision.time,
        "time_scale": p.clock.time_scale,
        **({RETARGET_KEY: step.rescale_to} if step.retarget else {}),
        "advisory": p.advisory,
        "min_workers": p.limits.min_workers,
        "max_workers": p.limits.max_workers,
        "slo_minutes": p.limits.slo_minutes,
    }
    metadata.update(_what_it_saw(step.observation, forecast))
    if decision.forecast_error is not None:
        metadata["forecast_recent_smape"] = round(decision.forecast_error, 4)
    optional = {  # shown when there is something to say
        "held": step.held,
        "group_failed": status.failed if status is not None else "",
        "stale_rescale_run": decision.stale_run,
        "poison_records": status.poison_records if status is not None else 0,
        "checkpoint_error": status.checkpoint_error if status is not None else "",
    }
    metadata.update({k: v for k, v in optional.items() if v})
    if status is not None and status.observed_from:  # a group Kale watches: how its workers were counted
        metadata["workers_observed_from"] = status.observed_from
    if p.advisory:  # what Kale would have changed, had it acted
        metadata["would_change_workers_by"] = step.decision.workers - decision.running_workers
    quality = status.model_metric if status is not None else None
    if quality is not None:  # the trainer's progressive-validation metric
        metadata[f"model_{quality[0]}"] = round(quality[1], 4)
    return metadata


def _what_it_saw(obs: Observation | None, forecast: Forecast | None) -> dict:
    """The observation's figures, and the forecast's next hour (its mean arrival rate, samples/s)."""
    metadata: dict = {}
    if forecast is not None and len(forecast.point):  # the next hour's mean arrival rate, samples/s
        hour = forecast.point[: max(int(round(3600 / forecast.step_s)), 1)]
        metadata["forecast_next_hour"] = round(float(hour.mean()), 3)
    if obs is not None:
        metadata.update(
            arrival_rate=obs.arrival_rate,
            time_lag_s=obs.time_lag_s,
            backlog=obs.backlog,
            utilization=round(obs.utilization, 4),
            restarting=obs.restarting,
        )
        if obs.latest_arrival_rate is not None:
            metadata["latest_arrival_rate"] = obs.latest_arrival_rate
        if obs.forecast_ratio is not None:
            metadata["forecast_recent_ratio"] = round(obs.forecast_ratio, 4)
    return metadata
