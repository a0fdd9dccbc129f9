"""What every launcher provides: start, rescale, stop, and a record of each restart.

A launcher runs a pipeline's trainer workers at a chosen parallelism and
changes it by pause-and-restart.  Subclasses fill in how a group is
replaced (``_replace_group``), how many workers run, whether the group
already runs at a size, and how to stop; this base class owns what must
mean the same for every launcher:

* downtime: from the moment the launcher is asked to rescale until every
  worker of the new group has taken its first training step (or, on an
  idle stream, has read its partitions to the end).  The Kubernetes
  launcher reads the same ``step`` event from the pods' logs that the local
  launcher reads from its processes (``trainer.protocol.WorkerEvent``);
* the records of every restart, with where the time went (``phases``);
* idempotence: a rescale to the size already running does nothing;
* one restart at a time per launcher.

:class:`LauncherConfig` is the declaration side: a pipeline holds one
(local or Kubernetes) and builds its launcher from it with the pipeline's
``KafkaSource``.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from kale_dagster.errors import KaleConfigError

if TYPE_CHECKING:
    from kale_dagster.stream.source import KafkaSource


@dataclass(frozen=True)
class RescaleRecord:
    """One restart of the worker group; ``downtime_s`` runs from the request to the first step at the new size."""

    time: float
    from_workers: int
    to_workers: int
    downtime_s: float
    reason: str
    phases: dict = field(default_factory=dict, compare=False)  # where the downtime went, in seconds


class RescaleFailed(RuntimeError):
    """The new worker group could not start; ``restored`` is the size put back (None if none)."""

    def __init__(self, message: str, restored: Optional[int]):
        super().__init__(message)
        self.restored = restored


class Launcher(ABC):
    """Runs one pipeline's worker group; see the module docstring for what it guarantees."""

    #: Called with each record after a restart (e.g. to plan with the measured downtime).
    on_record: Optional[Callable[[RescaleRecord], None]] = None

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.records: list[RescaleRecord] = []
        self._clock = clock
        self._lock = threading.RLock()

    # --- filled in by each launcher ------------------------------------------------

    @property
    @abstractmethod
    def workers(self) -> int:
        """Workers in the running group (0 when none runs)."""

    @abstractmethod
    def _running_at(self, n: int) -> bool:
        """Whether a healthy group of exactly ``n`` workers is running."""

    @abstractmethod
    def _replace_group(self, n: int) -> dict:
        """Stop the running group (checkpointing) and start ``n`` workers; return once each
        has taken its first step.  Returns the phases of the downtime, in seconds."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every worker (each checkpoints and commits first)."""

    # --- shared ------------------------------------------------------------------------

    def start(self, n: int, reason: str = "start") -> RescaleRecord:
        return self._restart(n, reason)

    def rescale(self, m: int, reason: str = "rescale") -> Optional[RescaleRecord]:
        """Restart the group at ``m`` workers; None when it already runs at ``m`` (idempotent)."""
        with self._lock:
            if self._running_at(m):
                return None
            return self._restart(m, reason)

    def _restart(self, n: int, reason: str) -> RescaleRecord:
        if n < 1:
            raise KaleConfigError("workers", f"must be >= 1, got {n}")
        with self._lock:
            started, previous = self._clock(), self.workers
            phases = self._replace_group(n)
            record = RescaleRecord(time=time.time(), from_workers=previous, to_workers=n, downtime_s=self._clock() - started, reason=reason, phases=phases)
            self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)
        return record


class LauncherConfig(ABC):
    """Where a pipeline's workers run; ``build`` makes the launcher the rescale job drives."""

    @abstractmethod
    def build(self, pipeline: str, source: "KafkaSource"):
        """The launcher (or a client of one) for ``pipeline``, consuming ``source``."""

    @abstractmethod
    def describe(self) -> str:
        """Where the workers run, for messages (a URL, a cluster namespace)."""
