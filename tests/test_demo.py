"""`kale demo` as the README runs it: starts everything, shows a status line, stops cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kale_dagster.stream.broker import free_loopback_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_demo_runs_and_stops_cleanly_on_ctrl_c(tmp_path):
    port = free_loopback_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kale_dagster.cli", "demo", "--no-dagster", "--port", str(port), "--day-minutes", "6"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        time.sleep(45)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    assert "EMULATING one GPU" in out
    assert "workers" in out and "lag" in out and "training" in out
    assert "summary: {" in out
