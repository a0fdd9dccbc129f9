"""Scaling policies: Kale and the baselines it is measured against, by name.

``POLICIES`` is the registry (see ``registry``): adding a policy takes its
module, with a ``SPEC`` at the bottom, and one line below.
"""

from kale_dagster.policies import hpa, keda, static
from kale_dagster.policies.hpa import HPAPolicy
from kale_dagster.policies.hpa_behavior import HPABehavior, HPAScalingPolicy, HPAScalingRules
from kale_dagster.policies.kale import (
    KaleConfig,
    KalePolicy,
    KaleStabilizerConfig,
    KaleStabilizerPolicy,
    receding,
    stabilizer,
)
from kale_dagster.policies.keda import KafkaScalerMetadata, KedaKafkaPolicy
from kale_dagster.policies.registry import PolicyRegistry, PolicySpec, Sizing
from kale_dagster.policies.static import StaticPolicy

POLICIES = PolicyRegistry(
    receding.SPEC,
    stabilizer.SPEC,
    hpa.SPEC,
    keda.SPEC,
    static.SPEC,
)

__all__ = [
    "POLICIES",
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
    "PolicyRegistry",
    "PolicySpec",
    "Sizing",
    "StaticPolicy",
]
