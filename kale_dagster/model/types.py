"""Data types every scaling policy shares: what it observes and what it decides.

Policies are pure and deterministic given their inputs and their own small
state (HPA's recommendation history, KEDA's cooldown, Kale's last rescale),
so the Dagster path and the simulator drive exactly the same objects.  That
state is exported and restored as JSON-ready dicts (``state`` /
``load_state``), so a policy rebuilt by another process (a sensor tick, a
Dagster run) continues where the last one left off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kale_dagster.forecast.base import Forecast


@dataclass(frozen=True)
class PartitionOffsets:
    """One partition's end offset (None: missing from the broker's answer) and the trainer group's
    committed offset (None if none)."""

    partition: int
    end_offset: int | None
    committed: int | None
    earliest_offset: int = 0


@dataclass(frozen=True)
class Observation:
    """What a policy sees at one control-loop tick.

    ``workers`` is the current allocation (pods or processes requested, GPUs
    held), ``utilization`` the busy fraction of those workers (HPA's
    metric: 1.0 while a backlog exists, consumption/capacity otherwise).
    """

    time: float
    workers: int
    arrival_rate: float
    consumption_rate: float
    backlog: float
    time_lag_s: float
    utilization: float
    partitions: tuple[PartitionOffsets, ...] = ()
    forecast: Forecast | None = None
    forecast_error: float | None = None
    # The recent arrivals divided by what the forecast predicted for them (the ratio window): above 1, it ran low.
    forecast_ratio: float | None = None
    restarting: bool = False
    # While restarting: the launcher can still point the restart under way at a larger group (``Launcher.retarget``).
    retargetable: bool = False
    latest_arrival_rate: float | None = None  # over the last reading's interval only: a burst shows here first


@dataclass(frozen=True)
class Decision:
    """A policy's answer: how many workers to run, who decided and why."""

    workers: int
    policy: str
    reason: str
    plan: tuple[int, ...] = ()
    plan_step_s: float = 0.0
    details: dict = field(default_factory=dict, compare=False)


@runtime_checkable
class ScalingPolicy(Protocol):
    """Anything that turns observations into decisions at a fixed cadence.

    ``state`` returns what ``decide`` remembers between calls as a
    JSON-serialisable dict, and ``load_state`` restores it.
    """

    @property
    def name(self) -> str: ...

    @property
    def sync_period_s(self) -> float: ...

    def decide(self, obs: Observation) -> Decision: ...

    def state(self) -> dict: ...

    def load_state(self, state: dict) -> None: ...
