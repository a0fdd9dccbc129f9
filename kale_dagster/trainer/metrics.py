"""Progressive-validation metrics: each batch is scored before it is trained on, over a rolling window.

Both follow ``kale_dagster.trainer.api.ProgressiveMetric``: ``update(predictions, batch)`` reads the
targets with the ``targets`` function given (a batch is the user's own type), ``value()`` is over the last
``window`` samples and NaN until it is defined.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np


def _numpy(values: Any) -> np.ndarray:
    if hasattr(values, "detach"):  # a tensor, on any device
        values = values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=np.float64).reshape(-1)


class _Rolling:
    def __init__(self, targets: Callable[[Any], Any], window: int):
        self.targets = targets
        self.scores: deque = deque(maxlen=window)
        self.labels: deque = deque(maxlen=window)

    def update(self, predictions: Any, batch: Any) -> None:
        self.add(_numpy(predictions), _numpy(self.targets(batch)))

    def add(self, scores: np.ndarray, labels: np.ndarray) -> None:
        self.scores.extend(scores.tolist())
        self.labels.extend(labels.tolist())


class RollingAUC(_Rolling):
    """Area under the ROC curve of scores against 0/1 labels (a click model's metric)."""

    name = "auc"

    def __init__(self, targets: Callable[[Any], Any] = lambda batch: batch["label"], window: int = 20_000):
        super().__init__(targets, window)

    def value(self) -> float:
        y = np.asarray(self.labels)
        s = np.asarray(self.scores)
        pos, neg = y.sum(), len(y) - y.sum()
        if pos == 0 or neg == 0:
            return float("nan")
        ranks = np.empty(len(s))
        ranks[np.argsort(s, kind="mergesort")] = np.arange(1, len(s) + 1)
        return float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))


class RollingMAE(_Rolling):
    """Mean absolute error of predictions against targets (a regression's metric)."""

    name = "mae"

    def __init__(self, targets: Callable[[Any], Any] = lambda batch: batch["target"], window: int = 20_000):
        super().__init__(targets, window)

    def value(self) -> float:
        if not self.labels:
            return float("nan")
        return float(np.mean(np.abs(np.asarray(self.scores) - np.asarray(self.labels))))
