"""kale-dagster: Kale elastic GPU scheduling for online training, as a Dagster plugin.

The public API is re-exported here; see the README for an overview.
"""

from .errors import InputDataError, KaleConfigError
from .forecast.base import Forecast, Forecaster
from .policies import (
    HPABehavior,
    HPAPolicy,
    HPAScalingPolicy,
    HPAScalingRules,
    KaleConfig,
    KalePolicy,
    KedaKafkaPolicy,
    StaticPolicy,
)
from .policies.keda import KafkaScalerMetadata
from .policy import Decision, Observation, PartitionOffsets, ScalingPolicy
from .pipeline import KafkaSource, OnlineTrainingPipeline, build_definitions
from .stabilizer import stabilize
from .throughput import ThroughputModel

__version__ = "0.1.0"

__all__ = [
    "Decision",
    "Forecast",
    "Forecaster",
    "HPABehavior",
    "HPAPolicy",
    "HPAScalingPolicy",
    "HPAScalingRules",
    "InputDataError",
    "KafkaSource",
    "OnlineTrainingPipeline",
    "build_definitions",
    "KafkaScalerMetadata",
    "KaleConfig",
    "KaleConfigError",
    "KalePolicy",
    "KedaKafkaPolicy",
    "Observation",
    "PartitionOffsets",
    "ScalingPolicy",
    "StaticPolicy",
    "ThroughputModel",
    "stabilize",
]
