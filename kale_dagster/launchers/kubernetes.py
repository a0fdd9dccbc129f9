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

The stream (servers, topic, group) comes from the pipeline's ``KafkaSource``; its non-secret security settings
are plain environment variables of the pods, the password a key of the Secret (``KAFKA_SASL_PASSWORD``, see
``stream.source.WORKER_ENV``).

Rescale: delete the running Job with foreground propagation (pods get
SIGTERM and ``terminationGracePeriodSeconds`` to finish the step and
checkpoint), wait until its pods are gone, create the Job at the new size,
wait until every pod is Ready, then until every pod's log shows the
worker's first training step: the downtime ends where the local
launcher's does.  If the new Job cannot start (API error 403/409/422/5xx,
image pull failure, timeout) it is deleted and the previous size is
restored, so the pipeline never ends up with nothing.

Retarget: the restart lives in the rescale run's process, the decision in the sensor's.  The restart creates its
Job annotated ``kale.dev/forming`` and removes that once every pod has stepped; the sensor's launcher writes the
larger size as another annotation of a forming Job (``kale.dev/retarget-to``), which the restart reads at every
poll of its waits, giving that Job up and creating the larger one.  A retarget written as the Job finishes forming
may come too late for it: the rescale run has then ended, and the next decision rescales instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from kale_dagster.errors import KaleConfigError
from kale_dagster.launchers.base import GroupLauncher, LauncherConfig, RescaleFailed, Retargeted
from kale_dagster.launchers.kubernetes_manifests import (
    APP_LABEL,
    CHECKPOINT_MOUNT,
    PIPELINE_LABEL,
    WORKERS_LABEL,
    headless_service,
    job_name,
    service_name,
)
from kale_dagster.launchers.pods import pods_state, stepped
from kale_dagster.rules import check, need, setting
from kale_dagster.stream.source import KafkaSource
from kale_dagster.trainer.api import TrainerSpec
from kale_dagster.trainer.location import STORE_HINT, STORE_URL
from kale_dagster.trainer.settings import TrainerSettings

#: A retarget decided in another process than the restart's (the sensor's): annotations on the Job being formed
#: (``kale.dev/forming`` until its pods' first step), which the restart reads at each poll of its waits.
FORMING_ANNOTATION = "kale.dev/forming"
RETARGET_ANNOTATION, RETARGET_REASON_ANNOTATION = "kale.dev/retarget-to", "kale.dev/retarget-reason"


@dataclass(frozen=True)
class KubernetesLauncherConfig(LauncherConfig):
    """Where and how a pipeline's workers run on Kubernetes."""

    image: str = setting(description="the trainer image (kale-dagster and the user's trainer installed)")
    checkpoint_pvc: str | None = setting(
        None, description="a ReadWriteMany PersistentVolumeClaim every worker pod mounts; it holds the checkpoints"
    )
    checkpoint_url: str | None = setting(
        None, pattern=STORE_URL, hint=STORE_HINT, description="or: the object-store prefix holding the checkpoints"
    )
    storage_secret: str | None = setting(
        None, description="a Secret whose keys become the workers' environment for the store (AWS_ACCESS_KEY_ID...)"
    )
    namespace: str = setting("default", description="where the Jobs and Services are created")
    image_pull_policy: str = setting(
        "IfNotPresent", choices=("Always", "IfNotPresent", "Never"), description="the worker container's pull policy"
    )
    image_pull_secrets: tuple[str, ...] = setting((), description="Secrets to pull the image with")
    service_account: str | None = setting(None, description="the worker pods' service account")
    gpus_per_worker: int = setting(1, ge=0, le=16, description="nvidia.com/gpu per worker pod")
    cpu: str = setting("4", description="CPU request and limit per worker pod")
    memory: str = setting("16Gi", description="memory request and limit per worker pod")
    node_selector: dict = setting(default_factory=dict, description="the worker pods' nodeSelector")
    tolerations: tuple[dict, ...] = setting((), description="the worker pods' tolerations")
    kafka_secret: str | None = setting(
        None, description="a Secret whose keys become the workers' environment (e.g. KAFKA_SASL_PASSWORD)"
    )
    trainer_args: tuple[str, ...] = setting((), description="extra arguments of the trainer (never credentials)")
    termination_grace_period_s: int = setting(
        120, ge=10, le=3600, unit="s", description="a stopped pod's time to checkpoint"
    )
    rdzv_port: int = setting(29400, ge=1, le=65535, description="torchrun's rendezvous port")
    ready_timeout_s: float = setting(600.0, gt=0, unit="s", description="how long a new group may take to start")
    stop_timeout_s: float = setting(300.0, gt=0, unit="s", description="how long an old group may take to stop")

    def __post_init__(self):
        check(
            self,
            need(bool(self.image), "image", "the trainer image is required (e.g. registry.example.com/trainer:1.4)"),
            need(
                bool(self.checkpoint_pvc) != bool(self.checkpoint_url),
                "checkpoint_pvc",
                "give one place for the checkpoints: checkpoint_pvc (a ReadWriteMany PersistentVolumeClaim every "
                "worker pod mounts) or checkpoint_url (s3://, gs://, az://)",
            ),
            lambda: need(  # once trainer_args is known to be a tuple
                not any("password" in str(a).lower() or "secret" in str(a).lower() for a in self.trainer_args),
                "trainer_args",
                "credentials must come from kafka_secret, not command-line arguments",
            ),
        )

    @property
    def checkpoint_dir(self) -> str:
        """Where the workers write checkpoints: the bucket's prefix, or the claim's mount."""
        return self.checkpoint_url or CHECKPOINT_MOUNT

    @property
    def rescale_timeout_s(self) -> float:  # the old Job's stop, the new one's readiness (twice: a retarget's), a margin
        return self.stop_timeout_s + 2 * self.ready_timeout_s + 120.0

    def build(self, pipeline: str, source: KafkaSource, trainer: TrainerSpec) -> KubernetesLauncher:
        return KubernetesLauncher(pipeline, self, source, trainer=trainer)

    def describe(self) -> str:
        return f"Kubernetes namespace {self.namespace!r} (image {self.image})"


def render(
    pipeline: str,
    config: KubernetesLauncherConfig,
    source: KafkaSource,
    workers: int,
    generation: int = 1,
    trainer: TrainerSpec | None = None,
) -> list[dict]:
    """The Service and Job manifests for ``workers`` pods, as plain dicts (for review, GitOps, validation)."""
    from dagster_k8s.job import DagsterK8sJobConfig, construct_dagster_k8s_job
    from kubernetes.client import ApiClient

    if workers < 1:
        raise KaleConfigError("workers", f"must be >= 1, got {workers}")
    name = job_name(pipeline, workers, generation)
    labels = {APP_LABEL: "kale-trainer", PIPELINE_LABEL: pipeline}
    job_config = DagsterK8sJobConfig(
        job_image=config.image,
        image_pull_policy=config.image_pull_policy,
        image_pull_secrets=[{"name": s} for s in config.image_pull_secrets],
        service_account_name=config.service_account,
        env_secrets=[s for s in (config.kafka_secret, config.storage_secret) if s],
        volume_mounts=[{"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT}] if config.checkpoint_pvc else [],
        volumes=[{"name": "checkpoints", "persistentVolumeClaim": {"claimName": config.checkpoint_pvc}}]
        if config.checkpoint_pvc
        else [],
        labels=labels,
    )
    args = _torchrun_args(pipeline, config, source, workers, name, trainer or TrainerSpec())
    user_config = _user_config(pipeline, config, source, workers, labels)
    job = construct_dagster_k8s_job(job_config, args, name, user_defined_k8s_config=user_config, labels=labels)
    job_dict: dict[str, Any] = cast(dict, ApiClient().sanitize_for_serialization(job))  # a Job serialises to a dict
    job_dict.setdefault("apiVersion", "batch/v1")
    job_dict.setdefault("kind", "Job")
    job_dict["metadata"]["namespace"] = config.namespace
    return [headless_service(pipeline, config.namespace, config.rdzv_port, labels), job_dict]


def _torchrun_args(
    pipeline: str, config: KubernetesLauncherConfig, source: KafkaSource, workers: int, name: str, trainer: TrainerSpec
) -> list[str]:
    """torchrun's arguments: one process per pod, rendezvous at pod 0, then the worker with its settings' flags."""
    svc = service_name(pipeline)
    return [
        f"--nnodes={workers}",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={name}-0.{svc}.{config.namespace}.svc.cluster.local:{config.rdzv_port}",
        f"--rdzv-id={name}",
        "--max-restarts=0",
        "-m",
        "kale_dagster.trainer.worker",
        *TrainerSettings(source, config.checkpoint_dir, trainer=trainer, pipeline=pipeline).argv(),
        *config.trainer_args,
    ]


def _user_config(pipeline: str, config: KubernetesLauncherConfig, source: KafkaSource, workers: int, labels: dict):
    """What dagster-k8s's Job gets beyond its defaults: the container, the pod and the Indexed Job's spec."""
    from dagster_k8s.job import UserDefinedDagsterK8sConfig

    limits: dict[str, Any] = {"cpu": config.cpu, "memory": config.memory}
    if config.gpus_per_worker:
        limits["nvidia.com/gpu"] = str(config.gpus_per_worker)
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
            "env": [{"name": k, "value": v} for k, v in sorted(source.worker_env(include_password=False).items())],
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


class KubernetesLauncher(GroupLauncher):
    """Rescale a pipeline's Indexed Job through dagster-k8s's client (see module docstring)."""

    @property
    def supports_retarget(self) -> bool:  # a Job still forming is deleted at once and one of the larger size created
        return True

    def __init__(
        self,
        pipeline: str,
        config: KubernetesLauncherConfig,
        source: KafkaSource,
        trainer: TrainerSpec | None = None,
        client: Any = None,  # DagsterKubernetesClient
        sleeper: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 2.0,
    ):
        super().__init__(clock=clock)
        if client is None:
            from dagster_k8s.client import DagsterKubernetesClient

            client = DagsterKubernetesClient.production_client()
        self.pipeline, self.config, self.source = pipeline, config, source
        self.trainer = trainer or TrainerSpec()
        self.client, self.core_api = client, client.core_api
        self.sleeper, self.poll_s = sleeper, poll_s
        self._volume_checked = False
        self._stopped_from = 0  # the group a retargeted restart stopped: what a failed start restores

    # --- reading state -----------------------------------------------------------

    def _selector(self) -> str:
        return f"{PIPELINE_LABEL}={self.pipeline}"

    def current_job(self) -> Any | None:
        jobs = self.client.batch_api.list_namespaced_job(self.config.namespace, label_selector=self._selector()).items
        live = [j for j in jobs if not (j.metadata.deletion_timestamp)]
        return max(live, key=lambda j: j.metadata.creation_timestamp or 0) if live else None

    @property
    def workers(self) -> int:
        job = self.current_job()
        return int(job.spec.parallelism) if job is not None else 0

    def retarget(self, m: int, reason: str = "retarget") -> bool:
        """In the process whose restart is under way, the base class's; from any other (the sensor's), an
        annotation on the Job being formed, which that restart reads at its next poll.  False when no Job is
        being formed smaller than ``m``, or one already asks for ``m`` or more."""
        if self._target is not None:  # the restart runs in this process
            return super().retarget(m, reason)
        job = self.current_job()
        if job is None or not _forming(job) or int(job.spec.parallelism) >= m or _annotated_retarget(job)[0] >= m:
            return False
        annotations = {RETARGET_ANNOTATION: str(m), RETARGET_REASON_ANNOTATION: reason[:200]}
        self.client.batch_api.patch_namespaced_job(
            job.metadata.name, self.config.namespace, {"metadata": {"annotations": annotations}}
        )
        return True

    # --- launcher interface ------------------------------------------------------------

    def _failure(self) -> str:
        """A pod of the running Job failed (OOM, node lost, preempted): with backoffLimit 0 and torchrun's
        --max-restarts=0 nothing restarts the group, so the controller must (from the last checkpoint)."""
        job = self.current_job()
        if job is None:
            return ""
        state, why = pods_state(self.client.get_pods_in_job(job.metadata.name, self.config.namespace))
        return why if state == "failed" else ""

    def _running_at(self, n: int) -> bool:
        job = self.current_job()
        if job is None or int(job.spec.parallelism) != n:
            return False
        state, _ = pods_state(self.client.get_pods_in_job(job.metadata.name, self.config.namespace))
        return state == "ready"

    def stop(self) -> None:
        job = self.current_job()
        if job is not None:
            self._delete_and_wait(job.metadata.name)

    def _replace_group(self, workers: int) -> dict:
        from kubernetes.client.rest import ApiException

        self._check_checkpoint_volume()  # before anything stops: a volume the pods cannot share is a declaration to fix
        marks = [self._clock()]
        old = self.current_job()
        previous = int(old.spec.parallelism) if old is not None else self._stopped_from
        self._stopped_from = 0
        generation = int(time.time())
        if old is not None:
            self._delete_and_wait(old.metadata.name)
        marks.append(self._clock())
        try:
            self._check_retarget()  # nothing created yet: the next attempt creates the larger Job
            name = self._create_and_wait(workers, generation)
            marks.append(self._clock())
            self._wait_first_step(name)
            self._formed(name)
            marks.append(self._clock())
        except Retargeted:
            self._abandon(job_name(self.pipeline, workers, generation))
            self._stopped_from = previous
            raise
        except (ApiException, RuntimeError, TimeoutError) as exc:
            why = f"API error {exc.status} {exc.reason}" if isinstance(exc, ApiException) else str(exc)
            self._cleanup(job_name(self.pipeline, workers, generation))
            restored = None
            if previous:
                try:
                    self._formed(self._create_and_wait(previous, generation + 1))
                    restored = previous
                except (ApiException, RuntimeError, TimeoutError) as again:
                    raise RescaleFailed(
                        f"could not start {workers} workers in namespace {self.config.namespace!r} ({why}); restoring "
                        f"{previous} also failed: {again}",
                        None,
                    ) from exc
            raise RescaleFailed(
                f"could not start {workers} workers in namespace {self.config.namespace!r} ({why}); restored "
                f"{previous} workers",
                restored,
            ) from exc
        return {name: round(b - a, 3) for name, a, b in zip(("stop", "pods_ready", "first_step"), marks, marks[1:])}

    # --- internals ---------------------------------------------------------------------

    def _check_checkpoint_volume(self) -> None:
        """Every worker pod mounts the checkpoint claim, on whichever node it lands: it must be ReadWriteMany."""
        if self._volume_checked or not self.config.checkpoint_pvc:  # checkpoints in a bucket: no claim to check
            return
        from kubernetes.client.rest import ApiException

        name, ns = self.config.checkpoint_pvc, self.config.namespace
        try:
            claim = self.core_api.read_namespaced_persistent_volume_claim(name, ns)
        except ApiException as exc:
            raise RescaleFailed(
                f"cannot read the checkpoint PersistentVolumeClaim {name!r} in namespace {ns!r} (API error "
                f"{exc.status} {exc.reason}); create it ReadWriteMany, and grant get on persistentvolumeclaims "
                "(docs/kubernetes/rbac.yaml)",
                None,
            ) from exc
        modes = list(getattr(claim.spec, "access_modes", None) or [])
        if "ReadWriteMany" not in modes:
            raise RescaleFailed(
                f"the checkpoint PersistentVolumeClaim {name!r} is {'/'.join(modes) or 'without access modes'}; "
                "workers on several nodes share it, so it must be ReadWriteMany (e.g. NFS, CephFS, EFS, Filestore)",
                None,
            )
        self._volume_checked = True

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
        limit = self.config.stop_timeout_s + self.config.termination_grace_period_s
        if not self._pods_gone(name, limit):
            raise TimeoutError(f"pods of job {name} still terminating after {limit:.0f} s")

    def _pods_gone(self, name: str, timeout_s: float) -> bool:
        """Wait until the Job's pods are gone; whether they went within ``timeout_s``."""
        deadline = self._clock() + timeout_s
        while self.client.get_pods_in_job(name, self.config.namespace):
            if self._clock() > deadline:
                return False
            self.sleeper(self.poll_s)
        return True

    def _abandon(self, name: str) -> None:
        """Delete a Job still forming, for a retarget, its pods without a grace period: before their first step they
        have trained nothing, written no checkpoint and committed no offset, and a graceful stop would wait out
        their restore."""
        from kubernetes.client.rest import ApiException

        namespace = self.config.namespace
        pods = [pod.metadata.name for pod in self.client.get_pods_in_job(name, namespace)]
        for delete, target in [(self.client.batch_api.delete_namespaced_job, name)] + [
            (self.core_api.delete_namespaced_pod, pod) for pod in pods
        ]:
            try:
                delete(target, namespace, grace_period_seconds=0, propagation_policy="Background")
            except ApiException as exc:
                if exc.status != 404:
                    raise
        # Deleted without grace: a pod still there past the stop timeout is the kubelet's to reap, no failure.
        self._pods_gone(name, self.config.stop_timeout_s)

    def _create_and_wait(self, workers: int, generation: int) -> str:
        service, job = render(self.pipeline, self.config, self.source, workers, generation, self.trainer)
        self._ensure_service(service)
        job["metadata"].setdefault("annotations", {})[FORMING_ANNOTATION] = "true"
        name = job["metadata"]["name"]
        self.client.batch_api.create_namespaced_job(self.config.namespace, job)
        deadline = self._clock() + self.config.ready_timeout_s
        while True:
            state, why = pods_state(self.client.get_pods_in_job(name, self.config.namespace))
            if state == "ready":
                return name
            if state == "failed":
                raise RuntimeError(why)
            if self._clock() > deadline:
                raise TimeoutError(f"{why} after {self.config.ready_timeout_s:.0f} s")
            self._take_annotated_retarget()
            self.sleeper(self.poll_s)

    def _wait_first_step(self, name: str) -> None:
        """Until every pod's log shows the worker's first step (the local launcher waits for the same event)."""
        deadline = self._clock() + self.config.ready_timeout_s
        pending = {pod.metadata.name for pod in self.client.get_pods_in_job(name, self.config.namespace)}
        while pending:
            pending = {pod for pod in pending if not stepped(self.client.retrieve_pod_logs(pod, self.config.namespace))}
            if not pending:
                return
            if self._clock() > deadline:
                raise TimeoutError(
                    f"{len(pending)} pods of job {name} ready but no training step after "
                    f"{self.config.ready_timeout_s:.0f} s"
                )
            self._take_annotated_retarget()
            self.sleeper(self.poll_s)

    def _formed(self, name: str) -> None:
        """The Job has formed: no retarget is written on it from now on."""
        body = {"metadata": {"annotations": {FORMING_ANNOTATION: None}}}
        self.client.batch_api.patch_namespaced_job(name, self.config.namespace, body)

    def _take_annotated_retarget(self) -> None:
        """Take a retarget another process wrote on the Job being formed, then ``_check_retarget``."""
        job = self.current_job()
        wanted, reason = _annotated_retarget(job) if job is not None else (0, "")
        if wanted:
            super().retarget(wanted, reason)  # taken only if larger than the restart aims at
        self._check_retarget()

    def _cleanup(self, name: str) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self._delete_and_wait(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def _forming(job: Any) -> bool:
    return FORMING_ANNOTATION in (job.metadata.annotations or {})


def _annotated_retarget(job: Any) -> tuple[int, str]:
    """(workers, reason) of a retarget written on ``job`` by another process; (0, "") when none is."""
    annotations = job.metadata.annotations or {}
    wanted = str(annotations.get(RETARGET_ANNOTATION, ""))
    return (int(wanted), str(annotations.get(RETARGET_REASON_ANNOTATION, "retarget"))) if wanted.isdigit() else (0, "")
