"""What every launcher provides: start, rescale, stop, and a record of each restart."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol, runtime_checkable


@dataclass(frozen=True)
class RescaleRecord:
    """One restart of the worker group; ``downtime_s`` runs from the decision to the first step at the new size
    (or, on an idle stream, until every worker has read its partitions to the end)."""

    time: float
    from_workers: int
    to_workers: int
    downtime_s: float
    reason: str
    phases: dict = field(default_factory=dict, compare=False)  # where the downtime went, in seconds


@runtime_checkable
class Launcher(Protocol):
    @property
    def workers(self) -> int: ...

    def start(self, n: int, reason: str = "start") -> RescaleRecord: ...

    def rescale(self, m: int, reason: str = "rescale") -> Optional[RescaleRecord]: ...

    def stop(self) -> None: ...
