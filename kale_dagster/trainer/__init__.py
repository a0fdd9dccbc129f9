"""The online trainer: the plug-in API a user's trainer is written to, and the harness that runs it.

A user writes a factory of an :class:`OnlineTrainer` (``kale_dagster.trainer.api``) and names it on the
pipeline; a worker process (``kale_dagster.trainer.worker``, started with the flags ``settings.TrainerSettings``
derives) runs it in the harness (``harness``): consumption (``intake``), balancing, data-parallel steps
(``collective``), atomic checkpoints, offset commits and the rescale protocol.  ``ctr`` is the built-in demo
trainer, ``metrics`` the progressive-validation metrics, ``lightning`` an adapter for a LightningModule.
"""

from kale_dagster.trainer.api import (
    OnlineTrainer,
    ProgressiveMetric,
    Record,
    TrainerContext,
    TrainerFactory,
    TrainerSpec,
)
from kale_dagster.trainer.metrics import RollingAUC, RollingMAE

__all__ = [
    "OnlineTrainer",
    "ProgressiveMetric",
    "Record",
    "RollingAUC",
    "RollingMAE",
    "TrainerContext",
    "TrainerFactory",
    "TrainerSpec",
]
