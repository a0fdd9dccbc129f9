"""Where each pipeline stands, read from the Dagster instance alone: what ``kale status`` prints and what the
Prometheus collector exports.

Everything comes from what the metrics sensor already records: its cursor, stored at every tick, carries the
latest reading's figures and the decisions counted; the latest ``gpu_allocation`` materialization, the decision
and what it planned with; then the sensor's state and the pipeline's failed runs.  No code location has to be
loaded: an operator's ``kubectl get hpa``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

#: Failed runs are counted over this window.
FAILURES_WINDOW_S = 3600.0


@dataclass(frozen=True)
class PipelineStatus:
    """One pipeline's state at its latest decision, and the health of what keeps it decided."""

    name: str
    running_workers: int | None
    desired_workers: int | None
    min_workers: int | None
    max_workers: int | None
    slo_minutes: float | None
    backlog: float | None
    time_lag_s: float | None
    arrival_rate: float | None
    forecast_next_hour: float | None
    restart_s: float | None  # the restart time the decision planned with (pipeline seconds)
    restart_source: str  # measured (the median of the group's restarts) or declared
    policy: str
    reason: str
    held: str
    advisory: bool
    decided_age_s: float | None  # wall seconds since the latest decision recorded on gpu_allocation
    recorded_at: float | None  # wall time of that decision
    read_at: float | None  # wall time of the latest reading (the sensor's last tick that decided)
    sensor_running: bool
    failed_runs_last_hour: int
    decisions: dict[str, int] = field(default_factory=dict)  # decisions so far, by ControlStep.outcome
    rescales: dict[str, int] = field(default_factory=dict)  # rescales requested so far, by outcome
    extras: dict = field(default_factory=dict)  # the trainer's metric, how workers were observed, ...

    def to_dict(self) -> dict:
        return asdict(self)


def read_status(instance, pipeline: str | None = None, now: float | None = None) -> list[PipelineStatus]:
    """Every pipeline that has decided at least once (or only ``pipeline``), by name."""
    from dagster import AssetKey
    from dagster._core.scheduler.instigation import InstigatorStatus

    now = time.time() if now is None else now
    keys = [k for k in instance.all_asset_keys() if len(k.path) == 2 and k.path[1] == "gpu_allocation"]
    names = sorted(k.path[0] for k in keys if pipeline is None or k.path[0] == pipeline)
    sensors = {s.name: s for s in instance.all_instigator_state()}
    # A sensor whose code declares it running (default_status) is stored as DECLARED_IN_CODE until toggled.
    running = (InstigatorStatus.RUNNING, InstigatorStatus.DECLARED_IN_CODE)
    running_sensors = {name for name, s in sensors.items() if s.status in running}
    out = []
    for name in names:
        event = instance.get_latest_materialization_event(AssetKey([name, "gpu_allocation"]))
        meta = (
            {k: v.value for k, v in event.asset_materialization.metadata.items()}
            if event is not None and event.asset_materialization is not None
            else {}
        )
        kept = _cursor(sensors.get(f"{name}_stream_metrics"))
        # The reading's figures from the cursor, as fresh as the last tick; the recorded decision's otherwise.
        latest = {
            **{k: meta.get(v) for k, v in _RECORDED.items()},
            **{k: v for k, v in kept.latest.items() if v is not None},
        }
        out.append(
            PipelineStatus(
                name=name,
                running_workers=_int(latest.get("running_workers")),
                desired_workers=_int(latest.get("desired_workers")),
                min_workers=_int(meta.get("min_workers")),
                max_workers=_int(meta.get("max_workers")),
                slo_minutes=_float(meta.get("slo_minutes")),
                backlog=_float(latest.get("backlog")),
                time_lag_s=_float(latest.get("time_lag_s")),
                arrival_rate=_float(latest.get("arrival_rate")),
                forecast_next_hour=_float(meta.get("forecast_next_hour")),
                restart_s=_float(meta.get("restart_s")),
                restart_source=str(meta.get("restart_estimate", "")),
                policy=str(meta.get("policy", "")),
                reason=str(meta.get("reason", "")),
                held=str(meta.get("held", "")),
                advisory=bool(meta.get("advisory", False)),
                decided_age_s=now - event.timestamp if event is not None else None,
                recorded_at=event.timestamp if event is not None else None,
                read_at=_float(latest.get("at")),
                sensor_running=f"{name}_stream_metrics" in running_sensors,
                failed_runs_last_hour=_failed_runs(instance, name, now),
                decisions=kept.decisions,
                rescales=kept.rescales,
                extras={k: v for k, v in meta.items() if k.startswith("model_") or k == "workers_observed_from"},
            )
        )
    return out


def _failed_runs(instance, pipeline: str, now: float) -> int:
    """The pipeline's runs that failed within ``FAILURES_WINDOW_S`` (at most 100 counted)."""
    from dagster import DagsterRunStatus, RunsFilter

    window = RunsFilter(
        statuses=[DagsterRunStatus.FAILURE],
        tags={"kale/pipeline": pipeline},
        updated_after=_utc(now - FAILURES_WINDOW_S),
    )
    return len(instance.get_run_records(window, limit=100))


#: The latest reading's figures as the recorded decision's metadata names them (the cursor's names first).
_RECORDED = {
    "running_workers": "running_workers",
    "desired_workers": "workers",
    "backlog": "backlog",
    "time_lag_s": "time_lag_s",
    "arrival_rate": "arrival_rate",
}


def _cursor(sensor):
    """What the sensor's cursor keeps for control (a fresh one before its first tick)."""
    from kale_dagster.control.tick import ControlCursor

    data = getattr(getattr(sensor, "instigator_data", None), "cursor", None)
    try:
        return ControlCursor.from_dict(json.loads(data).get("control")) if data else ControlCursor()
    except (ValueError, AttributeError):
        return ControlCursor()


def _utc(ts: float):
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ts, tz=timezone.utc)


def _int(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None


def _float(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _num(value: float | None, digits: int = 0) -> str:
    return "?" if value is None else f"{value:,.{digits}f}"


def format_status(statuses: list[PipelineStatus], width: int = 80, now: float | None = None) -> str:
    """Five lines per pipeline, the mode first, each at most ``width`` columns."""
    now = time.time() if now is None else now
    if not statuses:
        return "no pipeline has decided yet (is the metrics sensor running, and DAGSTER_HOME the instance's?)"
    blocks = []
    for s in statuses:
        workers = (
            f"workers {_num(s.running_workers)}"
            + (f" -> {_num(s.desired_workers)}" if s.desired_workers != s.running_workers else "")
            + f" (min {_num(s.min_workers)}, max {_num(s.max_workers)})"
        )
        mode = f"{'advisory' if s.advisory else 'live'}: {s.policy}"
        lag_min = None if s.time_lag_s is None else s.time_lag_s / 60
        over = lag_min is not None and s.slo_minutes is not None and lag_min > s.slo_minutes
        health = "sensor running" if s.sensor_running else "SENSOR STOPPED"
        failed = (
            f"{s.failed_runs_last_hour} failed runs in the last hour" if s.failed_runs_last_hour else "no failed runs"
        )
        why = s.held or s.reason
        lines = [
            f"[{mode}] {s.name}  {workers}",
            f"  lag {_num(s.backlog)} samples, {_num(lag_min, 1)} min of {_num(s.slo_minutes, 0)} min SLO"
            + ("  OVER SLO" if over else "")
            + (f" (read {_age(now - s.read_at)})" if s.read_at is not None else ""),
            f"  arrivals {_num(s.arrival_rate, 1)}/s, next hour {_num(s.forecast_next_hour, 1)}/s (forecast)",
            f"  decided {_age(s.decided_age_s)}: {why}",
            f"  {health}, {failed}",
        ]
        blocks.append("\n".join(line if len(line) <= width else line[: width - 3] + "..." for line in lines))
    return "\n\n".join(blocks)
