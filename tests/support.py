"""What several test modules share: waiting on a running system, and stand-ins behind the real interfaces."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional

from kale_dagster.launchers.base import LauncherStatus, RescaleRecord


class StandInWorkers:
    """Behind the real trainer service: a group whose busy share the test sets, and that can fail a rescale."""

    def __init__(self, workers=2):
        self.workers, self.busy, self.fail, self.records = workers, 1.0, False, []

    def rescale(self, m, reason="rescale"):
        if self.fail:
            raise RuntimeError("the standbys did not come up")
        if m == self.workers:
            return None
        record = RescaleRecord(time=time.time(), from_workers=self.workers, to_workers=m, downtime_s=0.5, reason=reason)
        self.workers = m
        self.records.append(record)
        return record

    def status(self):
        rate = 100.0 * self.workers * self.busy
        return LauncherStatus(workers=self.workers, measures=True, reported=self.workers, busy_share=self.busy, samples_per_s=rate,
                              downtimes_s=tuple(r.downtime_s for r in self.records))


def wait_for(predicate: Callable, timeout: float, what: str, log: Optional[Path] = None, poll_s: float = 1.0):
    """The predicate's first truthy value within ``timeout`` seconds; on timeout, fails saying what, with the log's tail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    tail = f"; log:\n{log.read_text()[-4000:]}" if log is not None and log.exists() else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{tail}")
