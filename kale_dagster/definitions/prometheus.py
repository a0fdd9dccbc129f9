"""Each pipeline's state as Prometheus metrics, for the dashboards and alerts operators already have.

A collector over ``definitions.status``: every scrape reads the Dagster instance afresh, so the endpoint
(``kale metrics serve``) can run beside the Dagster daemon, on the same instance (``DAGSTER_HOME``), with
nothing of its own to keep.  The exposition is prometheus_client's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kale_dagster.definitions.status import PipelineStatus, read_status

# name, help, unit conversion from a PipelineStatus
_GAUGES: tuple[tuple[str, str, Callable[[PipelineStatus], float | None]], ...] = (
    ("kale_min_workers", "The fewest workers the pipeline runs (its limits)", lambda s: s.min_workers),
    ("kale_max_workers", "The most workers the pipeline may run (its limits)", lambda s: s.max_workers),
    ("kale_backlog_samples", "Samples arrived and not yet trained, at the latest reading", lambda s: s.backlog),
    ("kale_time_lag_seconds", "Age of the oldest untrained sample, at the latest reading", lambda s: s.time_lag_s),
    (
        "kale_slo_seconds",
        "The time lag the pipeline must stay under",
        lambda s: None if s.slo_minutes is None else s.slo_minutes * 60,
    ),
    ("kale_arrival_rate", "Samples arriving per (pipeline) second, at the latest reading", lambda s: s.arrival_rate),
    (
        "kale_forecast_next_hour_rate",
        "The forecast mean arrival rate over the next hour",
        lambda s: s.forecast_next_hour,
    ),
    (
        "kale_decision_age_seconds",
        "Wall seconds since the latest decision recorded on gpu_allocation (each that changes something, and one "
        "every record_every_minutes otherwise)",
        lambda s: s.decided_age_s,
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
        workers = GaugeMetricFamily(
            "kale_workers", "Workers: running now, and desired by the latest decision", labels=["pipeline", "kind"]
        )
        for s in statuses:
            for kind, value in (("running", s.running_workers), ("desired", s.desired_workers)):
                if value is not None:
                    workers.add_metric([s.name, kind], value)
        yield workers
        for name, text, read in _GAUGES:
            family = GaugeMetricFamily(name, text, labels=["pipeline"])
            for s in statuses:
                value = read(s)
                if value is not None:
                    family.add_metric([s.name], float(value))
            yield family
        quality = GaugeMetricFamily(
            "kale_model_metric",
            "The trainer's progressive-validation metric (auc, mae, ...)",
            labels=["pipeline", "metric"],
        )
        for s in statuses:
            for key, value in s.extras.items():
                if key.startswith("model_") and isinstance(value, (int, float)):
                    quality.add_metric([s.name, key.removeprefix("model_")], float(value))
        yield quality
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
