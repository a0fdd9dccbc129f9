"""A trainer worker process: ``python -m kale_dagster.trainer.worker`` with the flags ``TrainerSettings`` derives.

Run under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment) or as a warm standby for
the local launcher (``--standby``: torch and the user's trainer module are imported, then the process waits for a
JSON line on stdin with rank, world size and rendezvous address; after the group stops it is a standby again).
The harness (``trainer.harness.Worker``) trains; this module owns the process: its flags, SIGTERM (every rank
leaves at the same step boundary, checkpointing), a launcher that went away, and a trainer that fails in a way a
restart would repeat (the process then emits ``failed`` and exits ``TRAINER_FAILED``, and the launcher does not
restart it).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from kale_dagster.errors import KaleConfigError
from kale_dagster.trainer.api import TrainerFailure
from kale_dagster.trainer.harness import Worker, WorkerState
from kale_dagster.trainer.protocol import TRAINER_FAILED, GroupAssignment, WorkerEvent, emit
from kale_dagster.trainer.settings import TrainerSettings, worker_parser


def parse_args(argv=None) -> argparse.Namespace:
    """The worker's flags (``trainer.settings``), checked by ``TrainerSettings``'s field rules."""
    parser = worker_parser()
    args = parser.parse_args(argv)
    try:
        TrainerSettings.from_args(args)
    except (KaleConfigError, ValueError) as exc:
        parser.error(str(exc))
    return args


def _leave_when_orphaned(parent: int, every_s: float = 1.0) -> None:
    """Stop as on SIGTERM once the launcher that started this worker is gone (killed, crashed): nothing would
    read its events, restart or stop it, and a new launcher would start a second group on the same partitions.
    Polling the parent works from any thread, where PR_SET_PDEATHSIG follows the thread that forked."""
    while os.getppid() == parent:
        time.sleep(every_s)
    os.kill(os.getpid(), signal.SIGTERM)


def _failed(why: str) -> int:
    """The user's trainer failed in a way a restart would repeat: one line for the operator, an event for the
    launcher (which then does not restart the group), and the exit code that says so."""
    print(f"kale trainer failed: {why}", file=sys.stderr, flush=True)
    emit(WorkerEvent.FAILED, reason=why[:2000])
    return TRAINER_FAILED


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        worker = Worker(args)
    except KaleConfigError as exc:  # the factory's path does not resolve in the worker's environment
        return _failed(str(exc))

    def on_stop(*_):
        if worker.state is WorkerState.STANDBY:
            sys.exit(0)  # a standby has nothing to save
        worker.stop_requested = True

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    threading.Thread(target=_leave_when_orphaned, args=(os.getppid(),), daemon=True).start()
    try:
        return _serve(worker, args)
    except TrainerFailure as exc:
        return _failed(str(exc))
    finally:
        if worker.committer is not None:
            worker.committer.close()  # the last checkpoint's offsets reach Kafka before the process exits


def _serve(worker: Worker, args) -> int:
    if not args.standby:
        env = os.environ
        return worker.serve(
            GroupAssignment(int(env["RANK"]), int(env["WORLD_SIZE"]), env["MASTER_ADDR"], int(env["MASTER_PORT"]))
        )
    # Standby: serve one group after another.  A worker stopped by a rescale
    # comes back here warm (torch imported, broker connection open), so the
    # next group starts without a new process; an empty line ends it.
    while True:
        emit(WorkerEvent.READY, pid=os.getpid())
        line = sys.stdin.readline()
        if not line.strip():
            return 0
        code = worker.serve(GroupAssignment.from_line(line))
        if code:
            return code


if __name__ == "__main__":
    code = main()
    # Everything durable is done (checkpoint fsynced, offsets committed, logs
    # closed).  Interpreter teardown of torch and gloo takes seconds on a busy
    # machine, and a rescale waits for the old group to exit: skip it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
