"""Kubernetes launcher: the worker group as an Indexed Job of GPU pods, rescaled by restart.

Manifests (``kubernetes_render.render``), for N workers in pods of G (the limits' ``workers_per_pod``): a headless
Service ``kale-<pipeline>-workers`` (stable DNS names for torchrun's c10d rendezvous at pod index 0), and an Indexed Job
``kale-<pipeline>-w<N>-<generation>`` of N/G pods, each asking for G ``nvidia.com/gpu`` and running the trainer
under ``torchrun --nnodes=N/G --nproc-per-node=G`` (a pod's workers all-reduce over NVLink).  Built with
dagster-k8s (``construct_dagster_k8s_job``), created and deleted through its ``DagsterKubernetesClient``.  Kafka
and store credentials are Secrets referenced with ``envFrom``, never written into a manifest, a log or metadata;
the stream's other settings are plain environment variables.  Checkpoints go to an object-store prefix or a
ReadWriteMany claim mounted at ``/checkpoints``.

Rescale: delete the running Job and its pods (each gets SIGTERM and ``terminationGracePeriodSeconds`` to finish
the step, checkpoint and commit), wait until they are gone, create the Job at the new size, wait until every pod
is Ready and its log shows the first training step: the downtime ends where the local launcher's does.  If the
new Job cannot start (API error, image pull failure, timeout) it is deleted and the previous size restored.

Capacity: pods that no node holds (kube-scheduler's Unschedulable, a FailedScheduling event), or a Job Kueue has
not admitted (``queue_name``: it stays suspended), past ``capacity_timeout_s`` are a shortfall.  The restart then
forms the largest size that runs, never less than before, and records it on that Job (``kale.dev/capacity``) as
a ceiling the planner reads through ``status`` for ``capacity_hold_s``, or until the namespace's pods hold fewer
GPUs than when it was found.

Retarget: the restart lives in the rescale run's process, the decision in the sensor's.  The restart creates its
Job annotated ``kale.dev/forming`` until every pod has stepped; the sensor's launcher writes a larger size on a
forming Job (``kale.dev/retarget-to``), which the restart reads at every poll, giving that Job up for the larger
one.  A retarget written as the Job finishes forming comes too late: the next decision rescales instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kale_dagster.errors import KaleConfigError
from kale_dagster.launchers.base import (
    CapacityShortfall,
    GroupLauncher,
    LauncherConfig,
    RescaleFailed,
    Retargeted,
)
from kale_dagster.launchers.capacity import (
    Unplaced,
    capacity_hold_setting,
    capacity_holding,
    capacity_record,
    capacity_timeout_setting,
    gpus_in_use,
    shortfall,
)
from kale_dagster.launchers.kubernetes_jobs import NamespacedJobs
from kale_dagster.launchers.kubernetes_manifests import (
    CHECKPOINT_MOUNT,
    FORMING_ANNOTATION,
    PIPELINE_LABEL,
    RETARGET_ANNOTATION,
    RETARGET_REASON_ANNOTATION,
    annotated_retarget,
    forming,
    job_name,
    rescale_service_account_setting,
    service_account_tags,
    workers_of,
)
from kale_dagster.launchers.kubernetes_render import render
from kale_dagster.launchers.pods import pods_state
from kale_dagster.rules import check, need, setting
from kale_dagster.stream.source import KafkaSource
from kale_dagster.trainer.api import TrainerSpec
from kale_dagster.trainer.location import STORE_HINT, STORE_URL


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
    rescale_service_account: str | None = rescale_service_account_setting()
    gpus_per_worker: int = setting(
        1, ge=0, le=16, description="nvidia.com/gpu per worker process (a pod asks for this times workers_per_pod)"
    )
    cpu: str = setting("4", description="CPU request and limit per worker pod")
    memory: str = setting("16Gi", description="memory request and limit per worker pod")
    node_selector: dict = setting(default_factory=dict, description="the worker pods' nodeSelector")
    tolerations: tuple[dict, ...] = setting((), description="the worker pods' tolerations")
    kafka_secret: str | None = setting(
        None, description="a Secret whose keys become the workers' environment (e.g. KAFKA_SASL_PASSWORD)"
    )
    kafka_tls_secret: str | None = setting(
        None,
        description="a Secret holding the source's TLS files by file name (ca.pem, client.pem, client.key), mounted "
        "read-only in every worker pod; without it, the source's paths must exist in the image",
    )
    trainer_args: tuple[str, ...] = setting((), description="extra arguments of the trainer (never credentials)")
    termination_grace_period_s: int = setting(
        120, ge=10, le=3600, unit="s", description="a stopped pod's time to checkpoint"
    )
    rdzv_port: int = setting(29400, ge=1, le=65535, description="torchrun's rendezvous port")
    ready_timeout_s: float = setting(600.0, gt=0, unit="s", description="how long a new group may take to start")
    capacity_timeout_s: float = capacity_timeout_setting()
    capacity_hold_s: float = capacity_hold_setting()
    queue_name: str | None = setting(
        None,
        pattern=r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?",
        description="a Kueue LocalQueue: the Jobs carry its label and are created suspended, for Kueue to admit",
    )
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

    def source_problem(self, source: KafkaSource) -> KaleConfigError | None:
        """The source's TLS files must be told apart by file name to share one mounted Secret."""
        files = [f for f in (source.ssl_cafile, source.ssl_certfile, source.ssl_keyfile) if f]
        names = [f.rsplit("/", 1)[-1] for f in files]
        return need(
            not self.kafka_tls_secret or len(set(names)) == len(names),
            "kafka_tls_secret",
            f"the source's TLS files share a file name ({', '.join(files)}): the Secret keys them by file name",
        )

    @property
    def checkpoint_dir(self) -> str:
        """Where the workers write checkpoints: the bucket's prefix, or the claim's mount."""
        return self.checkpoint_url or CHECKPOINT_MOUNT

    @property
    def rescale_timeout_s(self) -> float:
        """The old Job's stop, the new one's readiness twice (a retarget's, or the size kept short of capacity after
        the capacity wait), and a margin."""
        return self.stop_timeout_s + 2 * self.ready_timeout_s + self.capacity_timeout_s + 120.0

    def build(
        self, pipeline: str, source: KafkaSource, trainer: TrainerSpec, workers_per_pod: int = 1
    ) -> KubernetesLauncher:
        return KubernetesLauncher(pipeline, self, source, trainer=trainer, workers_per_pod=workers_per_pod)

    @property
    def rescale_run_tags(self) -> dict[str, str]:
        return service_account_tags(self.rescale_service_account)

    @property
    def runs_kale_trainer(self) -> bool:
        return True

    def describe(self) -> str:
        return f"Kubernetes namespace {self.namespace!r} (image {self.image})"


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
        workers_per_pod: int = 1,
        client: Any = None,  # DagsterKubernetesClient
        sleeper: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 2.0,
        wall: Callable[[], float] = time.time,
    ):
        super().__init__(clock=clock)
        if client is None:
            from dagster_k8s.client import DagsterKubernetesClient

            client = DagsterKubernetesClient.production_client()
        self.pipeline, self.config, self.source = pipeline, config, source
        self.trainer, self.workers_per_pod = trainer or TrainerSpec(), workers_per_pod
        self.client, self.core_api = client, client.core_api
        self.sleeper, self.poll_s = sleeper, poll_s
        self.jobs = NamespacedJobs(client, config.namespace, lambda: self._clock(), lambda s: self.sleeper(s), poll_s)
        self._wall = wall  # a capacity finding's expiry is read by other processes: wall-clock time
        self._volume_checked = False
        self._stopped_from = 0  # the group a retargeted restart stopped: what a failed start restores

    # --- reading state -----------------------------------------------------------

    def current_job(self) -> Any | None:
        return self.jobs.newest(f"{PIPELINE_LABEL}={self.pipeline}")

    @property
    def workers(self) -> int:
        job = self.current_job()
        return workers_of(job) if job is not None else 0

    def retarget(self, m: int, reason: str = "retarget") -> bool:
        """In the process whose restart is under way, the base class's; from any other (the sensor's), an
        annotation on the Job being formed, which that restart reads at its next poll.  False when no Job is
        being formed smaller than ``m``, or one already asks for ``m`` or more."""
        if self._target is not None:  # the restart runs in this process
            return super().retarget(m, reason)
        job = self.current_job()
        if job is None or not forming(job) or workers_of(job) >= m or annotated_retarget(job)[0] >= m:
            return False
        self.jobs.annotate(job.metadata.name, {RETARGET_ANNOTATION: str(m), RETARGET_REASON_ANNOTATION: reason[:200]})
        return True

    # --- launcher interface ------------------------------------------------------------

    def _failure(self) -> str:
        """A pod of the running Job failed (OOM, node lost, preempted): with backoffLimit 0 and torchrun's
        --max-restarts=0 nothing restarts the group, so the controller must (from the last checkpoint)."""
        job = self.current_job()
        if job is None:
            return ""
        state, why = pods_state(self.jobs.pods(job.metadata.name))
        return why if state == "failed" else ""

    def _capacity(self) -> dict:
        """The shortfall the running Job was formed under, while it holds: until its time is up, or until the
        namespace's pods hold fewer GPUs than when it was found (a pod freed up)."""
        job = self.current_job()
        if job is None:
            return {}
        return capacity_holding(job.metadata.annotations, self._wall(), lambda: gpus_in_use(self.jobs.namespace_pods()))

    def _running_at(self, n: int) -> bool:
        job = self.current_job()
        if job is None or workers_of(job) != n:
            return False
        state, _ = pods_state(self.jobs.pods(job.metadata.name))
        return state == "ready"

    def stop(self) -> None:
        job = self.current_job()
        if job is not None:
            self.jobs.delete_and_wait(job.metadata.name, self._stop_limit_s)

    def _replace_group(self, workers: int) -> dict:
        from kubernetes.client.rest import ApiException

        if self.config.checkpoint_pvc and not self._volume_checked:  # before anything stops: a declaration to fix
            self.jobs.check_shared_claim(self.config.checkpoint_pvc)
            self._volume_checked = True
        marks = [self._clock()]
        old = self.current_job()
        previous = workers_of(old) if old is not None else self._stopped_from
        self._stopped_from = 0
        generation = int(time.time())
        if old is not None:
            self.jobs.delete_and_wait(old.metadata.name, self._stop_limit_s)
        marks.append(self._clock())
        try:
            self._check_retarget()  # nothing created yet: the next attempt creates the larger Job
            self._form(workers, generation, marks)
        except Retargeted:
            self.jobs.abandon(job_name(self.pipeline, workers, generation), self.config.stop_timeout_s)
            self._stopped_from = previous
            raise
        except Unplaced as short:
            self._keep_what_runs(workers, previous, generation, short, marks)  # raises CapacityShortfall
        except (ApiException, RuntimeError, TimeoutError) as exc:
            self._restore(workers, previous, generation, _why(exc), exc)
        return _phases(marks)

    # --- internals ---------------------------------------------------------------------

    @property
    def _stop_limit_s(self) -> float:
        return self.config.stop_timeout_s + self.config.termination_grace_period_s

    def _form(self, workers: int, generation: int, marks: list[float], ceiling: str = "") -> None:
        """Create the Job of ``workers``, wait until its pods are Ready and have stepped, mark it formed (and, with a
        ``ceiling`` note, the capacity found: lifted once the namespace's pods hold fewer GPUs than they do now)."""
        name = self._create_and_wait(workers, generation)
        marks.append(self._clock())
        self.jobs.wait_first_step(name, self.config.ready_timeout_s, self._take_annotated_retarget)
        found = {}
        if ceiling:
            until, in_use = self._wall() + self.config.capacity_hold_s, gpus_in_use(self.jobs.namespace_pods())
            found = capacity_record(workers, until, in_use, ceiling)
        self.jobs.annotate(name, {FORMING_ANNOTATION: None, **found})  # no retarget from now on
        marks.append(self._clock())

    def _keep_what_runs(self, workers: int, previous: int, generation: int, short: Unplaced, marks: list) -> None:
        """The cluster placed ``short.placed`` of ``workers``: form the largest size that runs, never less than
        before, record it on the Job as a ceiling for the planner, and say so (``CapacityShortfall``)."""
        from kubernetes.client.rest import ApiException

        self.jobs.abandon(job_name(self.pipeline, workers, generation), self.config.stop_timeout_s)
        keep = max(previous, short.placed)
        found = (
            f"asked for {workers} workers, the cluster placed {short.placed} within "
            f"{self.config.capacity_timeout_s:g} s ({short.why})"
        )
        if keep == 0:
            raise RescaleFailed(f"{found}; nothing runs", None)
        hold_s, at = self.config.capacity_hold_s, time.strftime("%H:%M:%S", time.gmtime(self._wall()))
        note = f"{found}; kept {keep} at {at} UTC, a ceiling for {hold_s:g} s or until GPUs free up"
        try:
            self._form(keep, generation + 1, marks, ceiling=note)
        except (ApiException, RuntimeError, TimeoutError, Unplaced) as exc:
            self.jobs.remove(job_name(self.pipeline, keep, generation + 1), self._stop_limit_s)
            raise RescaleFailed(f"{found}; forming {keep} workers then failed too: {_why(exc)}", None) from exc
        raise CapacityShortfall(keep, note, _phases(marks))

    def _restore(self, workers: int, previous: int, generation: int, why: str, exc: Exception) -> None:
        """The Job of ``workers`` could not start: delete it, start ``previous`` again, raise ``RescaleFailed``."""
        from kubernetes.client.rest import ApiException

        self.jobs.remove(job_name(self.pipeline, workers, generation), self._stop_limit_s)
        where = f"could not start {workers} workers in namespace {self.config.namespace!r} ({why})"
        restored = None
        if previous:
            try:
                self._form(previous, generation + 1, [])
                restored = previous
            except (ApiException, RuntimeError, TimeoutError, Unplaced) as again:
                raise RescaleFailed(f"{where}; restoring {previous} also failed: {_why(again)}", None) from exc
        raise RescaleFailed(f"{where}; restored {previous} workers", restored) from exc

    def _create_and_wait(self, workers: int, generation: int) -> str:
        """Create the Job and wait until every pod is Ready; raise ``Unplaced`` when pods stay unscheduled (or a
        queued Job unadmitted) past ``capacity_timeout_s``."""
        service, job = render(
            self.pipeline, self.config, self.source, workers, generation, self.trainer, self.workers_per_pod
        )
        self.jobs.ensure_service(service)
        job["metadata"].setdefault("annotations", {})[FORMING_ANNOTATION] = "true"
        name = job["metadata"]["name"]
        self.jobs.create(job)
        created = self._clock()
        while True:
            pods = self.jobs.pods(name)
            state, why = pods_state(pods)
            if state == "ready":
                return name
            if state == "failed":
                raise RuntimeError(why)
            waited = self._clock() - created
            if waited > self.config.capacity_timeout_s:
                short = shortfall(self.jobs.read(name), pods, self.workers_per_pod, self.config.queue_name)
                if short is not None:
                    raise short
            if waited > self.config.ready_timeout_s:
                raise TimeoutError(f"{why} after {self.config.ready_timeout_s:.0f} s")
            self._take_annotated_retarget()
            self.sleeper(self.poll_s)

    def _take_annotated_retarget(self) -> None:
        """Take a retarget another process wrote on the Job being formed, then ``_check_retarget``."""
        job = self.current_job()
        wanted, reason = annotated_retarget(job) if job is not None else (0, "")
        if wanted:
            super().retarget(wanted, reason)  # taken only if larger than the restart aims at
        self._check_retarget()


def _why(exc: Exception) -> str:
    from kubernetes.client.rest import ApiException

    return f"API error {exc.status} {exc.reason}" if isinstance(exc, ApiException) else str(exc)


def _phases(marks: list[float]) -> dict:
    return {name: round(b - a, 3) for name, a, b in zip(("stop", "pods_ready", "first_step"), marks, marks[1:])}
