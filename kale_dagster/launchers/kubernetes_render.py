"""A Kubernetes worker group's manifests: the headless Service and the Indexed Job (``render``), built with
dagster-k8s's ``construct_dagster_k8s_job``, for review (``kale k8s render``), GitOps and the launcher alike.

Credentials are Secrets: the stream's and the store's keys become the workers' environment (``envFrom``), and
the stream's TLS files (``kafka_tls_secret``) are mounted read-only at ``KAFKA_TLS_MOUNT``, the workers' TLS
settings pointing there by file name.  Nothing secret is written into a manifest.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any, cast

from kale_dagster.errors import KaleConfigError
from kale_dagster.launchers.kubernetes_manifests import (
    APP_LABEL,
    CHECKPOINT_MOUNT,
    PIPELINE_LABEL,
    QUEUE_LABEL,
    WORKERS_LABEL,
    headless_service,
    job_name,
    service_name,
)
from kale_dagster.stream.source import KafkaSource
from kale_dagster.trainer.api import TrainerSpec
from kale_dagster.trainer.settings import TrainerSettings

if TYPE_CHECKING:
    from kale_dagster.launchers.kubernetes import KubernetesLauncherConfig

#: Where a worker pod mounts the stream's TLS files (``kafka_tls_secret``).
KAFKA_TLS_MOUNT = "/etc/kale/kafka-tls"
#: The workers' TLS settings that name files.
_TLS_FILES = ("KAFKA_SSL_CAFILE", "KAFKA_SSL_CERTFILE", "KAFKA_SSL_KEYFILE")


def render(
    pipeline: str,
    config: KubernetesLauncherConfig,
    source: KafkaSource,
    workers: int,
    generation: int = 1,
    trainer: TrainerSpec | None = None,
    workers_per_pod: int = 1,
) -> list[dict]:
    """The Service and Job manifests for ``workers`` workers in pods of ``workers_per_pod``, as plain dicts (for
    review, GitOps, validation)."""
    from dagster_k8s.job import DagsterK8sJobConfig, construct_dagster_k8s_job
    from kubernetes.client import ApiClient

    if workers < 1 or workers % workers_per_pod:
        raise KaleConfigError(
            "workers", f"must be a whole number (>= 1) of pods of {workers_per_pod} workers, got {workers}"
        )
    pods = workers // workers_per_pod
    name = job_name(pipeline, workers, generation)
    labels = {APP_LABEL: "kale-trainer", PIPELINE_LABEL: pipeline}
    mounts, volumes = _volumes(config)
    job_config = DagsterK8sJobConfig(
        job_image=config.image,
        image_pull_policy=config.image_pull_policy,
        image_pull_secrets=[{"name": s} for s in config.image_pull_secrets],
        service_account_name=config.service_account,
        env_secrets=[s for s in (config.kafka_secret, config.storage_secret) if s],
        volume_mounts=mounts,
        volumes=volumes,
        labels=labels,
    )
    args = _torchrun_args(pipeline, config, source, (pods, workers_per_pod), name, trainer or TrainerSpec())
    user_config = _user_config(pipeline, config, source, (pods, workers_per_pod), labels)
    job = construct_dagster_k8s_job(job_config, args, name, user_defined_k8s_config=user_config, labels=labels)
    job_dict: dict[str, Any] = cast(dict, ApiClient().sanitize_for_serialization(job))  # a Job serialises to a dict
    job_dict.setdefault("apiVersion", "batch/v1")
    job_dict.setdefault("kind", "Job")
    job_dict["metadata"]["namespace"] = config.namespace
    return [headless_service(pipeline, config.namespace, config.rdzv_port, labels), job_dict]


def _volumes(config: KubernetesLauncherConfig) -> tuple[list[dict], list[dict]]:
    """The worker container's mounts and the pod's volumes: the checkpoints' claim, the stream's TLS Secret."""
    mounts, volumes = [], []
    if config.checkpoint_pvc:
        mounts.append({"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT})
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": config.checkpoint_pvc}})
    if config.kafka_tls_secret:
        mounts.append({"name": "kafka-tls", "mountPath": KAFKA_TLS_MOUNT, "readOnly": True})
        # Readable by the container's user only (0400), as a private key should be.
        volumes.append({"name": "kafka-tls", "secret": {"secretName": config.kafka_tls_secret, "defaultMode": 0o400}})
    return mounts, volumes


def worker_env(config: KubernetesLauncherConfig, source: KafkaSource) -> dict[str, str]:
    """The stream's settings as a worker pod reads them: its TLS files at the mounted Secret, by file name."""
    env = source.worker_env(include_password=False)
    if config.kafka_tls_secret:
        for name in _TLS_FILES:
            if name in env:
                env[name] = posixpath.join(KAFKA_TLS_MOUNT, posixpath.basename(env[name]))
    return env


def _torchrun_args(
    pipeline: str,
    config: KubernetesLauncherConfig,
    source: KafkaSource,
    layout: tuple[int, int],
    name: str,
    trainer: TrainerSpec,
) -> list[str]:
    """torchrun's arguments: ``layout`` (pods, workers per pod) processes, rendezvous at pod 0, then the worker with
    its settings' flags.  torchrun numbers the ranks pod by pod, and each process takes the GPU of its local rank."""
    svc = service_name(pipeline)
    pods, per_pod = layout
    return [
        f"--nnodes={pods}",
        f"--nproc-per-node={per_pod}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={name}-0.{svc}.{config.namespace}.svc.cluster.local:{config.rdzv_port}",
        f"--rdzv-id={name}",
        "--max-restarts=0",
        "-m",
        "kale_dagster.trainer.worker",
        *TrainerSettings(source, config.checkpoint_dir, trainer=trainer, pipeline=pipeline).argv(),
        *config.trainer_args,
    ]


def _user_config(
    pipeline: str, config: KubernetesLauncherConfig, source: KafkaSource, layout: tuple[int, int], labels: dict
):
    """What dagster-k8s's Job gets beyond its defaults: the container, the pod and the Indexed Job's spec, for
    ``layout`` (pods, workers per pod)."""
    from dagster_k8s.job import UserDefinedDagsterK8sConfig

    pods, per_pod = layout
    workers = pods * per_pod
    queue = {QUEUE_LABEL: config.queue_name} if config.queue_name else {}
    limits: dict[str, Any] = {"cpu": config.cpu, "memory": config.memory}
    if config.gpus_per_worker:
        limits["nvidia.com/gpu"] = str(config.gpus_per_worker * per_pod)
    # Workers never call the API server, so they get no token to lose.
    pod_spec: dict[str, Any] = {
        "subdomain": service_name(pipeline),
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": config.termination_grace_period_s,
        "automountServiceAccountToken": False,
    }
    if config.node_selector:
        pod_spec["nodeSelector"] = dict(config.node_selector)
    if config.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in config.tolerations]
    return UserDefinedDagsterK8sConfig(
        container_config={
            "command": ["torchrun"],
            "env": [{"name": k, "value": v} for k, v in sorted(worker_env(config, source).items())],
            "resources": {"requests": {"cpu": config.cpu, "memory": config.memory}, "limits": limits},
            "ports": [{"name": "rdzv", "containerPort": config.rdzv_port}],
        },
        pod_template_spec_metadata={"labels": {**labels, WORKERS_LABEL: str(workers)}},
        pod_spec_config=pod_spec,
        job_spec_config={
            "completionMode": "Indexed",
            "completions": pods,
            "parallelism": pods,
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": 3600,
            # Kueue admits a queued Job by unsuspending it; created running, it would start before its quota.
            **({"suspend": True} if config.queue_name else {}),
        },
        job_metadata={"labels": {**labels, WORKERS_LABEL: str(workers), **queue}},
    )
