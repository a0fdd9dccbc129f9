"""A pipeline's limits: what it may run and what it must keep, declared once.

Every reader takes this one object: the pipeline declaration and its YAML
twin, the controller, every policy (through ``Sizing``), the backtest, the
simulator and the offline optimum.  The declaration is in minutes, the
unit people think of SLOs in; ``slo_s`` and ``restart_s`` are the one
place they become the seconds everything else computes in.  A new limit (a
GPU-hour budget per day, say) is a field here and the code of the policy
that honours it, nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kale_dagster.rules import check, need, ordered, setting

#: The most workers a pipeline may declare: a decision's cost grows with the worker counts it weighs.
MAX_WORKERS = 1024


@dataclass(frozen=True)
class Limits:
    """Worker bounds, the lag SLO and the declared restart time of one pipeline."""

    min_workers: int = setting(
        1,
        ge=0,
        le=MAX_WORKERS,
        description="the fewest workers the pipeline runs; 0 stops them all while the stream is idle "
        "(see activation_lag)",
    )
    max_workers: int = setting(
        32, ge=1, le=MAX_WORKERS, description="the most workers (GPUs) the pipeline may run at once"
    )
    slo_minutes: float = setting(
        20.0, gt=0, le=7 * 1440, unit="min", description="how far, in minutes of arrivals, training may fall behind"
    )
    restart_minutes: float = setting(
        10.0,
        ge=0,
        le=1440,
        unit="min",
        description="the declared time a rescale takes (stop, restore, rejoin); replaced by the median of measured "
        "rescales once there are some",
    )

    workers_per_pod: int = setting(
        1,
        ge=1,
        le=64,
        description="the workers (one GPU each) one pod runs, all-reducing over NVLink within it: sizes are whole "
        "pods, so min_workers and max_workers are multiples of it, and every decision is",
    )
    activation_lag: int = setting(
        0,
        ge=0,
        le=10**15,
        description="with min_workers 0: the waiting samples above which a pipeline at zero workers starts "
        "them again (KEDA's activationLagThreshold)",
    )

    def __post_init__(self):
        check(
            self,
            lambda: ordered(self, "min_workers", "max_workers"),
            lambda: [e for e in map(self._whole_pods, ("min_workers", "max_workers")) if e],
            need(
                self.activation_lag == 0 or self.min_workers == 0,
                "activation_lag",
                f"applies only with min_workers 0 (got min_workers {self.min_workers}); set min_workers: 0 to "
                "stop idle workers, or leave activation_lag out",
            ),
        )

    def _whole_pods(self, name: str):
        value, pod = getattr(self, name), self.workers_per_pod
        near = " or ".join(
            str(n) for n in sorted({value // pod * pod, math.ceil(value / pod) * pod}) if n or name == "min_workers"
        )
        return need(
            value % pod == 0,
            name,
            f"must be a whole number of pods of {pod} workers (workers_per_pod): {near}, not {value}",
        )

    def whole_pods(self, workers: int) -> int:
        """``workers`` rounded up to whole pods, within ``max_workers``: the size that runs."""
        pod = self.workers_per_pod
        return min(-(-workers // pod) * pod, self.max_workers)

    def sizes(self, fewest: int | None = None, most: int | None = None) -> np.ndarray:
        """The sizes a decision may take, ascending: whole pods from ``fewest`` (default ``min_workers``) to ``most``
        (default ``max_workers``)."""
        low = self.min_workers if fewest is None else self.whole_pods(fewest)
        return np.arange(low, self.whole_pods(self.max_workers if most is None else most) + 1, self.workers_per_pod)

    @property
    def slo_s(self) -> float:
        return self.slo_minutes * 60.0

    @property
    def restart_s(self) -> float:
        return self.restart_minutes * 60.0
