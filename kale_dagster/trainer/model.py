"""A small recommendation model: user and item embeddings plus dense features, MLP tower, BCE."""

from __future__ import annotations

from collections import deque

import numpy as np
import torch
from torch import nn

from kale_dagster.stream.samples import N_DENSE, N_ITEMS, N_USERS


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


class RollingAUC:
    """AUC over the last ``window`` (prediction, label) pairs, scored before each update (progressive validation)."""

    def __init__(self, window: int = 20_000):
        self.scores: deque = deque(maxlen=window)
        self.labels: deque = deque(maxlen=window)

    def add(self, scores: np.ndarray, labels: np.ndarray) -> None:
        self.scores.extend(scores.tolist())
        self.labels.extend(labels.tolist())

    def value(self) -> float:
        y = np.asarray(self.labels)
        s = np.asarray(self.scores)
        pos, neg = y.sum(), len(y) - y.sum()
        if pos == 0 or neg == 0:
            return float("nan")
        ranks = np.empty(len(s))
        ranks[np.argsort(s, kind="mergesort")] = np.arange(1, len(s) + 1)
        return float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))
