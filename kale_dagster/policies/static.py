"""The "adequate" baseline: a fixed allocation, typically the peak."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import KaleConfigError
from ..policy import Decision, Observation


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
