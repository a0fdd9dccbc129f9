"""The built-in demo trainer: a small click-through-rate model on the synthetic CTR samples.

User and item embeddings plus dense features into an MLP tower, trained with BCE and Adagrad; its quality
is the rolling AUC.  It is one trainer factory like any user's (``make_trainer``), the default of a
pipeline that names none.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from kale_dagster.stream.samples import N_DENSE, N_ITEMS, N_USERS, RECORD, decode
from kale_dagster.trainer.api import OnlineTrainer, Record, TrainerContext
from kale_dagster.trainer.metrics import RollingAUC


class CTRModel(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 64):
        super().__init__()
        self.users = nn.Embedding(N_USERS, dim)
        self.items = nn.Embedding(N_ITEMS, dim)
        self.tower = nn.Sequential(
            nn.Linear(2 * dim + N_DENSE + 1, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, users: torch.Tensor, items: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        u, v = self.users(users), self.items(items)
        dot = (u * v).sum(dim=1, keepdim=True)
        return self.tower(torch.cat([u, v, dense, dot], dim=1)).squeeze(1)


def batch_tensors(records: np.ndarray, device: torch.device):
    users = torch.as_tensor(records["user"].astype(np.int64), device=device)
    items = torch.as_tensor(records["item"].astype(np.int64), device=device)
    dense = torch.as_tensor(records["dense"].astype(np.float32), device=device)
    labels = torch.as_tensor(records["label"].astype(np.float32), device=device)
    return users, items, dense, labels


def decode_record(record: Record) -> np.ndarray:
    """The samples packed in one record; a value that is not whole, valid samples is a poison record."""
    samples, counts = decode([record.value])
    if not counts[0]:
        size = len(record.value or b"")
        raise ValueError(f"not kale CTR samples ({size} bytes: whole {RECORD.itemsize}-byte samples expected)")
    return samples


def bce_loss(model: nn.Module, batch) -> tuple[torch.Tensor, torch.Tensor]:
    users, items, dense, labels = batch
    logits = model(users, items, dense)
    return nn.functional.binary_cross_entropy_with_logits(logits, labels), torch.sigmoid(logits.detach())


def make_trainer(ctx: TrainerContext) -> OnlineTrainer:
    """Options: ``dim`` (embedding size, 16), ``hidden`` (tower width, 64), ``lr`` (Adagrad, 0.05)."""
    torch.manual_seed(0)  # every rank starts from the same weights when there is no checkpoint yet
    model = CTRModel(dim=int(ctx.options.get("dim", 16)), hidden=int(ctx.options.get("hidden", 64)))
    return OnlineTrainer(
        model=model,
        optimizer=torch.optim.Adagrad(model.parameters(), lr=float(ctx.options.get("lr", 0.05))),
        decode=decode_record,
        collate=lambda samples: batch_tensors(np.array(samples, dtype=RECORD), ctx.device),
        loss=bce_loss,
        metric=RollingAUC(targets=lambda batch: batch[3]),
    )
