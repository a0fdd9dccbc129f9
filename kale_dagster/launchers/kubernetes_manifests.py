"""The names, labels and annotations of the Kubernetes launcher's objects, and its headless Service: what the
manifests (``launchers.kubernetes.render``) and the launcher's reads of the cluster agree on."""

from __future__ import annotations

import json
from typing import Any

from kale_dagster.rules import setting

APP_LABEL = "app.kubernetes.io/name"
PIPELINE_LABEL = "kale.dev/pipeline"
WORKERS_LABEL = "kale.dev/workers"
CHECKPOINT_MOUNT = "/checkpoints"
#: A retarget decided in another process than the restart's (the sensor's): annotations on the Job being formed
#: (``kale.dev/forming`` until its pods' first step), which the restart reads at each poll of its waits.
FORMING_ANNOTATION = "kale.dev/forming"
RETARGET_ANNOTATION, RETARGET_REASON_ANNOTATION = "kale.dev/retarget-to", "kale.dev/retarget-reason"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def service_name(pipeline: str) -> str:
    return f"kale-{pipeline.replace('_', '-')}-workers"


def job_name(pipeline: str, workers: int, generation: int) -> str:
    return f"kale-{pipeline.replace('_', '-')}-w{workers}-{generation}"


def headless_service(pipeline: str, namespace: str, rdzv_port: int, labels: dict) -> dict:
    """The headless Service that gives every worker pod a stable DNS name, for torchrun's rendezvous."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service_name(pipeline), "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "clusterIP": "None",
            "selector": dict(labels),
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rdzv", "port": rdzv_port, "targetPort": rdzv_port}],
        },
    }


def workers_of(job: Any) -> int:
    """The workers a Job runs: its label, which holds whatever the pods' layout (pods times workers per pod)."""
    return int((job.metadata.labels or {})[WORKERS_LABEL])


def forming(job: Any) -> bool:
    return FORMING_ANNOTATION in (job.metadata.annotations or {})


def annotated_retarget(job: Any) -> tuple[int, str]:
    """(workers, reason) of a retarget written on ``job`` by another process; (0, "") when none is."""
    annotations = job.metadata.annotations or {}
    wanted = str(annotations.get(RETARGET_ANNOTATION, ""))
    return (int(wanted), str(annotations.get(RETARGET_REASON_ANNOTATION, "retarget"))) if wanted.isdigit() else (0, "")


def rescale_service_account_setting():
    return setting(
        None,
        pattern=r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?",
        description="the service account of the <pipeline>_rescale runs' pods (docs/kubernetes/rbac*.yaml), set "
        "by a per-job dagster-k8s/config tag: only those runs may resize the workers",
    )


def service_account_tags(service_account: str | None) -> dict[str, str]:
    """The ``dagster-k8s/config`` tag that gives one job's run pods ``service_account`` (K8sRunLauncher reads it
    per run, over the chart's ``runK8sConfig``)."""
    if not service_account:
        return {}
    return {"dagster-k8s/config": json.dumps({"pod_spec_config": {"service_account_name": service_account}})}
