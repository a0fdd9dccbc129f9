"""Kubernetes launcher: the worker group as an Indexed Job of N GPU pods, rescaled by restart.

Manifests per pipeline (``render``):

* a headless Service ``kale-<pipeline>-workers`` that gives every worker pod
  a stable DNS name, used for torchrun's c10d rendezvous;
* an Indexed Job ``kale-<pipeline>-w<N>-<generation>`` with parallelism =
  completions = N; each pod requests ``nvidia.com/gpu`` and runs the same
  trainer entrypoint as the local launcher under ``torchrun --nnodes=N
  --nproc-per-node=1 --rdzv-backend=c10d``, rendezvousing at pod index 0.

The Job is built with dagster-k8s (``construct_dagster_k8s_job`` from a
``DagsterK8sJobConfig``) and created and deleted through its
``DagsterKubernetesClient``.  Kafka credentials are referenced from a Secret
(``envFrom``), never written into a manifest, a log or Dagster metadata.
Checkpoints live on a PersistentVolumeClaim mounted at ``/checkpoints``
(an object store works through a CSI driver that exposes it as a volume).

Rescale: delete the running Job with foreground propagation (pods get
SIGTERM and ``terminationGracePeriodSeconds`` to finish the step and
checkpoint), wait until its pods are gone, create the Job at the new size,
wait until every pod is Ready.  If the new Job cannot start (API error
403/409/422/5xx, image pull failure, timeout) it is deleted and the
previous size is restored, so the pipeline never ends up with nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..errors import KaleConfigError
from .base import RescaleRecord

APP_LABEL = "app.kubernetes.io/name"
PIPELINE_LABEL = "kale.dev/pipeline"
WORKERS_LABEL = "kale.dev/workers"
IMAGE_PULL_FAILURES = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError"}


class RescaleFailed(RuntimeError):
    """The new worker group could not start; the previous one was restored (see ``restored``)."""

    def __init__(self, message: str, restored: Optional[int]):
        super().__init__(message)
        self.restored = restored


@dataclass(frozen=True)
class KubernetesTrainerConfig:
    """Where and how a pipeline's workers run on Kubernetes."""

    image: str
    bootstrap_servers: str
    topic: str
    group_id: str
    namespace: str = "default"
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    service_account: Optional[str] = None
    gpus_per_worker: int = 1
    cpu: str = "4"
    memory: str = "16Gi"
    node_selector: dict = field(default_factory=dict)
    tolerations: tuple = ()
    checkpoint_pvc: str = ""
    kafka_secret: Optional[str] = None  # Secret whose keys become env vars (e.g. KAFKA_SASL_PASSWORD)
    trainer_args: tuple[str, ...] = ()
    termination_grace_period_s: int = 120
    rdzv_port: int = 29400
    ready_timeout_s: float = 600.0
    stop_timeout_s: float = 300.0

    def __post_init__(self):
        if not self.image:
            raise KaleConfigError("image", "the trainer image is required (e.g. registry.example.com/ctr-trainer:1.4)")
        if not self.checkpoint_pvc:
            raise KaleConfigError("checkpoint_pvc", "name the PersistentVolumeClaim (ReadWriteMany) that holds the checkpoints")
        if self.gpus_per_worker < 0:
            raise KaleConfigError("gpus_per_worker", f"must be >= 0, got {self.gpus_per_worker}")
        if self.image_pull_policy not in ("Always", "IfNotPresent", "Never"):
            raise KaleConfigError("image_pull_policy", f"must be Always, IfNotPresent or Never, got {self.image_pull_policy!r}")
        if self.termination_grace_period_s < 10:
            raise KaleConfigError("termination_grace_period_s", "must leave time to checkpoint (>= 10 s)")
        for arg in self.trainer_args:
            if "password" in arg.lower() or "secret" in arg.lower():
                raise KaleConfigError("trainer_args", "credentials must come from kafka_secret, not command-line arguments")


def service_name(pipeline: str) -> str:
    return f"kale-{pipeline.replace('_', '-')}-workers"


def job_name(pipeline: str, workers: int, generation: int) -> str:
    return f"kale-{pipeline.replace('_', '-')}-w{workers}-{generation}"


def render(pipeline: str, config: KubernetesTrainerConfig, workers: int, generation: int = 1) -> list[dict]:
    """The Service and Job manifests for ``workers`` pods, as plain dicts (for review, GitOps, validation)."""
    from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job
    from kubernetes.client import ApiClient

    if workers < 1:
        raise KaleConfigError("workers", f"must be >= 1, got {workers}")
    svc = service_name(pipeline)
    name = job_name(pipeline, workers, generation)
    labels = {APP_LABEL: "kale-trainer", PIPELINE_LABEL: pipeline}
    torchrun = [
        f"--nnodes={workers}", "--nproc-per-node=1", "--rdzv-backend=c10d",
        f"--rdzv-endpoint={name}-0.{svc}.{config.namespace}.svc.cluster.local:{config.rdzv_port}",
        f"--rdzv-id={name}", "--max-restarts=0",
        "-m", "kale_dagster.trainer.worker",
        "--bootstrap-servers", config.bootstrap_servers, "--topic", config.topic, "--group-id", config.group_id,
        "--checkpoint-dir", "/checkpoints", *config.trainer_args,
    ]
    job_config = DagsterK8sJobConfig(
        job_image=config.image,
        image_pull_policy=config.image_pull_policy,
        image_pull_secrets=[{"name": s} for s in config.image_pull_secrets],
        service_account_name=config.service_account,
        env_secrets=[config.kafka_secret] if config.kafka_secret else [],
        volume_mounts=[{"name": "checkpoints", "mountPath": "/checkpoints"}],
        volumes=[{"name": "checkpoints", "persistentVolumeClaim": {"claimName": config.checkpoint_pvc}}],
        labels=labels,
    )
    limits: dict[str, Any] = {"cpu": config.cpu, "memory": config.memory}
    if config.gpus_per_worker:
        limits["nvidia.com/gpu"] = str(config.gpus_per_worker)
    pod_spec: dict[str, Any] = {"subdomain": svc, "restartPolicy": "Never", "terminationGracePeriodSeconds": config.termination_grace_period_s}
    if config.node_selector:
        pod_spec["nodeSelector"] = dict(config.node_selector)
    if config.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in config.tolerations]
    user_config = UserDefinedDagsterK8sConfig(
        container_config={
            "command": ["torchrun"],
            "resources": {"requests": {"cpu": config.cpu, "memory": config.memory}, "limits": limits},
            "ports": [{"name": "rdzv", "containerPort": config.rdzv_port}],
        },
        pod_template_spec_metadata={"labels": {**labels, WORKERS_LABEL: str(workers)}},
        pod_spec_config=pod_spec,
        job_spec_config={
            "completionMode": "Indexed",
            "completions": workers,
            "parallelism": workers,
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": 3600,
        },
        job_metadata={"labels": {**labels, WORKERS_LABEL: str(workers)}},
    )
    job = construct_dagster_k8s_job(job_config, torchrun, name, user_defined_k8s_config=user_config, labels=labels)
    job_dict = ApiClient().sanitize_for_serialization(job)
    job_dict.setdefault("apiVersion", "batch/v1")
    job_dict.setdefault("kind", "Job")
    job_dict["metadata"]["namespace"] = config.namespace
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": svc, "namespace": config.namespace, "labels": dict(labels)},
        "spec": {"clusterIP": "None", "selector": dict(labels), "publishNotReadyAddresses": True,
                 "ports": [{"name": "rdzv", "port": config.rdzv_port, "targetPort": config.rdzv_port}]},
    }
    return [service, job_dict]


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


@dataclass
class KubernetesLauncher:
    """Rescale a pipeline's Indexed Job through dagster-k8s's client (see module docstring)."""

    pipeline: str
    config: KubernetesTrainerConfig
    client: Any = None  # DagsterKubernetesClient
    core_api: Any = None
    sleeper: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    poll_s: float = 2.0
    records: list = field(default_factory=list)

    def __post_init__(self):
        if self.client is None:
            from dagster_k8s.client import DagsterKubernetesClient

            self.client = DagsterKubernetesClient.production_client()
        if self.core_api is None:
            self.core_api = self.client.core_api

    # --- reading state -----------------------------------------------------------

    def _selector(self) -> str:
        return f"{PIPELINE_LABEL}={self.pipeline}"

    def current_job(self) -> Optional[Any]:
        jobs = self.client.batch_api.list_namespaced_job(self.config.namespace, label_selector=self._selector()).items
        live = [j for j in jobs if not (j.metadata.deletion_timestamp)]
        return max(live, key=lambda j: j.metadata.creation_timestamp or 0) if live else None

    @property
    def workers(self) -> int:
        job = self.current_job()
        return int(job.spec.parallelism) if job is not None else 0

    # --- launcher interface ------------------------------------------------------------

    def start(self, n: int, reason: str = "start") -> RescaleRecord:
        return self._restart(n, reason)

    def rescale(self, m: int, reason: str = "rescale") -> Optional[RescaleRecord]:
        job = self.current_job()
        if job is not None and int(job.spec.parallelism) == m:
            state, _ = pods_state(self.client.get_pods_in_job(job.metadata.name, self.config.namespace))
            if state == "ready":
                return None  # idempotent: the same target twice does nothing
        return self._restart(m, reason)

    def stop(self) -> None:
        job = self.current_job()
        if job is not None:
            self._delete_and_wait(job.metadata.name)

    # --- internals ---------------------------------------------------------------------

    def _ensure_service(self, service: dict) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self.core_api.read_namespaced_service(service["metadata"]["name"], self.config.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.core_api.create_namespaced_service(self.config.namespace, service)

    def _delete_and_wait(self, name: str) -> None:
        self.client.delete_job(name, self.config.namespace)
        deadline = self.clock() + self.config.stop_timeout_s + self.config.termination_grace_period_s
        while self.client.get_pods_in_job(name, self.config.namespace):
            if self.clock() > deadline:
                raise TimeoutError(f"pods of job {name} still terminating after {self.config.stop_timeout_s + self.config.termination_grace_period_s:.0f} s")
            self.sleeper(self.poll_s)

    def _create_and_wait(self, workers: int, generation: int) -> str:
        service, job = render(self.pipeline, self.config, workers, generation)
        self._ensure_service(service)
        name = job["metadata"]["name"]
        self.client.batch_api.create_namespaced_job(self.config.namespace, job)
        deadline = self.clock() + self.config.ready_timeout_s
        while True:
            state, why = pods_state(self.client.get_pods_in_job(name, self.config.namespace))
            if state == "ready":
                return name
            if state == "failed":
                raise RuntimeError(why)
            if self.clock() > deadline:
                raise TimeoutError(f"{why} after {self.config.ready_timeout_s:.0f} s")
            self.sleeper(self.poll_s)

    def _restart(self, workers: int, reason: str) -> RescaleRecord:
        from kubernetes.client.rest import ApiException

        if workers < 1:
            raise KaleConfigError("workers", f"must be >= 1, got {workers}")
        started = self.clock()
        old = self.current_job()
        previous = int(old.spec.parallelism) if old is not None else 0
        generation = int(time.time())
        if old is not None:
            self._delete_and_wait(old.metadata.name)
        try:
            self._create_and_wait(workers, generation)
        except (ApiException, RuntimeError, TimeoutError) as exc:
            why = f"API error {exc.status} {exc.reason}" if isinstance(exc, ApiException) else str(exc)
            self._cleanup(job_name(self.pipeline, workers, generation))
            restored = None
            if previous:
                try:
                    self._create_and_wait(previous, generation + 1)
                    restored = previous
                except (ApiException, RuntimeError, TimeoutError) as again:
                    raise RescaleFailed(f"could not start {workers} workers ({why}); restoring {previous} also failed: {again}", None) from exc
            raise RescaleFailed(f"could not start {workers} workers ({why}); restored {previous} workers", restored) from exc
        record = RescaleRecord(time=time.time(), from_workers=previous, to_workers=workers, downtime_s=self.clock() - started, reason=reason)
        self.records.append(record)
        return record

    def _cleanup(self, name: str) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self._delete_and_wait(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
