"""The one launcher contract: what the controller and the rescale run call, whatever runs the workers.

As Dagster's ``RunLauncher`` is for runs, :class:`Launcher` is for a pipeline's worker group: a few abstract
methods (``status``, ``rescale``) and optional abilities declared by ``supports_*``
properties with their defaults (``supports_retarget``: a restart under way can be pointed at a larger
group).  Every launcher derives from it: the local trainer service's client, the Kubernetes Job launcher, a
scale target, the team's own commands, and a consumer group Kale only observes.  A pipeline's
``LauncherConfig`` (the declaration) builds one per process (``OnlineTrainingPipeline.launcher_instance``):
the code server's sensor ticks share it, so what it learns between ticks is its own memory.

:class:`GroupLauncher` is the base of the launchers that own their group's processes and change its size by
pause-and-restart (local processes, a Kubernetes Job).  It owns what must mean the same for each:

* downtime: from the moment the launcher is asked to rescale until every
  worker of the new group has taken its first training step (or, on an
  idle stream, has read its partitions to the end).  The Kubernetes
  launcher reads the same ``step`` event from the pods' logs that the local
  launcher reads from its processes (``trainer.protocol.WorkerEvent``);
* the records of every restart, with where the time went (``phases``);
* idempotence: a rescale to the size already running does nothing;
* one restart at a time per launcher, which ``retarget`` can point at a
  larger group while it runs (a burst met by a scale-in's restart).
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING

from kale_dagster.errors import KaleConfigError

if TYPE_CHECKING:
    from kale_dagster.stream.source import KafkaSource
    from kale_dagster.trainer.api import TrainerSpec


@dataclass(frozen=True)
class RescaleRecord:
    """One restart of the worker group; ``downtime_s`` runs from the request to the first step at the new size."""

    time: float
    from_workers: int
    to_workers: int
    downtime_s: float
    reason: str
    phases: dict = field(default_factory=dict, compare=False)  # where the downtime went, in seconds
    output: str = field(default="", compare=False)  # what a rescale command printed (its last lines)


@dataclass(frozen=True)
class LauncherStatus:
    """What a launcher reports of its group now: the controller's view of what actually runs.

    ``workers`` is the allocation (the running group, or the target of a
    restart in progress: its GPUs are held); ``reported`` counts the ranks
    that have reported metrics since the group started, and ``busy_share``
    and ``samples_per_s`` are set once all have (a group still starting
    gives no utilization, as pods that are not ready give HPA none).
    ``saturated`` says the group never waited for data over those reports:
    only then is ``samples_per_s`` its capacity F(w) rather than the arrival rate.
    ``downtimes_s`` are the latest restarts' measured downtimes, oldest first
    (a start from no workers is not one).
    ``measures`` says whether the launcher relays the workers' metrics at all.
    ``failed`` says why the running group has failed (a pod OOM-killed, its node lost or preempted) when
    nothing will restart it but a rescale; empty otherwise.  ``poison_records`` counts the records the
    running workers skipped because they were not valid samples; ``checkpoint_error`` why the
    group's last checkpoint could not be written (empty once one is).  ``metric`` is the trainer's
    progressive-validation metric (``metric_name``: auc, mae, ...), the mean over the ranks that report one.
    ``observed_from`` says how the worker count of a group Kale does not run was observed.
    ``capacity`` is the most workers the cluster ran when last asked for more, while that finding holds (it
    lapses after a declared time, or once GPUs free up); ``capacity_note`` says what was asked, what was found and
    when.  None: no shortfall is known.
    """

    workers: int
    rescaling: bool = False
    measures: bool = False
    reported: int = 0
    busy_share: float | None = None
    samples_per_s: float | None = None
    saturated: bool | None = None
    downtimes_s: tuple[float, ...] = ()
    emulated: bool = False
    failed: str = ""
    poison_records: int = 0
    checkpoint_error: str = ""
    metric_name: str = ""
    metric: float | None = None
    observed_from: str = ""
    capacity: int | None = None
    capacity_note: str = ""

    @property
    def model_metric(self) -> tuple[str, float] | None:
        """(name, value) of the trainer's progressive-validation metric, when the workers report one."""
        return (self.metric_name, self.metric) if self.metric is not None else None

    def to_dict(self) -> dict:
        return {**asdict(self), "downtimes_s": list(self.downtimes_s)}

    @classmethod
    def from_dict(cls, data: dict) -> LauncherStatus:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["downtimes_s"] = tuple(values.get("downtimes_s", ()))
        return cls(**values)


class Retargeted(Exception):
    """Raised by ``Launcher._check_retarget`` inside ``_replace_group``: form a group of ``workers`` instead."""

    def __init__(self, workers: int):
        super().__init__(workers)
        self.workers = workers


def retarget_note(workers: int, after_s: float, reason: str) -> str:
    """What a retargeted restart's record adds to its reason, the same for every launcher."""
    return f"retargeted to {workers} after {after_s:.1f} s: {reason}"


class CapacityShortfall(Exception):
    """Raised by ``_replace_group`` once it has formed a group of ``workers``, smaller than asked for, because the
    cluster could not place more (``note`` says what it found); ``phases`` as ``_replace_group`` returns them."""

    def __init__(self, workers: int, note: str, phases: dict):
        super().__init__(note)
        self.workers, self.note, self.phases = workers, note, phases


class RescaleFailed(RuntimeError):
    """The new worker group could not start; ``restored`` is the size put back (None if none)."""

    def __init__(self, message: str, restored: int | None):
        super().__init__(message)
        self.restored = restored


class Launcher(ABC):
    """Runs one pipeline's worker group at the size the controller decides (see the module docstring)."""

    @abstractmethod
    def status(self) -> LauncherStatus:
        """What runs now: the controller's view of the group."""

    @abstractmethod
    def rescale(self, m: int, reason: str = "rescale") -> RescaleRecord | None:
        """Run the group at ``m`` workers (0: none) and return the restart's record once the new group trains;
        None when it already runs at ``m``.  Raises ``RescaleFailed`` (with what was put back) or
        ``RuntimeError`` (the launcher cannot be reached, or refuses)."""

    @property
    def workers(self) -> int:
        """Workers allocated now (0 when none runs)."""
        return self.status().workers

    @property
    def supports_retarget(self) -> bool:
        """Whether ``retarget`` can point a restart under way at a larger group, from any process that built this
        launcher (the sensor's, while the rescale run waits on the restart)."""
        return False

    def retarget(self, m: int, reason: str = "retarget") -> bool:
        """Point the restart under way at ``m`` workers, more than it aims at; False when there is none to
        redirect, ``m`` is not larger, or this launcher cannot (``supports_retarget``)."""
        return False


class GroupLauncher(Launcher):
    """A launcher that owns its group's processes and replaces the group to resize it (see the module docstring).

    Subclasses fill in how a group is replaced (``_replace_group``), how many workers run, whether the group
    already runs at a size, and how to stop; one whose ``_replace_group`` calls ``_check_retarget`` where it can
    give up the group it is forming says so with ``supports_retarget``."""

    #: Called with each record after a restart (e.g. to plan with the measured downtime).
    on_record: Callable[[RescaleRecord], None] | None = None

    #: How many recent restarts ``status`` reports.
    recent_restarts = 5

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.records: list[RescaleRecord] = []
        self._clock = clock
        self._lock = threading.RLock()
        self._target: int | None = None  # set while a restart is in progress
        # A retarget asked for and not yet taken by the restart; its own lock, since the restart holds _lock.
        self._retarget_lock = threading.Lock()
        self._wanted: int | None = None
        self._retarget_reason = ""
        self.retarget_requested = threading.Event()  # set with _wanted, so waits can end early

    # --- filled in by each launcher ------------------------------------------------

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

    def _scale_to_zero(self) -> dict:
        """Stop the running group (checkpointing) and start none, for ``min_workers: 0``; the launcher stays
        usable.  Returns the phases, in seconds.  By default ``stop``, for launchers that can start again."""
        started = self._clock()
        self.stop()
        return {"stop": round(self._clock() - started, 3)}

    def _measurements(self) -> dict:
        """What the workers report (``reported``, ``busy_share``, ``samples_per_s``, ``emulated``);
        nothing by default."""
        return {}

    def _capacity(self) -> dict:
        """``capacity`` and ``capacity_note`` of the status while a shortfall found by a rescale holds; nothing by
        default (a launcher that cannot run short of capacity)."""
        return {}

    def _failure(self) -> str:
        """Why the running group failed and stays down until restarted; empty by default (a launcher
        that supervises its workers restarts them itself)."""
        return ""

    def _check_retarget(self, final: bool = False) -> None:
        """Raise ``Retargeted`` if a retarget was asked for: ``_replace_group`` calls it where it can give up the
        group it is forming, and gives that group up before letting the exception through.  ``final``: the group
        has formed, and without a retarget none is accepted from now on."""
        with self._retarget_lock:
            wanted, self._wanted = self._wanted, None
            self.retarget_requested.clear()
            if wanted is not None or final:
                self._target = wanted
        if wanted is not None:
            raise Retargeted(wanted)

    # --- shared ------------------------------------------------------------------------

    @property
    @abstractmethod
    def workers(self) -> int:
        """Workers in the running group (0 when none runs)."""

    def status(self) -> LauncherStatus:
        target = self._wanted or self._target
        if target is not None:
            return LauncherStatus(workers=target, rescaling=True, downtimes_s=self._recent_downtimes())
        return LauncherStatus(
            workers=self.workers,
            downtimes_s=self._recent_downtimes(),
            failed=self._failure(),
            **self._measurements(),
            **self._capacity(),
        )

    def _recent_downtimes(self) -> tuple[float, ...]:
        """The latest restarts' downtimes, each from its last retarget on (a restart, as the planner prices one);
        a start from nothing and a stop to nothing are not restarts."""
        return tuple(
            r.downtime_s - r.phases.get("abandoned", 0.0)
            for r in self.records
            if r.from_workers > 0 and r.to_workers > 0
        )[-self.recent_restarts :]

    def start(self, n: int, reason: str = "start") -> RescaleRecord:
        return self._restart(n, reason)

    def rescale(self, m: int, reason: str = "rescale") -> RescaleRecord | None:
        """Restart the group at ``m`` workers, or stop it at 0; None when it already runs at ``m`` (idempotent)."""
        with self._lock:
            if self._running_at(m) if m else self.workers == 0:
                return None
            return self._restart(m, reason)

    def retarget(self, m: int, reason: str = "retarget") -> bool:
        """Point the restart under way at ``m`` workers, more than it aims at: the group it is forming is given up
        and one of ``m`` formed instead, from the checkpoint the stopped group wrote.  False when there is no restart
        to redirect (none runs, it has ended, or this launcher cannot) or ``m`` is not larger; then ``rescale``."""
        with self._retarget_lock:
            aim = self._wanted or self._target
            if not self.supports_retarget or aim is None or m <= aim:
                return False
            self._wanted, self._retarget_reason = m, reason
            self.retarget_requested.set()
            return True

    def _restart(self, n: int, reason: str) -> RescaleRecord:
        if n < 0:
            raise KaleConfigError("workers", f"must be >= 0, got {n}")
        with self._lock:
            started, previous = self._clock(), self.workers
            self._target, abandoned, notes = n, 0.0, []
            try:
                while True:
                    try:
                        phases = self._replace_group(n) if n else self._scale_to_zero()
                        self._check_retarget(final=True)  # one accepted as the group formed: replace that too
                        break
                    except Retargeted as r:
                        n, abandoned = r.workers, self._clock() - started
                        notes.append(retarget_note(n, abandoned, self._retarget_reason))
                    except CapacityShortfall as short:  # formed at what the cluster could place
                        n, phases = short.workers, short.phases
                        notes.append(short.note)
                        break
            finally:
                with self._retarget_lock:
                    self._target = self._wanted = None
                    self.retarget_requested.clear()
            if notes:
                phases = {**phases, "abandoned": round(abandoned, 3)}
            record = RescaleRecord(
                time=time.time(),
                from_workers=previous,
                to_workers=n,
                downtime_s=self._clock() - started,
                reason="; ".join([reason, *notes]),
                phases=phases,
            )
            self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)
        return record


class LauncherConfig(ABC):
    """Where a pipeline's workers run; ``build`` makes the launcher the rescale job drives.

    ``rescale_timeout_s`` bounds how long one rescale run can take (stop, start, first step); a run in
    flight for longer has lost its process (a killed daemon or node takes its run along) and is failed.
    """

    rescale_timeout_s: float = 900.0

    @abstractmethod
    def build(self, pipeline: str, source: KafkaSource, trainer: TrainerSpec, workers_per_pod: int = 1) -> Launcher:
        """The launcher for ``pipeline``, running ``trainer`` on ``source``; a launcher that places workers in
        pods places ``workers_per_pod`` in each (the others run them one process each)."""

    @abstractmethod
    def describe(self) -> str:
        """Where the workers run, for messages (a URL, a cluster namespace)."""

    @property
    def runs_kale_trainer(self) -> bool:
        """Whether the workers are Kale's trainer harness, not the team's own workload."""
        return False

    def source_problem(self, source: KafkaSource) -> KaleConfigError | None:
        """What this launcher cannot do with ``source`` (checked with the pipeline, when the code loads)."""
        return None

    @property
    def rescale_run_tags(self) -> dict[str, str]:
        """Tags of the ``<pipeline>_rescale`` runs beyond Kale's own (on Kubernetes: the service account that
        may resize the workers, for those runs only)."""
        return {}
