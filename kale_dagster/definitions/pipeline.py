"""Declarative online-training pipelines: a few lines of Python per kept-sized trainer.

    from kale_dagster import KafkaSource, OnlineTrainingPipeline, build_definitions

    ctr = OnlineTrainingPipeline(
        name="ctr",
        source=KafkaSource(bootstrap_servers="kafka:9092", topics=["clicks"], group_id="ctr-trainer"),
        limits=Limits(max_workers=32, slo_minutes=20),
    )
    defs = build_definitions(ctr)

Each pipeline gets its own asset-key prefix, jobs, schedules and sensors
named after it, so several live in one code location without clashes.
The declaration itself imports nothing from Dagster; ``build`` turns it
into definitions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from kale_dagster.control.clock import PipelineClock
from kale_dagster.control.controller import ControlSettings
from kale_dagster.errors import KaleConfigError
from kale_dagster.forecast import FORECASTERS
from kale_dagster.launchers.base import Launcher, LauncherConfig
from kale_dagster.launchers.observed import ObservedGroupLauncherConfig
from kale_dagster.launchers.service import LocalLauncherConfig
from kale_dagster.model.limits import Limits
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.policies import POLICIES, Sizing
from kale_dagster.rules import check, need, setting
from kale_dagster.stream.source import KafkaSource
from kale_dagster.trainer.api import (
    DEFAULT_TRAINER,
    TrainerSpec,
    options_problem,
    trainer_field,
    trainer_options_field,
    trainer_path_problem,
)

_NAME = r"[a-z][a-z0-9_]{0,62}"


@dataclass(frozen=True)
class OnlineTrainingPipeline:
    """One streaming trainer kept sized by a scaling policy.

    ``policy`` and ``forecaster`` are registered names
    (``kale_dagster.policies.POLICIES``, ``kale_dagster.forecast.FORECASTERS``);
    ``launcher`` says where the workers run: ``LocalLauncherConfig`` (the
    local trainer service, the default) or ``KubernetesLauncherConfig``.
    ``trainer`` names the factory of the user's trainer (``kale_dagster.trainer.api``), as an import path
    (``mypkg.train:make_trainer``) the workers run with ``trainer_options``; a path that does not resolve
    here is refused when definitions load.

    Durations are in the pipeline's time (``clock``): wall time, unless a
    demo or a benchmark compresses it with ``PipelineClock(time_scale=...)``.
    The metrics sensor reads the stream every ``metrics_interval_seconds``
    and decides at every reading; the forecaster is refitted every
    ``forecast_refit_minutes`` and re-anchored on fresh metrics in between.
    ``policy_options`` are keyword options of the policy's build (e.g. an
    HPA's ``target_utilization`` and ``behavior``).

    A pipeline is advisory unless declared otherwise (``advisory=False``), as AWS predictive scaling starts
    forecast-only: it records every decision (asset, reasons, plots, the daily savings report) but never
    rescales, the way to try Kale on a production stream before trusting it with the workers.
    ``autostart=False`` leaves the pipeline's sensors and schedule stopped
    until an operator starts them in the UI.
    """

    name: str = setting(
        pattern=_NAME,
        hint="must be lowercase letters, digits and _, starting with a letter (it prefixes asset keys and job names)",
        description="prefixes the pipeline's asset keys, jobs, schedules and sensors",
    )
    source: KafkaSource = setting(description="the topics the trainer consumes and its consumer group")
    limits: Limits = setting(default_factory=Limits, description="worker bounds, lag SLO, declared restart time")
    forecaster: str = setting("prophet", choices=lambda: FORECASTERS, description="the traffic forecaster")
    forecast_horizon_minutes: float = setting(120.0, gt=0, le=7 * 1440, unit="min", description="how far it looks")
    # Six hours: refitting hourly forecast no better on the development set (docs/experiments.md) and wrote 0.87 MB
    # of run events a day.
    forecast_refit_minutes: float = setting(360.0, gt=0, unit="min", description="how often it is refitted")
    backtest_cron: str = setting("0 3 * * *", description="when the policy backtest runs (cron)")
    report_cron: str = setting("0 6 * * *", description="when the savings report is made (cron)")
    report_days: float = setting(7.0, gt=0, le=35, unit="days", description="the span the savings report covers")
    report_baselines: tuple[str, ...] = setting(
        ("hpa", "keda"),
        description="the autoscalers the savings report compares, each at its best tuned setting (registered "
        "policies, not Kale's)",
    )
    metrics_interval_seconds: float = setting(
        60.0, ge=5, unit="s", description="how often the stream is read and a decision made"
    )
    record_every_minutes: float = setting(
        20.0,
        ge=0,
        le=1440,
        unit="min",
        description="a decision that changes nothing is recorded on gpu_allocation (with the reading and the SLO "
        "check) at most this often; every decision is in the metrics history; 0: every reading",
    )
    policy: str = setting("kale", choices=lambda: POLICIES, description="the scaling policy")
    policy_options: Mapping = setting(
        default_factory=dict, description="keyword options of the policy's build (e.g. an HPA's target_utilization)"
    )
    throughput_prior: ThroughputModel = setting(
        default_factory=lambda: ThroughputModel.linear(1000.0),
        description="what the controller assumes before it has measured the trainer",
    )
    global_batch: float | None = setting(None, gt=0, description="the global batch size, for the synchronous model")
    advisory: bool = setting(
        True, description="record every decision, never rescale (the default); false: Kale rescales the workers"
    )
    history_url: str | None = setting(
        None, description="SQLAlchemy URL of the metrics history; default SQLite under DAGSTER_HOME"
    )
    trainer: str = trainer_field()
    trainer_options: Mapping = trainer_options_field()
    launcher: LauncherConfig = setting(
        default_factory=LocalLauncherConfig, description="where the workers run: local processes or Kubernetes"
    )
    clock: PipelineClock = setting(default_factory=PipelineClock, description="compresses time for demos")
    autostart: bool = setting(True, description="false: sensors and schedules wait for an operator in the UI")

    def __post_init__(self):
        check(
            self,
            self._policy_takes_its_options,
            lambda: options_problem(self.trainer_options),
            lambda: None if self.trainer == DEFAULT_TRAINER else trainer_path_problem(self.trainer),
            lambda: need(
                self.advisory or not isinstance(self.launcher, ObservedGroupLauncherConfig),
                "advisory",
                "an observed consumer group is never rescaled by Kale: declare the pipeline advisory=True, or a "
                "launcher that restarts the workload",
            ),
            self._report_baselines_are_baselines,
            lambda: self.launcher.source_problem(self.source),
        )

    @property
    def trainer_spec(self) -> TrainerSpec:
        return TrainerSpec(self.trainer, self.trainer_options)

    @cached_property
    def launcher_instance(self) -> Launcher:
        """The launcher this process drives the workers through, built once from ``launcher`` (a build that
        fails is tried again at the next call): a code server's sensor ticks share it, so what it learns
        between them is its own."""
        return self.launcher.build(
            self.name, self.source, self.trainer_spec, workers_per_pod=self.limits.workers_per_pod
        )

    def _report_baselines_are_baselines(self) -> KaleConfigError | None:
        baselines = [name for name in POLICIES.compared() if name != "kale"]
        unknown = [name for name in self.report_baselines if name not in baselines]
        return need(
            not unknown, "report_baselines", f"unknown {', '.join(unknown)}; choose from {', '.join(baselines)}"
        )

    def _policy_takes_its_options(self) -> KaleConfigError | None:
        """Options the policy does not take fail at load, not at the first tick."""
        try:
            POLICIES.build(self.policy, Sizing(self.limits, self.throughput_prior), **self.policy_options)
        except (TypeError, ValueError) as exc:
            return KaleConfigError("policy_options", f"not valid for policy {self.policy!r}: {exc}")
        return None

    def control_settings(self) -> ControlSettings:
        """What the pipeline's controller is built from."""
        return ControlSettings(
            policy=self.policy, limits=self.limits, policy_options=self.policy_options, advisory=self.advisory
        )

    @property
    def forecast_horizon_s(self) -> float:
        return self.forecast_horizon_minutes * 60.0

    @property
    def forecast_refit_s(self) -> float:
        return self.forecast_refit_minutes * 60.0

    @property
    def sensor_interval_s(self) -> int:
        """The metrics sensor's wall-clock interval (Dagster's daemon ticks sensors at most every few seconds)."""
        return max(1, round(self.clock.wall_duration(self.metrics_interval_seconds)))

    def key(self, asset: str) -> list[str]:
        return [self.name, asset]

    def history(self):
        from kale_dagster.stream.history import MetricsHistory

        return MetricsHistory(self.history_url)
