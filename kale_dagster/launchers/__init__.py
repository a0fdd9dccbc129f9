"""Launchers: run a pipeline's trainer workers at a chosen parallelism, rescale by pause-and-restart.

* ``base``: the ``Launcher`` contract (start, rescale, stop; one definition of
  downtime), ``RescaleRecord``, ``RescaleFailed``, ``LauncherConfig``;
* ``local``: ``LocalLauncher``, worker processes on this machine with warm standbys;
* ``service``: the loopback HTTP service that owns a LocalLauncher for Dagster's
  rescale runs, its client, and ``LocalLauncherConfig``;
* ``kubernetes``: ``KubernetesLauncher`` (an Indexed Job of GPU pods) and
  ``KubernetesLauncherConfig``;
* ``observed``: ``ObservedGroupLauncherConfig``, a consumer group Kale watches but did not start (advisory only);
* ``command``: ``CommandHookLauncherConfig``, a workload sized through the team's own commands;
* ``scale_target``: ``ScaleTargetLauncherConfig``, a Kubernetes workload sized through its scale subresource.

A pipeline declares one ``LauncherConfig``; its rescale job builds the launcher from it.
"""

from kale_dagster.launchers.base import Launcher, LauncherConfig, RescaleFailed, RescaleRecord
from kale_dagster.launchers.command import CommandHookLauncherConfig
from kale_dagster.launchers.kubernetes import KubernetesLauncher, KubernetesLauncherConfig
from kale_dagster.launchers.local import LocalLauncher
from kale_dagster.launchers.observed import ObservedGroupLauncherConfig
from kale_dagster.launchers.scale_target import ScaleTargetLauncherConfig
from kale_dagster.launchers.service import LocalLauncherConfig
from kale_dagster.trainer.settings import TrainerSettings

__all__ = [
    "CommandHookLauncherConfig",
    "KubernetesLauncher",
    "KubernetesLauncherConfig",
    "Launcher",
    "LauncherConfig",
    "LocalLauncher",
    "LocalLauncherConfig",
    "ObservedGroupLauncherConfig",
    "RescaleFailed",
    "RescaleRecord",
    "ScaleTargetLauncherConfig",
    "TrainerSettings",
]

#: Names before every launcher config was called ``*LauncherConfig`` (0.1.x): they still import, with a warning.
RENAMED = {
    "ScaleTargetConfig": "ScaleTargetLauncherConfig",
    "CommandHookConfig": "CommandHookLauncherConfig",
    "ObservedGroupConfig": "ObservedGroupLauncherConfig",
}


def __getattr__(name: str):
    if name in RENAMED:
        import warnings

        warnings.warn(
            f"{name} is deprecated and will be removed in 0.3: use {RENAMED[name]} (the same class)",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[RENAMED[name]]
    raise AttributeError(f"module 'kale_dagster.launchers' has no attribute {name!r}")
