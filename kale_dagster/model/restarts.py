"""Restarts as readings see them: each one's length, from the first reading that saw it under way to the first that
saw the group training again.  The observed launcher keeps the latest across sensor ticks (a group Kale does not
restart reports no downtime of its own), and the savings report reads them from the metrics history."""

from __future__ import annotations

from collections import deque


class RestartSpans:
    """The lengths of the restarts (or rebalances) seen so far, the latest ``keep`` of them (None: all)."""

    def __init__(self, keep: int | None = None):
        self.since: float | None = None
        self.lengths: deque[float] = deque(maxlen=keep)

    def saw(self, restarting: bool, now: float) -> None:
        if restarting and self.since is None:
            self.since = now
        elif not restarting and self.since is not None:
            self.lengths.append(now - self.since)
            self.since = None
