"""A cluster short of GPUs, as the Kubernetes launchers read and remember it: pods no node holds, a Job Kueue has
not admitted, and the capacity a rescale found, recorded on the workload it kept as a ceiling for the planner.

Pure: V1 objects and annotations in, verdicts out.  The record is JSON in one annotation, ``[workers, until
(epoch s), GPUs in use in the namespace then, note]``: any process that reads the workload (the sensor's, while
the rescale ran in a run's) sees the same ceiling, and it lifts at ``until`` or once the namespace's pods hold
fewer GPUs than then (a pod freed up).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from kale_dagster.rules import setting

GPU_RESOURCE = "nvidia.com/gpu"
CAPACITY_ANNOTATION = "kale.dev/capacity"


def capacity_timeout_setting():
    return setting(
        120.0,
        gt=0,
        unit="s",
        description="how long pods may stay unscheduled (or a queued Job unadmitted) before a rescale keeps the "
        "largest size that runs; longer where a node autoscaler adds GPU nodes",
    )


def capacity_hold_setting():
    return setting(
        1800.0,
        gt=0,
        unit="s",
        description="how long the capacity a rescale found caps the decisions, unless GPUs free up sooner",
    )


def capacity_record(workers: int, until: float, in_use: int, note: str) -> dict:
    """The annotation a rescale short of capacity leaves on the workload it kept."""
    return {CAPACITY_ANNOTATION: json.dumps([workers, until, in_use, note])}


def capacity_holding(annotations: dict | None, now: float, in_use: Callable[[], int]) -> dict:
    """``capacity`` and ``capacity_note`` for ``LauncherStatus`` while the recorded finding holds; {} otherwise.
    ``in_use`` counts the GPUs the namespace's pods hold now (read only when there is a finding)."""
    found = (annotations or {}).get(CAPACITY_ANNOTATION)
    if not found:
        return {}
    workers, until, then, note = json.loads(found)
    if now >= until or in_use() < then:
        return {}
    return {"capacity": int(workers), "capacity_note": str(note)}


def unplaced(pods: list) -> tuple[int, str]:
    """(how many pods no node holds yet, the scheduler's word on why): kube-scheduler marks a pod it cannot place
    with the condition PodScheduled=False, reason Unschedulable, its message the FailedScheduling event's."""
    waiting = [p for p in pods if not p.spec or not p.spec.node_name] if pods else []
    for pod in waiting:
        for c in pod.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return len(waiting), f"FailedScheduling: {c.message or 'no node fits'}"
    return len(waiting), "not scheduled yet" if waiting else ""


def gpus_in_use(pods: list) -> int:
    """The GPUs that the pods still running or waiting to run ask for (terminated and terminating pods hold none)."""
    held = [p for p in pods if p.status.phase not in ("Succeeded", "Failed") and not p.metadata.deletion_timestamp]
    return sum(
        int(((c.resources and c.resources.limits) or {}).get(GPU_RESOURCE, 0))
        for p in held
        for c in (p.spec.containers if p.spec else None) or []
    )


class Unplaced(Exception):
    """A Job's pods stayed unscheduled, or Kueue did not admit it: ``placed`` workers ran in pods a node holds."""

    def __init__(self, placed: int, why: str):
        super().__init__(why)
        self.placed, self.why = placed, why


def shortfall(job, pods: list, workers_per_pod: int, queue: str | None) -> Unplaced | None:
    """What the cluster has not given ``job`` (a V1Job) and its ``pods``: Kueue has not admitted it (it stays
    suspended), or pods no node holds, or pods not created; None when every pod is placed (they are starting)."""
    if queue and job.spec.suspend:
        return Unplaced(0, f"Kueue has not admitted it from queue {queue!r}")
    missing, why = unplaced(pods)
    wanted = int(job.spec.parallelism)
    if not missing and len(pods) >= wanted:
        return None
    placed = (len(pods) - missing) * workers_per_pod
    if missing:
        return Unplaced(placed, f"{missing} of {wanted} pods unplaced: {why}")
    return Unplaced(placed, f"{wanted - len(pods)} of {wanted} pods not created (the Job's events say why)")
