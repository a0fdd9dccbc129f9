"""The "adequate" baseline: a fixed allocation, typically the peak."""

from __future__ import annotations

from dataclasses import dataclass

from kale_dagster.errors import KaleConfigError
from kale_dagster.model.types import Decision, Observation
from kale_dagster.policies.registry import PolicySpec, Sizing

#: Shares of the adequate allocation a backtest sweeps.
SWEEP_SHARES = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@dataclass
class StaticPolicy:
    workers: int
    name: str = "static"
    sync_period_s: float = 60.0

    def __post_init__(self):
        if self.workers < 0:
            raise KaleConfigError("workers", f"must be >= 0, got {self.workers}")

    def decide(self, obs: Observation) -> Decision:
        return Decision(self.workers, self.name, f"fixed allocation of {self.workers} workers")

    def state(self) -> dict:
        return {}

    def load_state(self, state: dict) -> None:
        pass


def build(sizing: Sizing, workers: int | None = None) -> StaticPolicy:
    """The "adequate" allocation by default: enough workers for the peak."""
    return StaticPolicy(workers if workers is not None else (sizing.adequate_workers or sizing.limits.max_workers))


def sweep(sizing: Sizing) -> list[tuple[dict, dict]]:
    adequate = sizing.adequate_workers or sizing.limits.max_workers
    levels = sorted({max(1, round(share * adequate)) for share in SWEEP_SHARES})
    return [({"workers": w}, {"workers": w}) for w in levels]


SPEC = PolicySpec(
    name="static", description="a fixed allocation (the adequate one covers the peak)", build=build, sweep=sweep
)
