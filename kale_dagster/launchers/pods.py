"""A Kubernetes worker group's pods as the launcher reads them: ready, pending or failed, placed or not, and stepped.

Pure: V1Pod objects and log text in, a verdict out; ``launchers.kubernetes`` makes the API calls.
"""

from __future__ import annotations

from kale_dagster.trainer.protocol import WorkerEvent, parse_event

GPU_RESOURCE = "nvidia.com/gpu"

#: Waiting reasons that never resolve by waiting: the group has failed to start.
IMAGE_PULL_FAILURES = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
}


def pods_state(pods: list) -> tuple[str, str]:
    """("ready" | "pending" | "failed", why) for a Job's pods (V1Pod objects)."""
    if not pods:
        return "pending", "no pods yet"
    for pod in pods:
        status = pod.status
        if status.phase == "Failed":
            return "failed", f"pod {pod.metadata.name} failed: {status.reason or ''} {status.message or ''}".strip()
        for cs in status.container_statuses or []:
            waiting = cs.state.waiting if cs.state else None
            if waiting is not None and waiting.reason in IMAGE_PULL_FAILURES:
                return "failed", f"pod {pod.metadata.name}: {waiting.reason}: {waiting.message or ''}".strip()
    ready = sum(1 for p in pods if any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or [])))
    return ("ready", f"{ready} pods ready") if ready == len(pods) else ("pending", f"{ready}/{len(pods)} pods ready")


def stepped(log: str) -> bool:
    """Whether a worker pod's log shows its first training step (the event the local launcher waits for too)."""
    return any((parsed := parse_event(line)) is not None and parsed[0] is WorkerEvent.STEP for line in log.splitlines())


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
