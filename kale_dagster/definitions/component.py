"""The YAML declaration of a pipeline: a Dagster Component (``dg scaffold defs``, ``dg check``).

    # defs/ctr/defs.yaml
    type: kale_dagster.OnlineTrainingPipelineComponent
    attributes:
      name: ctr
      source: {bootstrap_servers: "kafka:9092", topics: [clicks], group_id: ctr-trainer}
      limits: {max_workers: 32, slo_minutes: 20}

Its attributes are derived from the declarations' field rules
(``definitions/schema.py``): ``OnlineTrainingPipeline``, ``Limits``,
``KafkaSource`` and the launcher configs each declare their fields once,
with type, range, default and description, and the schema (what ``dg check
yaml`` checks, and what ``dg`` and the UI document) is made from them.  Every
bad attribute is reported at once, each with its YAML path.  What one field
cannot say (``min_workers`` above ``max_workers``) is checked by the same
dataclasses the Python API and the CLI use, when the definitions load
(``dg check defs``, ``dg dev``).

Secrets: a source takes ``sasl_password_env``, the name of an environment
variable; there is no attribute for a password itself, so a literal one
fails the schema.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Any, Literal

from dagster import (
    Component,
    ComponentLoadContext,
    Definitions,
    ResolutionContext,
    Scaffolder,
    ScaffoldRequest,
    scaffold_with,
)
from pydantic import ConfigDict, Field, ValidationError, model_validator

from kale_dagster.definitions.pipeline import OnlineTrainingPipeline
from kale_dagster.definitions.schema import DeclaredModel, Templatable, declared_model, is_template
from kale_dagster.errors import KaleConfigError
from kale_dagster.forecast import FORECASTERS
from kale_dagster.launchers.command import CommandHookLauncherConfig
from kale_dagster.launchers.kubernetes import KubernetesLauncherConfig
from kale_dagster.launchers.observed import ObservedGroupLauncherConfig
from kale_dagster.launchers.scale_target import ScaleTargetLauncherConfig
from kale_dagster.launchers.service import LocalLauncherConfig
from kale_dagster.model.limits import Limits
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.policies import POLICIES
from kale_dagster.rules import at
from kale_dagster.stream.source import KafkaSource

LimitsAttributes = declared_model(Limits, path="attributes.limits")

_KafkaSourceFields = declared_model(KafkaSource, path="attributes.source")


class KafkaSourceAttributes(_KafkaSourceFields):  # type: ignore[misc, valid-type]
    """The topics the trainer consumes and its consumer group (``KafkaSource``)."""

    @model_validator(mode="before")
    @classmethod
    def _no_literal_password(cls, data: Any) -> Any:
        if isinstance(data, dict) and "sasl_password" in data:
            raise ValueError(
                "attributes.source.sasl_password: a password is never written in YAML; put it in an "
                "environment variable and name that variable in sasl_password_env"
            )
        return data


_LocalFields = declared_model(LocalLauncherConfig, path="attributes.launcher")
_KubernetesFields = declared_model(KubernetesLauncherConfig, path="attributes.launcher")
_ObservedFields = declared_model(ObservedGroupLauncherConfig, path="attributes.launcher")
_CommandFields = declared_model(CommandHookLauncherConfig, path="attributes.launcher")
_ScaleTargetFields = declared_model(ScaleTargetLauncherConfig, path="attributes.launcher")


class LocalLauncherAttributes(_LocalFields):  # type: ignore[misc, valid-type]
    """Workers run on this machine under the local trainer service (``kale trainer serve``)."""

    kind: Literal["local"] = Field(default="local", description="where the workers run: local")


class KubernetesLauncherAttributes(_KubernetesFields):  # type: ignore[misc, valid-type]
    """Workers run as a Kubernetes Job per allocation (``KubernetesLauncherConfig``)."""

    kind: Literal["kubernetes"] = Field(description="where the workers run: kubernetes")


class ObservedLauncherAttributes(_ObservedFields):  # type: ignore[misc, valid-type]
    """A consumer group someone else runs, watched by an advisory pipeline (``ObservedGroupLauncherConfig``)."""

    kind: Literal["observed"] = Field(description="where the workers run: observed")


class CommandLauncherAttributes(_CommandFields):  # type: ignore[misc, valid-type]
    """A workload sized through your own commands (``CommandHookLauncherConfig``)."""

    kind: Literal["command"] = Field(description="where the workers run: command")


class ScaleTargetLauncherAttributes(_ScaleTargetFields):  # type: ignore[misc, valid-type]
    """A Kubernetes workload sized through its scale subresource (``ScaleTargetLauncherConfig``); ``workload_kind`` is
    its kind (Deployment, StatefulSet, a custom kind)."""

    kind: Literal["scale_target"] = Field(description="where the workers run: scale_target")


class ThroughputPriorAttributes(DeclaredModel):
    """What the controller assumes before it has measured the trainer: samples/s per worker (``form: linear``),
    or the paper's curve, ``form: sync`` (global_batch and 4 coefficients) or ``form: async`` (3)."""

    form: Templatable[Literal["linear", "sync", "async"]] = Field(default="linear", description="the curve's shape")
    per_worker_rate: Templatable[Annotated[float, Field(gt=0)]] | None = Field(
        default=None, description="samples/s of one worker (form: linear)"
    )
    theta: Templatable[list[float]] | None = Field(
        default=None, description="the curve's coefficients (form: sync or async)"
    )
    global_batch: Templatable[Annotated[float, Field(gt=0)]] | None = Field(
        default=None, description="the global batch size M (form: sync)"
    )

    def build(self) -> ThroughputModel:
        path = "attributes.throughput_prior"
        if self.form == "linear":
            if self.per_worker_rate is None:
                raise KaleConfigError(f"{path}.per_worker_rate", "form linear needs per_worker_rate (samples/s)")
            return at(path, ThroughputModel.linear, per_worker_rate=self.per_worker_rate)
        if self.theta is None:
            raise KaleConfigError(f"{path}.theta", f"form {self.form} needs theta, the curve's coefficients")
        return at(path, ThroughputModel, form=self.form, theta=tuple(self.theta), global_batch=self.global_batch)


_ENV_REFERENCE = re.compile(r"\{\{[^}]*?\benv\.([A-Za-z_][A-Za-z0-9_]*)")


def _unset_env_references(value: Any, path: str):
    """(the attribute's path, the variable) for each ``{{ env.NAME }}`` whose variable is not set."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _unset_env_references(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _unset_env_references(item, f"{path}[{i}]")
    elif isinstance(value, str):
        for name in _ENV_REFERENCE.findall(value):
            if name not in os.environ:
                yield path, name


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
        properties={
            "kind": {"enum": list(by_kind), "description": f"where the workers run: one of {', '.join(by_kind)}"}
        },
        allOf=[
            {
                "if": {"properties": {"kind": {"const": kind}}, **({} if kind == "local" else {"required": ["kind"]})},
                "then": {"$ref": ref},
            }
            for kind, ref in by_kind.items()
        ],
    )


_PipelineFields = declared_model(
    OnlineTrainingPipeline,
    path="attributes",
    exclude=("clock",),
    attributes={
        "source": (KafkaSourceAttributes, ...),
        "limits": (LimitsAttributes, Field(default_factory=LimitsAttributes, description="worker bounds and SLO")),
        "throughput_prior": (
            ThroughputPriorAttributes | None,
            Field(default=None, description="default: 1000 samples/s per worker, scaling linearly"),
        ),
        "launcher": (
            Annotated[
                LocalLauncherAttributes
                | KubernetesLauncherAttributes
                | ObservedLauncherAttributes
                | CommandLauncherAttributes
                | ScaleTargetLauncherAttributes,
                Field(discriminator="kind"),
            ],
            Field(default_factory=LocalLauncherAttributes, description="where the workers run"),
        ),
    },
)


class OnlineTrainingPipelineAttributes(_PipelineFields):  # type: ignore[misc, valid-type]
    """The attributes of an ``OnlineTrainingPipelineComponent``: ``OnlineTrainingPipeline``'s fields, in YAML.

    Durations are in minutes unless the name says seconds.
    """

    model_config = ConfigDict(json_schema_extra=_launcher_by_kind)

    @model_validator(mode="before")
    @classmethod
    def _env_variables_set(cls, data: Any) -> Any:
        """An unset variable in ``{{ env.NAME }}`` is named now, before anything loads (``{{ env('NAME',
        'default') }}`` is never unset)."""
        if isinstance(data, dict):
            for path, name in _unset_env_references(data, "attributes"):
                raise ValueError(
                    f"{path}: environment variable {name} is not set ({{{{ env.{name} }}}}); set it, or give a "
                    f"default with {{{{ env('{name}', 'default') }}}}"
                )
        return data

    @model_validator(mode="after")
    def _valid_pipeline(self) -> OnlineTrainingPipelineAttributes:
        # The dataclasses' own checks (one validation path), when the YAML loads: dg check defs and dg dev
        # report them with the file and line.  Templated attributes are checked once rendered, at load.
        if not _holds_template(self.model_dump(exclude_unset=True)):
            self.build()
        return self

    def pipeline(self, context: ResolutionContext | None = None) -> OnlineTrainingPipeline:
        """The declared pipeline, its templates rendered in ``context`` (the component's load context, with its
        template variables; by default Dagster's own scope: env, dg, datetime) and then checked."""
        written = self.model_dump(exclude_unset=True)  # a default is never a template
        if not _holds_template(written):
            return self.build()
        context = context or ResolutionContext.default().at_path("attributes")
        rendered = context.resolve_value(written)
        if _holds_template(rendered):
            raise KaleConfigError("attributes", "a template renders to another template; render it to a value")
        try:
            return type(self).model_validate(rendered).build()
        except ValidationError as error:
            raise KaleConfigError.join(
                [
                    KaleConfigError(
                        ".".join(["attributes", *map(str, e["loc"])]), f"{e['msg']}{_rendered_from(written, e['loc'])}"
                    )
                    for e in error.errors()
                ]
            ) from None


def _rendered_from(written: Any, loc: tuple) -> str:
    """``(rendered from '{{ ... }}')`` when the attribute at ``loc`` was written as a template."""
    for key in loc:
        if not isinstance(written, (dict, list)):
            return ""
        try:
            written = written[key]
        except (KeyError, IndexError, TypeError):
            return ""
    return f" (rendered from {written!r})" if is_template(written) else ""


def _holds_template(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_holds_template(item) for item in value.values())
    if isinstance(value, list):
        return any(_holds_template(item) for item in value)
    return is_template(value)


@scaffold_with(_Scaffolder)
class OnlineTrainingPipelineComponent(Component):
    """A streaming trainer kept sized by a scaling policy (Kale by default), declared in YAML: its metrics
    sensor, forecast, gpu_allocation asset and checks, rescale and refit jobs and schedules.

    The same pipeline as ``OnlineTrainingPipeline`` in Python, built by the same ``build_definitions``.
    Its attributes are a strict schema (``OnlineTrainingPipelineAttributes``).  Any of them may be a template,
    ``{{ env.NAME }}`` or a variable of the defs.yaml's ``template_vars_module``, rendered when it loads as
    Dagster renders a Resolvable component's, then checked by the same rules.  Secrets are named by environment
    variable (``sasl_password_env``), never written.
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
        from dagster.components.resolved.scopes import LoadContextScope

        # As a Resolvable's: the template variables of the defs.yaml's template_vars_module, and {{ context.* }}.
        scope = context.resolution_context.with_scope(context=LoadContextScope(context))
        return cls(attributes.pipeline(scope.at_path("attributes")))

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
  limits:
    min_workers: 1
    max_workers: 8
    slo_minutes: 20                  # how far (in minutes of arrivals) training may fall behind
    restart_minutes: 10              # until rescales have been measured
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
