"""Declarative online-training pipelines: a few lines of Python to Dagster Definitions.

    from kale_dagster import KafkaSource, OnlineTrainingPipeline, build_definitions

    ctr = OnlineTrainingPipeline(
        name="ctr",
        source=KafkaSource(bootstrap_servers="kafka:9092", topics=["clicks"], group_id="ctr-trainer"),
        min_workers=1, max_workers=32, slo_minutes=20,
    )
    defs = build_definitions(ctr)

Each pipeline gets its own asset-key prefix, jobs, schedules and sensors
named after it, so several live in one code location without clashes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Optional

from .errors import KaleConfigError
from .forecast import MODELS
from .throughput import ThroughputModel

if TYPE_CHECKING:  # the launcher imports the kubernetes client lazily
    from .launchers.kubernetes import KubernetesTrainerConfig

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class KafkaSource:
    """The topics a trainer consumes.  Secrets: pass ``sasl_password_env`` (an env var name), never a value."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    group_id: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: Optional[str] = None
    sasl_username: Optional[str] = None
    sasl_password_env: Optional[str] = None
    ssl_cafile: Optional[str] = None
    samples_per_record: int = 1  # see KafkaStreamResource.samples_per_record
    request_timeout_ms: int = 10_000

    def __post_init__(self):
        object.__setattr__(self, "topics", tuple(self.topics))

    def resource(self):
        from dagster import EnvVar

        from .resources import KafkaStreamResource

        return KafkaStreamResource(
            bootstrap_servers=self.bootstrap_servers,
            topics=list(self.topics),
            group_id=self.group_id,
            security_protocol=self.security_protocol,
            sasl_mechanism=self.sasl_mechanism,
            sasl_plain_username=self.sasl_username,
            sasl_plain_password=EnvVar(self.sasl_password_env) if self.sasl_password_env else None,
            ssl_cafile=self.ssl_cafile,
            samples_per_record=self.samples_per_record,
            request_timeout_ms=self.request_timeout_ms,
        )


@dataclass(frozen=True)
class OnlineTrainingPipeline:
    """One streaming trainer kept sized by a scaling policy.

    ``advisory=True`` records every decision (asset, reasons, plots) but
    never rescales, like AWS predictive scaling's forecast-only mode: the
    way to try Kale on a production stream before trusting it.
    """

    name: str
    source: KafkaSource
    min_workers: int = 1
    max_workers: int = 8
    slo_minutes: float = 20.0
    restart_minutes: float = 10.0
    forecaster: str = "prophet"
    forecast_horizon_minutes: float = 120.0
    forecast_cron: str = "*/10 * * * *"
    throughput_cron: str = "0 * * * *"
    metrics_interval_seconds: int = 60
    emergency_lag_minutes: Optional[float] = None  # default: half the SLO
    policy: Literal["kale", "hpa", "static"] = "kale"
    throughput_prior: ThroughputModel = field(default_factory=lambda: ThroughputModel.linear(1000.0))
    global_batch: Optional[float] = None  # set for the synchronous model form
    advisory: bool = False
    history_url: Optional[str] = None  # SQLAlchemy URL; default SQLite under DAGSTER_HOME
    kubernetes: Optional["KubernetesTrainerConfig"] = None  # run the workers on Kubernetes (launchers.kubernetes)
    local_trainer_url: str = "http://127.0.0.1:8765"  # else: the local trainer service (kale trainer serve / kale demo)

    def __post_init__(self):
        def need(ok: bool, name: str, problem: str):
            if not ok:
                raise KaleConfigError(name, problem)

        need(bool(_NAME.match(self.name)), "name", f"{self.name!r} must be lowercase letters, digits and _, starting with a letter (it prefixes asset keys and job names)")
        need(1 <= self.min_workers <= self.max_workers, "min_workers", f"need 1 <= min_workers <= max_workers, got {self.min_workers} and {self.max_workers}")
        need(self.slo_minutes > 0, "slo_minutes", f"must be > 0, got {self.slo_minutes}")
        need(self.restart_minutes >= 0, "restart_minutes", f"must be >= 0, got {self.restart_minutes}")
        need(self.forecaster in MODELS, "forecaster", f"unknown {self.forecaster!r}; choose one of {', '.join(MODELS)}")
        need(self.forecast_horizon_minutes > 0, "forecast_horizon_minutes", f"must be > 0, got {self.forecast_horizon_minutes}")
        need(self.metrics_interval_seconds >= 5, "metrics_interval_seconds", f"must be >= 5, got {self.metrics_interval_seconds}")
        need(self.policy in ("kale", "hpa", "static"), "policy", f"must be kale, hpa or static, got {self.policy!r}")

    @property
    def emergency_lag_s(self) -> float:
        return (self.emergency_lag_minutes if self.emergency_lag_minutes is not None else self.slo_minutes / 2) * 60

    def key(self, asset: str) -> list[str]:
        return [self.name, asset]

    def history(self):
        from .history import MetricsHistory

        return MetricsHistory(self.history_url)

    def definitions(self):
        from .assets import build_pipeline_definitions

        return build_pipeline_definitions(self)


def build_definitions(*pipelines: OnlineTrainingPipeline):
    """Merge several pipelines into one ``dagster.Definitions``; names must be unique."""
    from dagster import Definitions

    names = [p.name for p in pipelines]
    if len(set(names)) != len(names):
        raise KaleConfigError("name", f"pipeline names must be unique, got {names}")
    return Definitions.merge(*(p.definitions() for p in pipelines))
