"""An adapter: a LightningModule's ``training_step`` and ``configure_optimizers`` as an OnlineTrainer.

Lightning is not imported (nor required): the module is used through those two methods, so a model
written for Lightning plugs in without being rewritten.  What Lightning's Trainer would do around them
(the backward pass, gradient sync, checkpoints) the harness does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kale_dagster.trainer.api import OnlineTrainer, ProgressiveMetric, Record


def _optimizer_and_scheduler(configured: Any) -> tuple[Any, Any]:
    """The optimizer (and scheduler) out of the forms ``configure_optimizers`` may return: an optimizer, a
    list or tuple of them (and of schedulers), or a dict with ``optimizer`` and ``lr_scheduler``."""
    if isinstance(configured, dict):
        scheduler = configured.get("lr_scheduler")
        return configured["optimizer"], scheduler.get("scheduler") if isinstance(scheduler, dict) else scheduler
    if isinstance(configured, (list, tuple)):
        if len(configured) == 2 and isinstance(configured[0], (list, tuple)):
            optimizers, schedulers = configured
            if len(optimizers) != 1:
                raise ValueError("configure_optimizers returned several optimizers; the harness steps one")
            return optimizers[0], schedulers[0] if schedulers else None
        if len(configured) != 1:
            raise ValueError("configure_optimizers returned several optimizers; the harness steps one")
        return configured[0], None
    return configured, None


def from_lightning(
    module: Any,
    decode: Callable[[Record], Iterable[Any]],
    collate: Callable[[list], Any] | None = None,
    metric: ProgressiveMetric | None = None,
) -> OnlineTrainer:
    """An OnlineTrainer over ``module`` (a LightningModule, or anything with its two methods).

    ``training_step(batch, batch_idx)`` may return the loss, or a dict with ``loss`` (and ``predictions``,
    which ``metric`` then scores)."""
    optimizer, scheduler = _optimizer_and_scheduler(module.configure_optimizers())
    steps = iter(range(1 << 62))

    def loss(model: Any, batch: Any) -> Any:
        out = model.training_step(batch, next(steps))
        if isinstance(out, dict):
            return (out["loss"], out["predictions"]) if "predictions" in out else out["loss"]
        return out

    return OnlineTrainer(
        model=module,
        optimizer=optimizer,
        decode=decode,
        loss=loss,
        collate=collate,
        scheduler=scheduler,
        metric=metric,
    )
