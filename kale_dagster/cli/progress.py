"""Progress of long CLI runs on stderr, with elapsed time and ETA (tqdm), silent when not a terminal or disabled."""

from __future__ import annotations

import sys

from tqdm import tqdm


class ProgressBar:
    """Fed ``update(done, total)`` by a callback, as the evaluators report their progress."""

    def __init__(self, label: str, enabled: bool = True, stream=None):
        self.label, self.stream = label, stream or sys.stderr
        # disable=None: tqdm stays silent when the stream is not a terminal (a pipe, CI's log).
        self.disable = None if enabled else True
        self._bar: tqdm | None = None

    def update(self, done: int, total: int) -> None:
        if total <= 0:
            return
        if self._bar is None:
            self._bar = tqdm(total=total, desc=self.label, file=self.stream, disable=self.disable, leave=True)
        self._bar.total = total
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
