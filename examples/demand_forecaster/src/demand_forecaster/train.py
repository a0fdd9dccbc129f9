"""The trainer: JSON records in, a regression model trained online, its MAE scored before each step.

This is all a user writes for kale-dagster to scale their job: the model, the optimizer, how one Kafka
record becomes samples, and the loss.  No offsets, checkpoints or process groups.
"""

from __future__ import annotations

import json
import math

import torch
from torch import nn

from demand_forecaster.world import STORES
from kale_dagster.trainer import OnlineTrainer, Record, RollingMAE, TrainerContext


class DemandModel(nn.Module):
    """A store embedding and the hour (as a point on the clock) and temperature, through a small MLP."""

    def __init__(self, dim: int = 8, hidden: int = 32):
        super().__init__()
        self.stores = nn.Embedding(STORES, dim)
        self.mlp = nn.Sequential(nn.Linear(dim + 3, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, store: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([self.stores(store), features], dim=1)).squeeze(1)


def decode(record: Record) -> list[dict]:
    """One JSON observation per record; anything else is a poison record (ValueError: skipped, counted)."""
    try:
        row = json.loads(record.value or b"")
        store, hour, temp, target = int(row["store"]), float(row["hour"]), float(row["temp_c"]), float(row["demand"])
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a demand observation: {exc}") from None
    if not 0 <= store < STORES or not all(map(math.isfinite, (hour, temp, target))):
        raise ValueError(f"out of range: store {store}, hour {hour}, temp {temp}, demand {target}")
    angle = 2 * math.pi * hour / 24
    features = torch.tensor([math.sin(angle), math.cos(angle), temp / 30.0])
    return [{"store": store, "features": features, "target": target / 50.0}]


def loss(model: nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    predicted = model(batch["store"], batch["features"])
    # The metric sees demand in its own unit.
    return nn.functional.mse_loss(predicted, batch["target"]), predicted.detach() * 50.0


def make_trainer(ctx: TrainerContext) -> OnlineTrainer:
    """Options: ``lr`` (Adam, 0.01), ``hidden`` (32)."""
    model = DemandModel(hidden=int(ctx.options.get("hidden", 32)))
    return OnlineTrainer(
        model=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=float(ctx.options.get("lr", 0.01))),
        decode=decode,
        loss=loss,
        # default_collate turns the list of dicts into a dict of tensors; the harness moves it to the device.
        collate=None,
        metric=RollingMAE(targets=lambda batch: batch["target"] * 50.0, window=2_000),
    )
