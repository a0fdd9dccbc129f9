"""A minimal progress bar on stderr for long CLI runs (silent when not a terminal or disabled)."""

from __future__ import annotations

import sys
import time


class ProgressBar:
    def __init__(self, label: str, enabled: bool = True, stream=None):
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled and self.stream.isatty()
        self._last = 0.0

    def update(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        now = time.monotonic()
        if done < total and now - self._last < 0.2:
            return
        self._last = now
        width = 30
        filled = int(width * done / total)
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
