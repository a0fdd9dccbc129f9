"""The policy registry: one place that knows every scaling policy by name.

A policy is added by writing its module (the policy class and a
``PolicySpec`` at the bottom) and one line in ``kale_dagster.policies``.
The registry then drives everything that lists or builds policies: the
pipeline's allowed ``policy`` values, the backtest's policy list and
sweeps, ``kale backtest --policies``, and the Dagster decision.

Every policy is built from a :class:`Sizing`: what the deployment declares
(worker bounds, SLO) and what is known about the trainer (its throughput
model, its restart time), nothing policy-specific.  Policy-specific knobs
are keyword options of ``build``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from kale_dagster.errors import KaleConfigError
from kale_dagster.model.limits import Limits
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.model.types import ScalingPolicy


@dataclass(frozen=True)
class Sizing:
    """What every policy is built from: the pipeline's declared ``limits`` and what is known about its trainer.

    ``measured_restart_s`` is the restart time the controller measured from
    past rescales (None until there is one: ``restart_s`` is then the
    declared one), ``adequate_workers`` the fixed allocation that covers the
    peak (the static baseline; default ``max_workers``), ``partitions`` the
    topic's partition count where a policy needs it without per-partition
    offsets (KEDA in the simulator).
    """

    limits: Limits
    model: ThroughputModel
    measured_restart_s: float | None = None
    adequate_workers: int | None = None
    partitions: int | None = None

    @property
    def restart_s(self) -> float:
        """The restart time to plan with: measured, else declared."""
        return self.limits.restart_s if self.measured_restart_s is None else self.measured_restart_s


Build = Callable[..., ScalingPolicy]
Sweep = Callable[[Sizing], Sequence[tuple[dict, dict]]]


def _no_sweep(sizing: Sizing) -> Sequence[tuple[dict, dict]]:
    return ()


@dataclass(frozen=True)
class PolicySpec:
    """A registered policy.

    ``build(sizing, **options)`` makes a fresh policy; ``sweep(sizing)`` the
    settings a backtest tries for a baseline, as a user would tune it, each
    as (label, options of ``build``); ``uses_forecast`` says whether the
    policy reads ``Observation.forecast`` (the backtest feeds a forecaster
    only to those); ``uses_estimates`` whether it plans with the sizing's
    throughput model and restart time, so the controller rebuilds it when
    its estimates change (the others keep the settings they were built
    with, as a user configured them); ``variant_of`` names the policy this
    one is a variant of (another of Kale's planners): a pipeline may choose
    it, a comparison runs it among that policy's variants, never as a
    baseline.
    """

    name: str
    description: str
    build: Build
    sweep: Sweep = _no_sweep
    uses_forecast: bool = False
    uses_estimates: bool = False
    variant_of: str | None = None


class PolicyRegistry(Mapping[str, PolicySpec]):
    """Policies by name, in registration order (the order reports list them)."""

    def __init__(self, *specs: PolicySpec):
        self._specs: dict[str, PolicySpec] = {}
        for spec in specs:
            self.register(spec)

    def register(self, spec: PolicySpec) -> PolicySpec:
        if spec.name in self._specs:
            raise KaleConfigError("policy", f"a policy named {spec.name!r} is already registered")
        self._specs[spec.name] = spec
        return spec

    def unregister(self, name: str) -> None:
        self._specs.pop(name, None)

    def __getitem__(self, name: str) -> PolicySpec:
        try:
            return self._specs[name]
        except KeyError:
            raise KaleConfigError(
                "policy", f"unknown policy {name!r}; choose one of {', '.join(self._specs)}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def compared(self) -> list[str]:
        """The policies a comparison runs by default: Kale and the baselines, not Kale's variants."""
        return [name for name, spec in self._specs.items() if spec.variant_of is None]

    def build(self, name: str, sizing: Sizing, **options) -> ScalingPolicy:
        return self[name].build(sizing, **options)

    def parse(self, names: str, option: str = "--policies") -> list[str]:
        """A comma-separated list of registered names, checked; the error names ``option``."""
        chosen = [n.strip() for n in names.split(",") if n.strip()]
        unknown = [n for n in chosen if n not in self._specs]
        if unknown or not chosen:
            raise KaleConfigError(
                option, f"unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(self._specs)}"
            )
        return chosen
