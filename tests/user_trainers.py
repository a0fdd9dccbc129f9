"""Trainers as users might write them, good and bad, for the harness's tests (workers import this module by its
import path, with the tests folder on PYTHONPATH)."""

from __future__ import annotations

import torch
from torch import nn

from kale_dagster.trainer import OnlineTrainer, Record, TrainerContext
from kale_dagster.trainer.ctr import make_trainer as make_ctr_trainer

NOT_A_FACTORY = 42


def raising(ctx: TrainerContext) -> OnlineTrainer:
    raise RuntimeError("the feature store is unreachable")


def wrong_type(ctx: TrainerContext):
    return {"model": None}


def refuses_everything(ctx: TrainerContext) -> OnlineTrainer:
    trainer = make_ctr_trainer(ctx)

    def decode(record: Record):
        raise ValueError("schema v2 expected")

    trainer.decode = decode
    return trainer


def nan_after(ctx: TrainerContext) -> OnlineTrainer:
    """The CTR trainer whose loss turns NaN after ``steps`` steps (option), as a diverging model's would."""
    trainer = make_ctr_trainer(ctx)
    ctr_loss, calls = trainer.loss, [0]

    def loss(model: nn.Module, batch):
        calls[0] += 1
        value, predictions = ctr_loss(model, batch)
        return (value * float("nan") if calls[0] > int(ctx.options.get("steps", 0)) else value), predictions

    trainer.loss = loss
    return trainer


class Counter:
    """User state checkpointed with the model: how many batches this trainer has seen, over every restart."""

    def __init__(self):
        self.batches = 0

    def state_dict(self) -> dict:
        return {"batches": self.batches}

    def load_state_dict(self, state: dict) -> None:
        self.batches = int(state["batches"])


def with_state(ctx: TrainerContext) -> OnlineTrainer:
    trainer = make_ctr_trainer(ctx)
    counter, ctr_loss = Counter(), trainer.loss

    def loss(model, batch):
        counter.batches += 1
        return ctr_loss(model, batch)

    trainer.loss, trainer.state = loss, counter
    trainer.scheduler = torch.optim.lr_scheduler.StepLR(trainer.optimizer, step_size=1000, gamma=0.5)
    return trainer


def batchnorm(ctx: TrainerContext) -> OnlineTrainer:
    """A regressor with BatchNorm: its running statistics are buffers, not parameters."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    return OnlineTrainer(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        decode=lambda record: [],
        loss=lambda m, batch: nn.functional.mse_loss(m(batch[0]).squeeze(-1), batch[1]),
    )
