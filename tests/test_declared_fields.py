"""Property-based: every declared field of every declaration, fed any value, either holds a value its rule
allows or refuses it with a KaleConfigError that names the field. Never another exception, never silent nonsense."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kale_dagster import KaleConfigError, Limits
from kale_dagster.definitions.pipeline import OnlineTrainingPipeline
from kale_dagster.launchers.command import CommandHookLauncherConfig
from kale_dagster.launchers.kubernetes import KubernetesLauncherConfig
from kale_dagster.launchers.scale_target import ScaleTargetLauncherConfig
from kale_dagster.launchers.service import LocalLauncherConfig
from kale_dagster.policies.hpa import HPAPolicy
from kale_dagster.policies.kale import KaleConfig
from kale_dagster.policies.keda import KafkaScalerMetadata, KedaKafkaPolicy
from kale_dagster.rules import field_types, rule_of
from kale_dagster.sim.backtest import BacktestSettings
from kale_dagster.sim.simulate import SimConfig
from kale_dagster.stream.producer import ReplaySettings
from kale_dagster.stream.source import KafkaSource
from kale_dagster.trainer.settings import TrainerSettings

SOURCE = KafkaSource("127.0.0.1:9092", ("samples",), "ctr")

# Each declaration with the least it needs to be built; every other field keeps its default.
DECLARATIONS = {
    Limits: {},
    KaleConfig: {},
    SimConfig: {},
    BacktestSettings: {},
    HPAPolicy: {},
    KedaKafkaPolicy: {},
    KafkaScalerMetadata: {},
    KafkaSource: {"bootstrap_servers": "127.0.0.1:9092", "topics": ("samples",), "group_id": "ctr"},
    TrainerSettings: {"source": SOURCE, "checkpoint_dir": "/tmp/ckpt"},
    ReplaySettings: {},
    LocalLauncherConfig: {},
    KubernetesLauncherConfig: {"image": "trainer:1", "checkpoint_pvc": "ckpt"},
    ScaleTargetLauncherConfig: {"workload_kind": "Deployment", "name": "ranker"},
    CommandHookLauncherConfig: {"rescale_command": "scale --to {workers}", "status_command": "scale --count"},
    OnlineTrainingPipeline: {"name": "ctr", "source": SOURCE},
}

ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["1", "8.0", "nan", "latest", "rates", "ewma", "IfNotPresent", "ctr", "127.0.0.1:9092"]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)

RULED = [
    (cls, f.name)
    for cls in DECLARATIONS
    for f in dataclasses.fields(cls)
    if rule_of(f) is not None and f.name not in DECLARATIONS[cls]
]


def test_the_table_covers_every_declaration_that_builds():
    for cls, kwargs in DECLARATIONS.items():
        cls(**kwargs)


@pytest.mark.parametrize("cls, name", RULED, ids=[f"{c.__name__}.{n}" for c, n in RULED])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=ANY_VALUE)
def test_any_value_is_held_as_allowed_or_refused_by_name(cls, name, value):
    kind, optional = field_types(cls)[name]
    rule = rule_of(next(f for f in dataclasses.fields(cls) if f.name == name))
    assert rule is not None
    try:
        built = cls(**DECLARATIONS[cls], **{name: value})
    except KaleConfigError as err:
        fields = {e.field for e in err.errors}
        assert any(name in f for f in fields), f"{cls.__name__}.{name}={value!r} refused as {fields}: {err}"
        assert "\n" not in str(err)
        return
    held = getattr(built, name)
    assert rule.problem(held, kind, optional) is None, f"{cls.__name__}.{name} holds {held!r}"
    if isinstance(held, float):
        assert math.isfinite(held)
