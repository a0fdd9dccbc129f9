"""Declarative online-training pipelines: a few lines of Python per kept-sized trainer.

    from kale_dagster import KafkaSource, OnlineTrainingPipeline, build_definitions

    ctr = OnlineTrainingPipeline(
        name="ctr",
        source=KafkaSource(bootstrap_servers="kafka:9092", topics=["clicks"], group_id="ctr-trainer"),
        min_workers=1, max_workers=32, slo_minutes=20,
    )
    defs = build_definitions(ctr)

Each pipeline gets its own asset-key prefix, jobs, schedules and sensors
named after it, so several live in one code location without clashes.
The declaration itself imports nothing from Dagster; ``build`` turns it
into definitions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from kale_dagster.control.clock import PipelineClock
from kale_dagster.errors import KaleConfigError
from kale_dagster.forecast import FORECASTERS
from kale_dagster.launchers.base import LauncherConfig
from kale_dagster.launchers.service import LocalLauncherConfig
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.policies import POLICIES, Sizing
from kale_dagster.stream.source import KafkaSource

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class OnlineTrainingPipeline:
    """One streaming trainer kept sized by a scaling policy.

    ``policy`` and ``forecaster`` are registered names
    (``kale_dagster.policies.POLICIES``, ``kale_dagster.forecast.FORECASTERS``);
    ``launcher`` says where the workers run: ``LocalLauncherConfig`` (the
    local trainer service, the default) or ``KubernetesLauncherConfig``.

    Durations are in the pipeline's time (``clock``): wall time, unless a
    demo or a benchmark compresses it with ``PipelineClock(time_scale=...)``.
    The metrics sensor reads the stream every ``metrics_interval_seconds``
    and decides at every reading; the forecaster is refitted every
    ``forecast_refit_minutes`` and re-anchored on fresh metrics in between.
    ``policy_options`` are keyword options of the policy's build (e.g. an
    HPA's ``target_utilization`` and ``behavior``).

    ``advisory=True`` records every decision (asset, reasons, plots) but
    never rescales, like AWS predictive scaling's forecast-only mode: the
    way to try Kale on a production stream before trusting it.
    ``autostart=False`` leaves the pipeline's sensors and schedule stopped
    until an operator starts them in the UI.
    """

    name: str
    source: KafkaSource
    min_workers: int = 1
    max_workers: int = 8
    slo_minutes: float = 20.0
    restart_minutes: float = 10.0
    forecaster: str = "prophet"
    forecast_horizon_minutes: float = 120.0
    forecast_refit_minutes: float = 60.0
    backtest_cron: str = "0 3 * * *"
    metrics_interval_seconds: float = 60.0
    policy: str = "kale"
    policy_options: Mapping = field(default_factory=dict)
    throughput_prior: ThroughputModel = field(default_factory=lambda: ThroughputModel.linear(1000.0))
    global_batch: float | None = None  # set for the synchronous model form
    advisory: bool = False
    history_url: str | None = None  # SQLAlchemy URL; default SQLite under DAGSTER_HOME
    launcher: LauncherConfig = field(default_factory=LocalLauncherConfig)
    clock: PipelineClock = field(default_factory=PipelineClock)
    autostart: bool = True

    def __post_init__(self):
        def need(ok: bool, name: str, problem: str):
            if not ok:
                raise KaleConfigError(name, problem)

        need(
            bool(_NAME.match(self.name)),
            "name",
            f"{self.name!r} must be lowercase letters, digits and _, starting with a letter (it prefixes asset keys "
            "and "
            "job names)",
        )
        need(isinstance(self.source, KafkaSource), "source", f"must be a KafkaSource, got {type(self.source).__name__}")
        need(
            1 <= self.min_workers <= self.max_workers,
            "min_workers",
            f"need 1 <= min_workers <= max_workers, got {self.min_workers} and {self.max_workers}",
        )
        need(self.slo_minutes > 0, "slo_minutes", f"must be > 0, got {self.slo_minutes}")
        need(self.restart_minutes >= 0, "restart_minutes", f"must be >= 0, got {self.restart_minutes}")
        need(
            self.forecaster in FORECASTERS,
            "forecaster",
            f"unknown {self.forecaster!r}; choose one of {', '.join(FORECASTERS)}",
        )
        need(
            self.forecast_horizon_minutes > 0,
            "forecast_horizon_minutes",
            f"must be > 0, got {self.forecast_horizon_minutes}",
        )
        need(
            self.forecast_refit_minutes > 0, "forecast_refit_minutes", f"must be > 0, got {self.forecast_refit_minutes}"
        )
        need(
            self.metrics_interval_seconds >= 5,
            "metrics_interval_seconds",
            f"must be >= 5, got {self.metrics_interval_seconds}",
        )
        need(
            isinstance(self.launcher, LauncherConfig),
            "launcher",
            f"must be LocalLauncherConfig(...) or KubernetesLauncherConfig(...), got {type(self.launcher).__name__}",
        )
        need(
            isinstance(self.clock, PipelineClock), "clock", f"must be a PipelineClock, got {type(self.clock).__name__}"
        )
        need(self.policy in POLICIES, "policy", f"unknown {self.policy!r}; choose one of {', '.join(POLICIES)}")
        need(
            isinstance(self.policy_options, Mapping),
            "policy_options",
            f"must be a dict of the policy's options, got {type(self.policy_options).__name__}",
        )
        try:  # options the policy does not take fail at load, not at the first tick
            POLICIES.build(self.policy, self.sizing(self.throughput_prior), **self.policy_options)
        except (TypeError, ValueError) as exc:
            raise KaleConfigError("policy_options", f"not valid for policy {self.policy!r}: {exc}") from exc

    @property
    def sensor_interval_s(self) -> int:
        """The metrics sensor's wall-clock interval (Dagster's daemon ticks sensors at most every few seconds)."""
        return max(1, round(self.clock.wall_duration(self.metrics_interval_seconds)))

    def key(self, asset: str) -> list[str]:
        return [self.name, asset]

    def history(self):
        from kale_dagster.stream.history import MetricsHistory

        return MetricsHistory(self.history_url)

    def sizing(self, model: ThroughputModel, partitions: int | None = None) -> Sizing:
        """What the pipeline's policy is built from (``kale_dagster.policies.Sizing``)."""
        return Sizing(
            min_workers=self.min_workers,
            max_workers=self.max_workers,
            slo_s=self.slo_minutes * 60,
            restart_s=self.restart_minutes * 60,
            model=model,
            partitions=partitions,
        )
