"""Launchers that run trainer workers at a chosen parallelism."""

from .base import Launcher, RescaleRecord
from .local import LocalLauncher, TrainerSettings

__all__ = ["Launcher", "LocalLauncher", "RescaleRecord", "TrainerSettings"]
