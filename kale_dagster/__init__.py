"""kale-dagster: Kale elastic GPU scheduling for online training, as a Dagster plugin.

The public API is re-exported here and imported on first use, so that a
trainer worker (``kale_dagster.trainer.worker``) starts without pandas,
scipy, Dagster or the planner.  The packages, in the order a decision flows
(docs/architecture.md):

* ``stream``: the Kafka source, telemetry, metrics history, producer, embedded broker;
* ``forecast``: traffic forecasters;
* ``model``: observations, decisions, throughput model, backlog, estimator, stabilizer;
* ``policies``: Kale and the baselines, by name;
* ``control``: the control loop that turns observations into rescales;
* ``launchers``: local processes or Kubernetes, rescaled by pause-and-restart;
* ``trainer``: the torch workers;
* ``sim``: the simulator and backtest;
* ``definitions``: the Dagster wiring (pipelines, assets, jobs, resources);
* ``cli`` and ``demo``: the ``kale`` command.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from kale_dagster.errors import InputDataError, KaleConfigError

__version__ = "0.1.0"

_EXPORTS = {
    "Decision": "kale_dagster.model.types",
    "Observation": "kale_dagster.model.types",
    "PartitionOffsets": "kale_dagster.model.types",
    "ScalingPolicy": "kale_dagster.model.types",
    "Limits": "kale_dagster.model.limits",
    "ThroughputModel": "kale_dagster.model.throughput",
    "stabilize": "kale_dagster.model.stabilizer",
    "Forecast": "kale_dagster.forecast.base",
    "Forecaster": "kale_dagster.forecast.base",
    "POLICIES": "kale_dagster.policies",
    "PolicySpec": "kale_dagster.policies",
    "Sizing": "kale_dagster.policies",
    "HPABehavior": "kale_dagster.policies",
    "HPAPolicy": "kale_dagster.policies",
    "HPAScalingPolicy": "kale_dagster.policies",
    "HPAScalingRules": "kale_dagster.policies",
    "KafkaScalerMetadata": "kale_dagster.policies",
    "KaleConfig": "kale_dagster.policies",
    "KalePolicy": "kale_dagster.policies",
    "KaleStabilizerConfig": "kale_dagster.policies",
    "KaleStabilizerPolicy": "kale_dagster.policies",
    "KedaKafkaPolicy": "kale_dagster.policies",
    "StaticPolicy": "kale_dagster.policies",
    "KafkaSource": "kale_dagster.stream.source",
    "LocalLauncherConfig": "kale_dagster.launchers",
    "KubernetesLauncherConfig": "kale_dagster.launchers",
    "ScaleTargetLauncherConfig": "kale_dagster.launchers",
    "CommandHookLauncherConfig": "kale_dagster.launchers",
    "ObservedGroupLauncherConfig": "kale_dagster.launchers",
    "OnlineTrainer": "kale_dagster.trainer.api",
    "TrainerContext": "kale_dagster.trainer.api",
    "Record": "kale_dagster.trainer.api",
    "OnlineTrainingPipeline": "kale_dagster.definitions.pipeline",
    "build_definitions": "kale_dagster.definitions.build",
    "OnlineTrainingPipelineComponent": "kale_dagster.definitions.component",
}

# Spelled out for type checkers; test_registries checks it lists every lazy export.
__all__ = [
    "InputDataError",
    "KaleConfigError",
    "Decision",
    "Observation",
    "PartitionOffsets",
    "ScalingPolicy",
    "Limits",
    "ThroughputModel",
    "stabilize",
    "Forecast",
    "Forecaster",
    "POLICIES",
    "PolicySpec",
    "Sizing",
    "HPABehavior",
    "HPAPolicy",
    "HPAScalingPolicy",
    "HPAScalingRules",
    "KafkaScalerMetadata",
    "KaleConfig",
    "KalePolicy",
    "KaleStabilizerConfig",
    "KaleStabilizerPolicy",
    "KedaKafkaPolicy",
    "StaticPolicy",
    "KafkaSource",
    "LocalLauncherConfig",
    "KubernetesLauncherConfig",
    "ScaleTargetLauncherConfig",
    "CommandHookLauncherConfig",
    "ObservedGroupLauncherConfig",
    "OnlineTrainer",
    "TrainerContext",
    "Record",
    "OnlineTrainingPipeline",
    "build_definitions",
    "OnlineTrainingPipelineComponent",
]


def __getattr__(name: str):
    if name in ("ScaleTargetConfig", "CommandHookConfig", "ObservedGroupConfig"):  # renamed: a warning each time
        return getattr(importlib.import_module("kale_dagster.launchers"), name)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kale_dagster' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)


if TYPE_CHECKING:  # for type checkers and IDEs; at run time names load on first use
    from kale_dagster.definitions.build import build_definitions
    from kale_dagster.definitions.component import OnlineTrainingPipelineComponent
    from kale_dagster.definitions.pipeline import OnlineTrainingPipeline
    from kale_dagster.forecast.base import Forecast, Forecaster
    from kale_dagster.launchers import (
        CommandHookLauncherConfig,
        KubernetesLauncherConfig,
        LocalLauncherConfig,
        ObservedGroupLauncherConfig,
        ScaleTargetLauncherConfig,
    )
    from kale_dagster.model.limits import Limits
    from kale_dagster.model.stabilizer import stabilize
    from kale_dagster.model.throughput import ThroughputModel
    from kale_dagster.model.types import Decision, Observation, PartitionOffsets, ScalingPolicy
    from kale_dagster.policies import (
        POLICIES,
        HPABehavior,
        HPAPolicy,
        HPAScalingPolicy,
        HPAScalingRules,
        KafkaScalerMetadata,
        KaleConfig,
        KalePolicy,
        KaleStabilizerConfig,
        KaleStabilizerPolicy,
        KedaKafkaPolicy,
        PolicySpec,
        Sizing,
        StaticPolicy,
    )
    from kale_dagster.stream.source import KafkaSource
    from kale_dagster.trainer.api import OnlineTrainer, Record, TrainerContext
