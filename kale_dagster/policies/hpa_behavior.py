"""An HPA's ``spec.behavior``, as Kubernetes writes it and fills it in: the scaling rules of each direction
(stabilization window, rate policies, which policy wins, tolerance), upstream's defaults for a direction left out
(GenerateHPAScaleUpRules / GenerateHPAScaleDownRules), and the API server's refusals (validation.go's
validateScalingRules).  ``policies.hpa`` runs them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from kale_dagster.errors import KaleConfigError


@dataclass(frozen=True)
class HPAScalingPolicy:
    type: Literal["Pods", "Percent"]
    value: int
    period_seconds: float  # upstream takes whole seconds; fractions serve compressed-time runs


@dataclass(frozen=True)
class HPAScalingRules:
    stabilization_window_seconds: float
    policies: tuple[HPAScalingPolicy, ...]
    select_policy: Literal["Max", "Min", "Disabled"] = "Max"
    tolerance: float | None = None  # Kubernetes 1.33+; None: the controller's --horizontal-pod-autoscaler-tolerance


@dataclass(frozen=True)
class HPABehavior:
    scale_up: HPAScalingRules
    scale_down: HPAScalingRules

    @classmethod
    def default(cls) -> HPABehavior:
        """The rules Kubernetes fills in for a direction ``behavior`` leaves out (GenerateHPAScaleUpRules /
        GenerateHPAScaleDownRules; the scale-down window is the controller's 300 s default)."""
        return cls(
            scale_up=HPAScalingRules(0, (HPAScalingPolicy("Pods", 4, 15), HPAScalingPolicy("Percent", 100, 15)), "Max"),
            scale_down=HPAScalingRules(300, (HPAScalingPolicy("Percent", 100, 15),), "Max"),
        )

    @classmethod
    def from_spec(cls, spec: Mapping) -> HPABehavior:
        """From an HPA's ``spec.behavior`` as Kubernetes writes it (``scaleUp``/``scaleDown``, each with
        ``stabilizationWindowSeconds``, ``policies`` and ``selectPolicy``); a direction left out keeps its default.
        Refused as the API server refuses it (validation.go's validateScalingRules), every problem at once."""
        default = cls.default()
        problems: list[KaleConfigError] = []

        def rules(key: str, fallback: HPAScalingRules) -> HPAScalingRules:
            given = spec.get(key)
            if given is None:
                return fallback
            here = f"behavior.{key}"
            unknown = set(given) - {"stabilizationWindowSeconds", "policies", "selectPolicy", "tolerance"}
            if unknown:
                problems.append(KaleConfigError(here, f"unknown field(s) {', '.join(sorted(unknown))}"))
            policies = tuple(
                _policy(f"{here}.policies[{i}]", p, problems) for i, p in enumerate(given.get("policies", ()))
            )
            window = float(given.get("stabilizationWindowSeconds", fallback.stabilization_window_seconds))
            if not 0 <= window <= MAX_STABILIZATION_WINDOW_S:
                problems.append(
                    KaleConfigError(
                        f"{here}.stabilizationWindowSeconds",
                        f"must be in [0, {MAX_STABILIZATION_WINDOW_S:g}], got {window:g}",
                    )
                )
            select = given.get("selectPolicy", fallback.select_policy)
            if select not in SELECT_POLICIES:
                problems.append(
                    KaleConfigError(
                        f"{here}.selectPolicy", f"must be one of {', '.join(SELECT_POLICIES)}, got {select!r}"
                    )
                )
            tolerance = given.get("tolerance")
            if tolerance is not None and not 0 <= float(tolerance):
                problems.append(KaleConfigError(f"{here}.tolerance", f"must be >= 0, got {tolerance}"))
            return HPAScalingRules(
                window, policies or fallback.policies, select, None if tolerance is None else float(tolerance)
            )

        unknown = set(spec) - {"scaleUp", "scaleDown"}
        if unknown:
            problems.append(
                KaleConfigError("behavior", f"unknown field(s) {', '.join(sorted(unknown))}; use scaleUp and scaleDown")
            )
        behavior = cls(rules("scaleUp", default.scale_up), rules("scaleDown", default.scale_down))
        if problems:
            raise KaleConfigError.join(problems)
        return behavior


#: validation.go's bounds on a behavior.
MAX_STABILIZATION_WINDOW_S = 3600.0
MAX_PERIOD_S = 1800.0
SELECT_POLICIES = ("Max", "Min", "Disabled")
POLICY_TYPES = ("Pods", "Percent")


def _policy(here: str, given: Mapping, problems: list[KaleConfigError]) -> HPAScalingPolicy:
    """One of a direction's ``policies``; what is wrong with it goes to ``problems``."""
    kind, value, period = given.get("type"), int(given.get("value", 0)), float(given.get("periodSeconds", 0))
    if kind not in POLICY_TYPES:
        problems.append(KaleConfigError(f"{here}.type", f"must be one of {', '.join(POLICY_TYPES)}, got {kind!r}"))
    if value <= 0:
        problems.append(KaleConfigError(f"{here}.value", f"must be > 0, got {value}"))
    if not 0 < period <= MAX_PERIOD_S:
        problems.append(KaleConfigError(f"{here}.periodSeconds", f"must be in (0, {MAX_PERIOD_S:g}], got {period:g}"))
    return HPAScalingPolicy(kind, value, period)  # type: ignore[arg-type]  # refused above when not a type
