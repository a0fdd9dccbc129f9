"""Stopping child processes that run in their own process group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def stop_process_group(proc: subprocess.Popen | None, timeout: float) -> None:
    """SIGTERM the process group of ``proc``, then SIGKILL it if it has not exited within ``timeout``.

    Children started with ``start_new_session=True`` lead their own group,
    so this reaches everything they spawned (dagster dev's daemon and
    webserver, torchrun's workers).  Idempotent.
    """
    if proc is None or proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            continue
