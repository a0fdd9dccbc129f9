"""The YAML declaration of a pipeline: a Dagster Component (``dg scaffold defs``, ``dg check``).

    # defs/ctr/defs.yaml
    type: kale_dagster.OnlineTrainingPipelineComponent
    attributes:
      name: ctr
      source: {bootstrap_servers: "kafka:9092", topics: [clicks], group_id: ctr-trainer}
      max_workers: 32

Its attributes mirror :class:`OnlineTrainingPipeline` field for field and
its defaults are read from there, so the two cannot drift.  The schema
(what ``dg check yaml`` checks) carries types, ranges and the registered
policy and forecaster names; everything else is checked by the same
dataclasses the Python API and the CLI use, with their messages, prefixed
with the attribute's YAML path.  JSON Schema cannot compare two fields, so
``min_workers`` above ``max_workers`` is reported when the definitions
load (``dg check defs``, ``dg dev``), not by ``dg check yaml``.

Secrets: a source takes ``sasl_password_env``, the name of an environment
variable; there is no attribute for a password itself, so a literal one
fails the schema.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from dagster import Component, ComponentLoadContext, Definitions, Model, Scaffolder, ScaffoldRequest, scaffold_with
from pydantic import ConfigDict, Field, model_validator

from kale_dagster.definitions.pipeline import OnlineTrainingPipeline
from kale_dagster.errors import KaleConfigError
from kale_dagster.forecast import FORECASTERS
from kale_dagster.launchers.kubernetes import KubernetesLauncherConfig
from kale_dagster.launchers.service import LocalLauncherConfig
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.policies import POLICIES
from kale_dagster.stream.source import SASL_MECHANISMS, SECURITY_PROTOCOLS, KafkaSource

T = TypeVar("T")


def _default(cls: type, name: str) -> Any:
    """The dataclass field's default: the YAML schema shows the Python API's defaults, from one place."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise KeyError(name)


class _Attributes(Model):
    # A literal password written by mistake must not come back in an error message.
    model_config = ConfigDict(hide_input_in_errors=True)


def _at(path: str, build: Callable[..., T], **kwargs) -> T:
    """``build(**kwargs)``, its configuration error re-raised with the attribute's YAML path."""
    try:
        return build(**kwargs)
    except KaleConfigError as exc:
        raise KaleConfigError(f"{path}.{exc.field}", exc.problem) from None


class KafkaSourceModel(_Attributes):
    """The topics the trainer consumes and its consumer group (``KafkaSource``)."""

    bootstrap_servers: str = Field(description="host:port[,host:port...] of the Kafka brokers")
    topics: list[str] = Field(min_length=1, description="the topics the trainer consumes")
    group_id: str = Field(
        min_length=1, description="the trainer's consumer group: its committed offsets are where training resumes"
    )
    security_protocol: Literal[SECURITY_PROTOCOLS] = _default(KafkaSource, "security_protocol")  # type: ignore[valid-type]
    # Not Optional[...]: a nullable schema reports "not valid under any of the given schemas" instead of the choices.
    sasl_mechanism: Literal[SASL_MECHANISMS] = _default(KafkaSource, "sasl_mechanism")  # type: ignore[valid-type]
    sasl_username: str | None = _default(KafkaSource, "sasl_username")
    sasl_password_env: str = Field(
        default=_default(KafkaSource, "sasl_password_env"),
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="the NAME of the environment variable that holds the SASL password (never the password itself)",
    )
    ssl_cafile: str | None = _default(KafkaSource, "ssl_cafile")
    samples_per_record: int = Field(default=_default(KafkaSource, "samples_per_record"), ge=1)
    request_timeout_ms: int = Field(default=_default(KafkaSource, "request_timeout_ms"), ge=1)

    @model_validator(mode="before")
    @classmethod
    def _no_literal_password(cls, data: Any) -> Any:
        if isinstance(data, dict) and "sasl_password" in data:
            raise ValueError(
                "attributes.source.sasl_password: a password is never written in YAML; put it in an "
                "environment variable and name that variable in sasl_password_env"
            )
        return data

    def build(self) -> KafkaSource:
        fields = self.model_dump()
        return _at("attributes.source", KafkaSource, **{**fields, "topics": tuple(fields["topics"])})


class ThroughputPriorModel(_Attributes):
    """What the controller assumes before it has measured the trainer: samples/s per worker (``form: linear``),
    or the paper's curve, ``form: sync`` (global_batch and 4 coefficients) or ``form: async`` (3)."""

    form: Literal["linear", "sync", "async"] = "linear"
    per_worker_rate: float | None = Field(default=None, gt=0, description="samples/s of one worker (form: linear)")
    theta: list[float] | None = Field(default=None, description="the curve's coefficients (form: sync or async)")
    global_batch: float | None = Field(default=None, gt=0, description="the global batch size M (form: sync)")

    def build(self) -> ThroughputModel:
        path = "attributes.throughput_prior"
        if self.form == "linear":
            if self.per_worker_rate is None:
                raise KaleConfigError(
                    f"{path}.per_worker_rate", "form linear needs per_worker_rate (samples/s of one worker)"
                )
            return _at(path, ThroughputModel.linear, per_worker_rate=self.per_worker_rate)
        if self.theta is None:
            raise KaleConfigError(f"{path}.theta", f"form {self.form} needs theta, the curve's coefficients")
        return _at(path, ThroughputModel, form=self.form, theta=tuple(self.theta), global_batch=self.global_batch)


class LocalLauncherModel(_Attributes):
    """Workers run on this machine under the local trainer service (``kale trainer serve``)."""

    kind: Literal["local"] = "local"
    trainer_url: str = _default(LocalLauncherConfig, "trainer_url")
    token_file: str | None = _default(LocalLauncherConfig, "token_file")

    def build(self) -> LocalLauncherConfig:
        return _at("attributes.launcher", LocalLauncherConfig, **self.model_dump(exclude={"kind"}))


class KubernetesLauncherModel(_Attributes):
    """Workers run as a Kubernetes Job per allocation (``KubernetesLauncherConfig``)."""

    kind: Literal["kubernetes"]
    image: str = Field(min_length=1)
    checkpoint_pvc: str = Field(
        min_length=1, description="a ReadWriteMany PersistentVolumeClaim every worker pod mounts"
    )
    namespace: str = _default(KubernetesLauncherConfig, "namespace")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = _default(
        KubernetesLauncherConfig, "image_pull_policy"
    )
    image_pull_secrets: list[str] = list(_default(KubernetesLauncherConfig, "image_pull_secrets"))
    service_account: str | None = _default(KubernetesLauncherConfig, "service_account")
    gpus_per_worker: int = Field(default=_default(KubernetesLauncherConfig, "gpus_per_worker"), ge=0)
    cpu: str = _default(KubernetesLauncherConfig, "cpu")
    memory: str = _default(KubernetesLauncherConfig, "memory")
    node_selector: dict[str, str] = _default(KubernetesLauncherConfig, "node_selector")
    tolerations: list[dict[str, Any]] = list(_default(KubernetesLauncherConfig, "tolerations"))
    kafka_secret: str | None = Field(
        default=_default(KubernetesLauncherConfig, "kafka_secret"),
        description="a Secret whose keys become the workers' environment (e.g. KAFKA_SASL_PASSWORD)",
    )
    trainer_args: list[str] = list(_default(KubernetesLauncherConfig, "trainer_args"))
    termination_grace_period_s: int = Field(
        default=_default(KubernetesLauncherConfig, "termination_grace_period_s"), ge=10
    )
    rdzv_port: int = _default(KubernetesLauncherConfig, "rdzv_port")
    ready_timeout_s: float = _default(KubernetesLauncherConfig, "ready_timeout_s")
    stop_timeout_s: float = _default(KubernetesLauncherConfig, "stop_timeout_s")

    def build(self) -> KubernetesLauncherConfig:
        fields = self.model_dump(exclude={"kind"})
        tuples = {name: tuple(fields[name]) for name in ("image_pull_secrets", "tolerations", "trainer_args")}
        return _at("attributes.launcher", KubernetesLauncherConfig, **{**fields, **tuples})


def _pipeline_default(name: str) -> Any:
    return _default(OnlineTrainingPipeline, name)


class _Scaffolder(Scaffolder):
    """Writes a commented defs.yaml for a pipeline named after its folder."""

    def scaffold(self, request: ScaffoldRequest) -> None:
        name = request.target_path.name.replace("-", "_").lower()
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(SCAFFOLD_TEMPLATE.format(type=request.type_name, name=name))


def _launcher_by_kind(schema: dict) -> None:
    """The launcher's schema as if/then on ``kind``: ``dg check yaml`` (jsonschema) ignores pydantic's
    discriminator, and its oneOf would report "not valid under any of the given schemas" for a missing field."""
    launcher = schema["properties"]["launcher"]
    by_kind = launcher.pop("discriminator")["mapping"]
    del launcher["oneOf"]
    launcher.update(
        type="object",
        properties={"kind": {"enum": list(by_kind)}},
        allOf=[
            {
                "if": {"properties": {"kind": {"const": kind}}, **({} if kind == "local" else {"required": ["kind"]})},
                "then": {"$ref": ref},
            }
            for kind, ref in by_kind.items()
        ],
    )


class OnlineTrainingPipelineAttributes(_Attributes):
    """The attributes of an ``OnlineTrainingPipelineComponent``: ``OnlineTrainingPipeline``'s fields, in YAML.

    Durations are in minutes unless the name says seconds.
    """

    model_config = ConfigDict(json_schema_extra=_launcher_by_kind)

    name: str = Field(
        pattern=r"^[a-z][a-z0-9_]{0,62}$",
        description="lowercase letters, digits and _; prefixes asset keys, jobs, sensors",
    )
    source: KafkaSourceModel
    min_workers: int = Field(default=_pipeline_default("min_workers"), ge=1)
    max_workers: int = Field(default=_pipeline_default("max_workers"), ge=1)
    slo_minutes: float = Field(
        default=_pipeline_default("slo_minutes"),
        gt=0,
        description="the lag (minutes of arrivals) training may fall behind",
    )
    restart_minutes: float = Field(
        default=_pipeline_default("restart_minutes"),
        ge=0,
        description="declared restart time of a rescale; replaced by the measured one once rescales are recorded",
    )
    forecaster: Literal[tuple(FORECASTERS)] = _pipeline_default("forecaster")  # type: ignore[valid-type]
    forecast_horizon_minutes: float = Field(default=_pipeline_default("forecast_horizon_minutes"), gt=0)
    forecast_refit_minutes: float = Field(default=_pipeline_default("forecast_refit_minutes"), gt=0)
    backtest_cron: str = _pipeline_default("backtest_cron")
    metrics_interval_seconds: float = Field(default=_pipeline_default("metrics_interval_seconds"), ge=5)
    policy: Literal[tuple(POLICIES)] = _pipeline_default("policy")  # type: ignore[valid-type]
    policy_options: dict[str, Any] = Field(
        default_factory=dict, description="keyword options of the policy's build (e.g. an HPA's target_utilization)"
    )
    throughput_prior: ThroughputPriorModel | None = Field(
        default=None, description="default: 1000 samples/s per worker, scaling linearly"
    )
    global_batch: float | None = Field(default=_pipeline_default("global_batch"), gt=0)
    advisory: bool = Field(default=_pipeline_default("advisory"), description="record every decision, never rescale")
    history_url: str | None = Field(
        default=_pipeline_default("history_url"),
        description="SQLAlchemy URL of the metrics history; default SQLite under DAGSTER_HOME",
    )
    launcher: Annotated[LocalLauncherModel | KubernetesLauncherModel, Field(discriminator="kind")] = Field(
        default_factory=LocalLauncherModel
    )
    autostart: bool = Field(
        default=_pipeline_default("autostart"),
        description="false: sensors and schedules wait for an operator in the UI",
    )

    @model_validator(mode="after")
    def _valid_pipeline(self) -> OnlineTrainingPipelineAttributes:
        # The dataclasses' own checks (one validation path), when the YAML loads: dg check defs and dg dev
        # report them with the file and line.
        self.pipeline()
        return self

    def pipeline(self) -> OnlineTrainingPipeline:
        fields = self.model_dump(exclude={"source", "launcher", "throughput_prior"})
        extra = {"throughput_prior": self.throughput_prior.build()} if self.throughput_prior else {}
        return _at(
            "attributes",
            OnlineTrainingPipeline,
            **fields,
            **extra,
            source=self.source.build(),
            launcher=self.launcher.build(),
        )


@scaffold_with(_Scaffolder)
class OnlineTrainingPipelineComponent(Component):
    """A streaming trainer kept sized by a scaling policy (Kale by default), declared in YAML: its metrics
    sensor, forecast, gpu_allocation asset and checks, rescale and refit jobs and schedules.

    The same pipeline as ``OnlineTrainingPipeline`` in Python, built by the same ``build_definitions``.
    Its attributes are a strict schema (``OnlineTrainingPipelineAttributes``), without templating: secrets
    are named by environment variable, never written.
    """

    def __init__(self, pipeline: OnlineTrainingPipeline):
        self.pipeline = pipeline

    @classmethod
    def get_model_cls(cls) -> type[OnlineTrainingPipelineAttributes]:
        return OnlineTrainingPipelineAttributes

    @classmethod
    def load(
        cls, attributes: OnlineTrainingPipelineAttributes | None, context: ComponentLoadContext
    ) -> OnlineTrainingPipelineComponent:
        if attributes is None:
            raise KaleConfigError(
                "attributes", "declare at least the pipeline's name and source (dg scaffold defs writes an example)"
            )
        return cls(attributes.pipeline())

    def build_defs(self, context: ComponentLoadContext) -> Definitions:
        from kale_dagster.definitions.build import build_definitions

        return build_definitions(self.pipeline)


SCAFFOLD_TEMPLATE = """\
# A Kale pipeline: the sensors, forecast, gpu_allocation asset and rescale jobs of one streaming trainer.
# Check with `dg check yaml` and `dg check defs`; see what it defines with `dg list defs`.
type: {type}
attributes:
  name: {name}    # prefixes asset keys, jobs and sensors
  source:
    bootstrap_servers: "127.0.0.1:9092"
    topics: [samples]
    group_id: {name}-trainer    # its committed offsets are where training resumes
    # security_protocol: SASL_SSL
    # sasl_mechanism: SCRAM-SHA-512
    # sasl_username: kale
    # sasl_password_env: KALE_KAFKA_PASSWORD   # the variable's NAME; never the password itself
  min_workers: 1
  max_workers: 8
  slo_minutes: 20                    # how far (in minutes of arrivals) training may fall behind
  restart_minutes: 10                # until rescales have been measured
  forecaster: prophet                # one of: {forecasters}
  policy: kale                       # one of: {policies}
  advisory: true                     # record decisions without rescaling; set false to act on them
  # throughput_prior: {{form: linear, per_worker_rate: 1000}}   # samples/s of one worker
  launcher:
    kind: local                      # the local trainer service: `kale trainer serve`
  # launcher:
  #   kind: kubernetes
  #   image: registry.example.com/trainer:1.0
  #   namespace: ml
  #   checkpoint_pvc: trainer-checkpoints   # ReadWriteMany
  #   kafka_secret: trainer-kafka-credentials
""".replace("{forecasters}", ", ".join(FORECASTERS)).replace("{policies}", ", ".join(POLICIES))
