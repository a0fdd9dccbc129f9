"""A Kubernetes worker group's pods as the launcher reads them: ready, pending or failed, and stepped.

Pure: V1Pod objects and log text in, a verdict out; ``launchers.kubernetes`` makes the API calls.
"""

from __future__ import annotations

from kale_dagster.trainer.protocol import WorkerEvent, parse_event

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
