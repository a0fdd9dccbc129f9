"""The names and labels of the Kubernetes launcher's objects, and its headless Service: what the manifests
(``launchers.kubernetes.render``) and the launcher's reads of the cluster agree on."""

from __future__ import annotations

APP_LABEL = "app.kubernetes.io/name"
PIPELINE_LABEL = "kale.dev/pipeline"
WORKERS_LABEL = "kale.dev/workers"
CHECKPOINT_MOUNT = "/checkpoints"


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
