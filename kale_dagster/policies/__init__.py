"""Scaling policies: Kale and the baselines it is measured against."""

from .hpa import HPABehavior, HPAPolicy, HPAScalingPolicy, HPAScalingRules
from .kale import KaleConfig, KalePolicy
from .keda import KedaKafkaPolicy
from .static import StaticPolicy

__all__ = [
    "HPABehavior",
    "HPAPolicy",
    "HPAScalingPolicy",
    "HPAScalingRules",
    "KaleConfig",
    "KalePolicy",
    "KedaKafkaPolicy",
    "StaticPolicy",
]
