"""What workers and launchers exchange, typed once for both sides.

* A worker reports to its launcher as JSON lines on stdout, one
  :class:`WorkerEvent` each (the Kubernetes launcher reads the same lines
  from the pods' logs).
* A warm standby is sent its place in a group as one JSON line on stdin
  (:class:`GroupAssignment`); an empty line releases it.
* At every step the ranks all-gather one :class:`StepStatus` each, and
  every rank derives the same plan from the same table.

Standard library only: the worker imports this before torch.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from enum import Enum

#: Seconds a collective may wait for a missing rank before the group fails
#: (a hung or dead peer), for workers and for the settings that start them.
COLLECTIVE_TIMEOUT_S = 60.0
#: A worker's exit code when the user's trainer failed in a way a restart would repeat (its factory raised,
#: its loss is not finite): the launcher reports the group failed instead of restarting it in a loop.
TRAINER_FAILED = 3


class WorkerEvent(str, Enum):
    READY = "ready"  # torch imported, model built: can join a group at once
    STARTED = "started"  # joined the group, checkpoint restored, consumer open
    STEP = "step"  # first training step done (or caught up on an idle stream)
    METRICS = "metrics"  # samples/s, busy share, idle share since the last metrics event
    CHECKPOINT = "checkpoint"  # a checkpoint was written and offsets committed (rank 0)
    STOPPED = "stopped"  # left the group after its final checkpoint
    FAILED = "failed"  # the user's trainer failed (``reason``); the process exits TRAINER_FAILED


def event_line(event: WorkerEvent, **fields) -> str:
    return json.dumps({"event": event.value, **fields})


def parse_event(line: str) -> tuple[WorkerEvent, dict] | None:
    """The event of one output line, or None for anything else (log noise, a partial line).

    A prefix before the JSON object (torchrun's ``[rank0]:``, a log shipper's
    timestamp) is skipped.
    """
    start = line.find("{")
    if start < 0:
        return None
    try:
        data = json.loads(line[start:])
        return WorkerEvent(data.pop("event")), data
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


@dataclass(frozen=True)
class GroupAssignment:
    """A standby's place in a new group: its rank, the group size and the rendezvous address."""

    rank: int
    world: int
    addr: str
    port: int

    def to_line(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_line(cls, line: str) -> GroupAssignment:
        data = json.loads(line)
        return cls(int(data["rank"]), int(data["world"]), str(data["addr"]), int(data["port"]))


@dataclass(frozen=True)
class StepStatus:
    """One rank's state at a step boundary, all-gathered by every rank."""

    own_queue: int  # samples fetched from its own partitions, not yet trained
    total_queue: int  # own plus forwarded samples
    accepting: bool  # below the low watermark since it last reached the high one
    stop: bool  # SIGTERM received: the whole group stops at this step
    checkpoint_due: bool  # its checkpoint interval elapsed: the whole group checkpoints

    def to_row(self) -> list[int]:
        return [self.own_queue, self.total_queue, int(self.accepting), int(self.stop), int(self.checkpoint_due)]

    @classmethod
    def from_row(cls, row) -> StepStatus:
        own, total, accepting, stop, due = (int(x) for x in row)
        return cls(own, total, bool(accepting), bool(stop), bool(due))


def emit(event: WorkerEvent, **fields) -> None:
    """Write one event to the launcher (the worker's standard output)."""
    try:
        print(event_line(event, **fields), flush=True)
    except BrokenPipeError:
        # The launcher that read these is gone: events go nowhere from now on, and the worker stops
        # gracefully (``_leave_when_orphaned``) instead of dying mid-step on a write.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class MetricsWindow:
    """What one rank did since the window opened: the basis of its metrics event."""

    def __init__(self):
        self.start, self.samples, self.steps, self.idle_steps, self.busy_s = time.monotonic(), 0, 0, 0, 0.0
        self.waited = False

    def add(self, samples: int, busy_s: float, full: bool) -> None:
        self.samples += samples
        self.steps += 1
        self.idle_steps += samples == 0
        self.busy_s += busy_s
        self.waited |= not full

    def wait(self) -> None:
        """The group found nothing to train."""
        self.waited = True

    def fields(self) -> dict:
        elapsed = time.monotonic() - self.start
        # busy_share is what GPU utilization reports (HPA's metric); idle_share
        # counts steps this rank sat out while others trained (imbalance).
        # saturated: no step of the window waited for data, so samples_per_s is
        # the group's capacity, F(w), not the arrival rate (the paper's profiling).
        return {
            "samples_per_s": self.samples / elapsed,
            "idle_share": self.idle_steps / max(self.steps, 1),
            "busy_share": min(self.busy_s / elapsed, 1.0),
            "saturated": self.steps > 0 and not self.waited,
        }
