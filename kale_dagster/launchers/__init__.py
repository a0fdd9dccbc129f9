"""Launchers: run a pipeline's trainer workers at a chosen parallelism, rescale by pause-and-restart.

* ``base``: the ``Launcher`` contract (start, rescale, stop; one definition of
  downtime), ``RescaleRecord``, ``RescaleFailed``, ``LauncherConfig``;
* ``local``: ``LocalLauncher``, worker processes on this machine with warm standbys;
* ``service``: the loopback HTTP service that owns a LocalLauncher for Dagster's
  rescale runs, its client, and ``LocalLauncherConfig``;
* ``kubernetes``: ``KubernetesLauncher`` (an Indexed Job of GPU pods) and
  ``KubernetesLauncherConfig``;
* ``observed``: ``ObservedGroupConfig``, a consumer group Kale watches but did not start (advisory only);
* ``command``: ``CommandHookConfig``, a workload sized through the team's own commands;
* ``scale_target``: ``ScaleTargetConfig``, a Kubernetes workload sized through its scale subresource.

A pipeline declares one ``LauncherConfig``; its rescale job builds the launcher from it.
"""

from kale_dagster.launchers.base import Launcher, LauncherConfig, RescaleFailed, RescaleRecord
from kale_dagster.launchers.command import CommandHookConfig
from kale_dagster.launchers.kubernetes import KubernetesLauncher, KubernetesLauncherConfig
from kale_dagster.launchers.local import LocalLauncher
from kale_dagster.launchers.observed import ObservedGroupConfig
from kale_dagster.launchers.scale_target import ScaleTargetConfig
from kale_dagster.launchers.service import LocalLauncherConfig
from kale_dagster.trainer.settings import TrainerSettings

__all__ = [
    "CommandHookConfig",
    "KubernetesLauncher",
    "KubernetesLauncherConfig",
    "Launcher",
    "LauncherConfig",
    "LocalLauncher",
    "LocalLauncherConfig",
    "ObservedGroupConfig",
    "RescaleFailed",
    "RescaleRecord",
    "ScaleTargetConfig",
    "TrainerSettings",
]
