"""Each pipeline's state as Prometheus metrics, for the dashboards and alerts operators already have.

A collector over ``definitions.status``: every scrape reads the Dagster instance afresh, so the endpoint
(``kale metrics serve``) can run beside the Dagster daemon, on the same instance (``DAGSTER_HOME``), with
nothing of its own to keep.  The exposition is prometheus_client's.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kale_dagster.definitions.status import PipelineStatus, read_status

# name, help, value from a PipelineStatus.  Names follow Prometheus's naming guide: one quantity per name, the unit
# as a suffix in base units (seconds, samples), times as ``_timestamp_seconds`` (an age is time() minus it).
_GAUGES: tuple[tuple[str, str, Callable[[PipelineStatus], float | None]], ...] = (
    ("kale_workers_running", "Workers running at the latest reading", lambda s: s.running_workers),
    ("kale_workers_desired", "Workers the latest decision wants", lambda s: s.desired_workers),
    ("kale_workers_min", "The fewest workers the pipeline runs (its limits)", lambda s: s.min_workers),
    ("kale_workers_max", "The most workers the pipeline may run (its limits)", lambda s: s.max_workers),
    ("kale_backlog_samples", "Samples arrived and not yet trained, at the latest reading", lambda s: s.backlog),
    ("kale_time_lag_seconds", "Age of the oldest untrained sample, at the latest reading", lambda s: s.time_lag_s),
    (
        "kale_slo_time_lag_seconds",
        "The time lag the pipeline must stay under",
        lambda s: None if s.slo_minutes is None else s.slo_minutes * 60,
    ),
    (
        "kale_arrival_samples_per_second",
        "Samples arriving per (pipeline) second over the rate window, at the latest reading",
        lambda s: s.arrival_rate,
    ),
    (
        "kale_forecast_arrival_samples_per_second",
        "The forecast mean arrival rate over the next hour",
        lambda s: s.forecast_next_hour,
    ),
    (
        "kale_last_reading_timestamp_seconds",
        "When the metrics sensor last read the stream and decided (Unix time): a stalled sensor stops it",
        lambda s: s.read_at,
    ),
    (
        "kale_last_recorded_decision_timestamp_seconds",
        "When a decision was last recorded on gpu_allocation (Unix time): each that changes something, and one "
        "every record_every_minutes otherwise",
        lambda s: s.recorded_at,
    ),
    ("kale_restart_seconds", "The restart time the latest decision planned with", lambda s: s.restart_s),
    ("kale_sensor_running", "1 while the pipeline's metrics sensor runs", lambda s: float(s.sensor_running)),
    ("kale_advisory", "1 for a pipeline that records decisions and never rescales", lambda s: float(s.advisory)),
    ("kale_failed_runs_last_hour", "The pipeline's failed runs over the last hour", lambda s: s.failed_runs_last_hour),
)

# Counted by the metrics sensor, in its cursor, by ControlStep.outcome (keep, scale_up, scale_down, recover, held).
_COUNTERS: tuple[tuple[str, str, Callable[[PipelineStatus], dict[str, int]]], ...] = (
    ("kale_decisions", "Decisions made (advisory ones included), by what they amount to", lambda s: s.decisions),
    ("kale_rescales_requested", "Rescales the controller requested, by what they amount to", lambda s: s.rescales),
)


def build_info() -> GaugeMetricFamily:
    """``kale_build_info``: 1, labelled with the versions that run (the convention for a build's identity)."""
    import dagster

    import kale_dagster

    info = GaugeMetricFamily(
        "kale_build_info", "kale-dagster's version and what it runs on", labels=["version", "dagster", "python"]
    )
    info.add_metric([kale_dagster.__version__, dagster.__version__, platform.python_version()], 1.0)
    return info


class PipelineCollector(Collector):
    """Gauges per pipeline, read from the instance ``open_instance`` returns at every scrape."""

    def __init__(self, open_instance: Callable[[], Any]):
        self.open_instance = open_instance

    def collect(self) -> Iterator[Any]:
        instance = self.open_instance()
        try:
            statuses = read_status(instance)
            rescales = _rescale_runs(instance, [s.name for s in statuses])
        finally:
            instance.dispose()
        yield build_info()
        for name, text, read in _GAUGES:
            family = GaugeMetricFamily(name, text, labels=["pipeline"])
            for s in statuses:
                value = read(s)
                if value is not None:
                    family.add_metric([s.name], float(value))
            yield family
        # The trainer's progressive-validation metric, one name per metric (an AUC and an MAE are not one quantity).
        quality: dict[str, GaugeMetricFamily] = {}
        for s in statuses:
            for key, value in s.extras.items():
                if key.startswith("model_") and isinstance(value, (int, float)):
                    name = "kale_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)
                    family = quality.setdefault(
                        name,
                        GaugeMetricFamily(name, f"The trainer's progressive-validation {key[6:]}", labels=["pipeline"]),
                    )
                    family.add_metric([s.name], float(value))
        yield from quality.values()
        from kale_dagster.control.controller import OUTCOMES

        for name, text, read in _COUNTERS:
            family = CounterMetricFamily(name, text, labels=["pipeline", "outcome"])
            for s in statuses:
                counts = read(s)
                for outcome in OUTCOMES:
                    family.add_metric([s.name, outcome], counts.get(outcome, 0))
            yield family
        runs = CounterMetricFamily("kale_rescale_runs", "Rescale runs, by outcome", labels=["pipeline", "status"])
        for (pipeline, status), count in sorted(rescales.items()):
            runs.add_metric([pipeline, status], count)
        yield runs


def _rescale_runs(instance, pipelines: list[str]) -> dict[tuple[str, str], int]:
    from dagster import DagsterRunStatus, RunsFilter

    out = {}
    for name in pipelines:
        for status in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE):
            count = instance.get_runs_count(RunsFilter(job_name=f"{name}_rescale", statuses=[status]))
            out[(name, status.value.lower())] = count
    return out
