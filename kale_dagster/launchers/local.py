"""Local launcher: trainer workers as local processes, rescaled by pause-and-restart.

The interface every launcher implements (see ``launchers.base``): start at
n workers, rescale to m, stop, and report each rescale with its downtime,
measured from the request to the first completed training step at the new
size.

Why it is fast: a cold torchrun start spends seconds importing torch and
building the model before the first step, and a torch process takes
seconds more to tear down on a busy machine.  This launcher keeps a pool of
warm standby workers (torch imported, model built, waiting on stdin), and a
stopped worker goes back to that pool instead of exiting, so a rescale costs
the graceful stop (finish the step, checkpoint, commit), the rendezvous and
the checkpoint load.  New processes are started (in the background) only
when the pool is short.

Supervision: a worker that exits unexpectedly (crash, SIGKILL, or the
collective timeout when another rank hangs) takes the group down; the
launcher kills the survivors and restarts the group at the same size from
the last checkpoint, recording it as a ``crash-restart``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kale_dagster.errors import KaleConfigError, require_extra
from kale_dagster.launchers.base import GroupLauncher, RescaleRecord, Retargeted
from kale_dagster.stream.broker import free_loopback_port
from kale_dagster.trainer.location import is_object_store, require_store
from kale_dagster.trainer.protocol import (
    TRAINER_FAILED,
    GroupAssignment,
    WorkerEvent,
    parse_event,
)
from kale_dagster.trainer.settings import TrainerSettings

_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b:?")


class WorkerProcess:
    """One worker process and the JSON events it prints."""

    def __init__(self, settings: TrainerSettings, log_dir: Path):
        self.log_path = log_dir / f"worker-{time.time_ns()}.log"
        self.events: queue.Queue[tuple[WorkerEvent, dict]] = queue.Queue()
        self.latest_metrics: dict | None = None
        self.rank: int | None = None
        self.failure = ""  # the user's trainer failed, as the worker said (a FAILED event)
        self.released = False
        self.ready = threading.Event()  # torch imported, model built: can join a group at once
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kale_dagster.trainer.worker", *settings.argv(), "--standby"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(self.log_path, "wb"),
            text=True,
            env=settings.env(),
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None  # started with a pipe
        for line in self.proc.stdout:
            parsed = parse_event(line)
            if parsed is None:
                continue
            event, fields = parsed
            if event is WorkerEvent.METRICS:
                self.latest_metrics = fields
            elif event is WorkerEvent.FAILED:
                self.failure = str(fields.get("reason", "no reason given"))
            elif event is WorkerEvent.READY:
                self.ready.set()
            self.events.put(parsed)

    def wait_ready(self, timeout: float) -> None:
        """Like ``wait_for(READY)``, but any number of times: the flag outlives the consumed event."""
        if not self.ready.is_set():
            self.wait_for(WorkerEvent.READY, timeout)

    def wait_for(self, wanted: WorkerEvent, timeout: float, interrupt: threading.Event | None = None) -> dict | None:
        """The event's fields once the worker reports it; None if ``interrupt`` is set first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if interrupt is not None and interrupt.is_set():
                return None
            try:
                event, fields = self.events.get(timeout=min(0.2, max(deadline - time.monotonic(), 0.01)))
            except queue.Empty:
                if self.proc.poll() is not None:
                    if self.trainer_failure():
                        raise RuntimeError(f"the trainer failed: {self.failure}") from None
                    raise RuntimeError(
                        f"worker exited with code {self.proc.returncode} before '{wanted.value}': {self.last_error()} "
                        f"(log: {self.log_path})"
                    ) from None
                continue
            if event is wanted:
                return fields
        raise TimeoutError(f"worker did not report '{wanted.value}' within {timeout:.0f} s; see {self.log_path}")

    def trainer_failure(self) -> str:
        """Why the user's trainer failed, as the exited worker said (empty if it did not say): its last events,
        a FAILED one among them, are read first."""
        self._reader.join(1.0)
        return self.failure

    def last_error(self) -> str:
        """The worker's reason for exiting, from its log: the last exception line, else the last line."""
        try:
            lines = [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines()[-50:] if ln.strip()]
        except OSError:
            return "no log"
        for line in reversed(lines):
            if _EXCEPTION_LINE.match(line):
                return line
        return lines[-1] if lines else "nothing logged"

    def assign(self, group: GroupAssignment) -> None:
        self.rank = group.rank
        self.ready.clear()  # set again when it is back in standby
        self.latest_metrics = None
        assert self.proc.stdin is not None  # started with a pipe
        self.proc.stdin.write(group.to_line() + "\n")
        self.proc.stdin.flush()

    def release(self) -> None:
        """A standby worker that is not needed: an empty line makes it exit 0."""
        self.released = True
        stdin = self.proc.stdin  # started with a pipe
        with contextlib.suppress(OSError, ValueError, AttributeError):
            assert stdin is not None
            stdin.write("\n")
            stdin.flush()

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def alive(self) -> bool:
        return self.proc.poll() is None


class LocalLauncher(GroupLauncher):
    """Run and rescale a group of trainer workers on this machine.

    ``max_workers`` is the largest group there will be: standbys a scale-up to
    it could not use are not kept (each is a process holding memory, and a
    device on a GPU host), nor started after a rescale, when a process
    importing torch would slow the new group.  ``reuse_workers=False`` gives
    every group fresh processes, as torchrun restarts them.
    """

    @property
    def supports_retarget(self) -> bool:  # a group still forming is killed before its first step
        return True

    def __init__(
        self,
        settings: TrainerSettings,
        pool_size: int = 2,
        max_workers: int | None = None,
        reuse_workers: bool = True,
        log_dir: str | None = None,
        stop_timeout_s: float = 60.0,
        ready_timeout_s: float = 120.0,
        on_record: Callable[[RescaleRecord], None] | None = None,
    ):
        super().__init__()
        require_extra("torch", "trainer", "the local launcher's workers")
        require_store(settings.checkpoint_dir)  # the workers open it: a missing package fails here, in one line
        if max_workers is not None and max_workers < 1:
            raise KaleConfigError("max_workers", f"must be >= 1 or None, got {max_workers}")
        self.settings, self.pool_size, self.max_workers, self.reuse_workers = (
            settings,
            pool_size,
            max_workers,
            reuse_workers,
        )
        self.stop_timeout_s, self.ready_timeout_s, self.on_record = stop_timeout_s, ready_timeout_s, on_record
        self._group: list[WorkerProcess] = []
        self._pool: list[WorkerProcess] = []
        self._stopped = False
        self._failed = ""  # why the group's trainer failed; it stays down until a rescale
        # Beside the checkpoints on a volume; in object storage they are not files: then under .kale/ here.
        default_logs = Path(".kale/worker-logs") if is_object_store(settings.checkpoint_dir) else None
        self._log_dir = Path(log_dir or default_logs or Path(settings.checkpoint_dir) / "logs")
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._fill_pool(self._standbys_wanted(0))

    # --- the launcher interface --------------------------------------------------

    @property
    def workers(self) -> int:
        return len(self._group)

    def _running_at(self, n: int) -> bool:
        return n == self.workers and all(w.alive() for w in self._group)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True  # a background refill after this would leave a process behind
            self._pool.extend(self._stop_group())
            _retire(self._pool, wait=True)
            self._pool.clear()

    def _scale_to_zero(self) -> dict:
        """Stop the group; its workers checkpoint, commit and wait as standbys, so the next start is warm."""
        started = time.monotonic()
        self._pool = self._stop_for_reuse() + self._pool
        self._keep_standbys(0)
        self._failed = ""
        return {"stop": round(time.monotonic() - started, 3)}

    def wait_warm(self, timeout: float = 120.0) -> None:
        """Block until the standby pool is ready.  A standby starting up (a Python
        process importing torch) takes CPU from the group, so measurements wait."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                pool = list(self._pool)
            if len(pool) >= self._standbys_wanted(self.workers):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"standby pool not refilled within {timeout:.0f} s")
            time.sleep(0.05)
        for w in pool:
            w.wait_ready(max(deadline - time.monotonic(), 0.1))

    def supervise_once(self) -> RescaleRecord | None:
        """Restart the group from its last checkpoint if a worker died; None when all is well.

        A group whose trainer failed (``TRAINER_FAILED``: a restart would fail the same way) is not restarted
        here: the status says it failed and why, and only a rescale, which the controller retries with a
        growing delay, starts it again."""
        with self._lock:
            dead = [w for w in self._group if not w.alive() and w.proc.returncode != 0]
            if not dead or self._failed:
                return None
            # The rest of the group cannot checkpoint (its collective is broken) and one may be hung, not
            # stopping on SIGTERM: kill them now instead of waiting out the stop timeout.
            for w in self._group:
                if w.alive():
                    w.signal(signal.SIGKILL)
            failed = next((w for w in dead if w.proc.returncode == TRAINER_FAILED), None)
            if failed is not None:
                self._failed = f"the trainer failed: {failed.trainer_failure() or failed.last_error()}"
                return None
            return self._restart(
                self.workers, f"crash-restart (worker rank {dead[0].rank} exited {dead[0].proc.returncode})"
            )

    def per_rank_rates(self) -> dict[int, float]:
        """Latest samples/s of each rank that has reported (imbalance shows here)."""
        return {
            w.rank: w.latest_metrics["samples_per_s"] for w in self._group if w.latest_metrics and w.rank is not None
        }

    def _measurements(self) -> dict:
        """The workers' latest metrics events: samples/s in total, and the mean busy share
        (what GPU utilization would read), once every rank has reported."""
        latest = [w.latest_metrics for w in self._group if w.latest_metrics]
        complete = bool(latest) and len(latest) == len(self._group)
        return {
            "measures": True,
            "reported": len(latest),
            "busy_share": sum(m["busy_share"] for m in latest) / len(latest) if complete else None,
            "samples_per_s": sum(m["samples_per_s"] for m in latest) if complete else None,
            "saturated": all(m.get("saturated", False) for m in latest) if complete else None,
            "emulated": self.settings.emulate_gpu_rate > 0,
            "poison_records": sum(int(m.get("poison_records", 0)) for m in latest),
            "checkpoint_error": next((m["checkpoint_error"] for m in latest if m.get("checkpoint_error")), ""),
            **_quality(latest),
        }

    def _failure(self) -> str:
        return self._failed

    # --- internals ------------------------------------------------------------------

    def _fill_pool(self, size: int) -> None:
        while len(self._pool) < size:
            self._pool.append(WorkerProcess(self.settings, self._log_dir))

    def _stop_group(self) -> list:
        """SIGTERM the group; returns the workers that checkpointed and are standbys again.

        A worker that does not come back (crashed, or stuck past the stop
        timeout) is killed: only a clean stop is trusted to be reused.
        """
        for w in self._group:
            w.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        back = []
        for w in self._group:
            try:
                w.wait_for(WorkerEvent.READY, max(deadline - time.monotonic(), 0.1))
                back.append(w)
            except (TimeoutError, RuntimeError):
                _reap(w, 0.1)
        self._group = []
        return back

    def _abandon_group(self) -> None:
        """Kill a group that is still forming, for a retarget.  Safe before its first step: it has trained
        nothing, so it has written no checkpoint and committed no offset; a rank that did step is a crash
        (resumed from the last checkpoint), never a loss.  A stop would wait out its restore."""
        for w in self._group:
            w.signal(signal.SIGKILL)
        for w in self._group:
            _reap(w, 10.0)
        self._group = []

    def _stop_for_reuse(self) -> list:
        """Stop the group (each worker finishes its step, checkpoints, commits); the workers that may serve
        again, none unless ``reuse_workers``."""
        back = self._stop_group()
        if not self.reuse_workers:
            _retire(back, wait=True)  # as torchrun does: the old processes exit before the new group forms
            return []
        return back

    def _keep_standbys(self, group_size: int) -> None:
        """Release the standbys beyond what the pool keeps beside a group of ``group_size``."""
        keep = self._standbys_wanted(group_size)
        _retire(self._pool[keep:], wait=False)
        self._pool = self._pool[:keep]

    def _replace_group(self, n: int) -> dict:
        marks = [time.monotonic()]
        back = self._stop_for_reuse()
        marks.append(time.monotonic())
        # Warm processes first: the ones just stopped, then ready standbys.
        self._pool = back + sorted(self._pool, key=lambda w: not w.ready.is_set())
        self._fill_pool(n)
        group, self._pool = self._pool[:n], self._pool[n:]
        self._keep_standbys(n)
        for w in group:
            w.wait_ready(self.ready_timeout_s)  # instant for warm standbys
        marks.append(time.monotonic())
        self._check_retarget()  # nothing formed yet: the next attempt forms the larger group
        port = free_loopback_port()
        for rank, w in enumerate(group):
            w.assign(GroupAssignment(rank, n, "127.0.0.1", port))
        self._group = group
        self._failed = ""
        try:
            for event in (WorkerEvent.STARTED, WorkerEvent.STEP):  # rendezvous, checkpoint loaded, consumer open
                for w in group:
                    if w.wait_for(event, self.ready_timeout_s, interrupt=self.retarget_requested) is None:
                        self._check_retarget()
                marks.append(time.monotonic())
        except Retargeted:
            self._abandon_group()
            raise
        threading.Thread(target=self._refill, daemon=True).start()
        return dict(zip(("stop", "warm_up", "rendezvous_and_restore", "first_step"), np.diff(marks).round(3).tolist()))

    def _refill(self) -> None:
        with self._lock:
            if not self._stopped:
                self._fill_pool(self._standbys_wanted(self.workers))

    def _standbys_wanted(self, group_size: int) -> int:
        if self.max_workers is None:
            return self.pool_size
        return max(min(self.pool_size, self.max_workers - group_size), 0)


def _quality(latest: list[dict]) -> dict:
    """The trainer's progressive-validation metric over the group: the mean of the ranks that have a value."""
    values = [m["metric"] for m in latest if m.get("metric") is not None]
    names = {m["metric_name"] for m in latest if m.get("metric_name")}
    if not values or len(names) != 1:
        return {}
    return {"metric_name": names.pop(), "metric": sum(values) / len(values)}


def _retire(workers: list, wait: bool) -> None:
    """Release standbys (they exit 0) and reap them, now or in the background."""
    for w in workers:
        w.release()
    for w in workers:
        if wait:
            _reap(w, 10.0)
        else:
            threading.Thread(target=_reap, args=(w, 10.0), daemon=True).start()


def _reap(w: WorkerProcess, timeout: float) -> None:
    try:
        w.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        w.signal(signal.SIGKILL)
        w.proc.wait(10)
