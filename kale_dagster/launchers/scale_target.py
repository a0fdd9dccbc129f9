"""A Kubernetes workload Kale sizes through its scale subresource, as HPA does through ``scaleTargetRef``.

Any resource with a ``/scale`` subresource: a Deployment, a StatefulSet, or a custom resource whose CRD declares
one.  Kale patches ``spec.replicas`` (replicas are pods of ``workers_per_pod`` workers); the workload's own
controller starts or stops the pods, and the rescale is done when the new workers are ready: a Deployment's or
StatefulSet's ``readyReplicas`` (its ``status.replicas`` counts Pending pods too), a custom resource's Running
condition (a PyTorchJob's scale status counts its running Workers).  A retarget while the workload has not reached
its spec (a burst met by the restart) patches the spec again, to the larger size, from whichever process decided
it; the rescale's wait follows the spec.  Pods no node holds past ``capacity_timeout_s`` make the rescale settle
for the largest size that runs, never less than before, recorded on the workload as a ceiling for the planner
(``launchers.capacity``).

A custom resource with an ``elasticPolicy`` (Kubeflow's PyTorchJob, whose scale subresource sets its Worker
replicas) is only sized within that policy's minReplicas and maxReplicas: a target outside them fails the rescale
in one line saying which bound to change, rather than a patch the elastic agent would not honour.

Two controllers on one scale target fight (each undoes the other's change), so a target that a
HorizontalPodAutoscaler already scales (KEDA's ScaledObjects scale through one too) is refused, naming it.  Each
rescale leaves an Event on the workload with its reason and the old and new size, where ``kubectl describe``
shows it; an Event refused does not undo the rescale (the record says so).  An API error is one line naming the
call and what to fix.  The verbs this needs are in docs/kubernetes/rbac-scale-target.yaml.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from kale_dagster.launchers.base import (
    Launcher,
    LauncherConfig,
    LauncherStatus,
    RescaleFailed,
    RescaleRecord,
    retarget_note,
)
from kale_dagster.launchers.capacity import (
    capacity_hold_setting,
    capacity_holding,
    capacity_record,
    capacity_timeout_setting,
    gpus_in_use,
    unplaced,
)
from kale_dagster.launchers.kubernetes_manifests import rescale_service_account_setting, service_account_tags
from kale_dagster.rules import check, need, setting
from kale_dagster.stream.source import KafkaSource
from kale_dagster.trainer.api import TrainerSpec

#: The resources of the ``apps`` group that have a scale subresource, by kind.
APPS_PLURALS = {"Deployment": "deployments", "StatefulSet": "statefulsets", "ReplicaSet": "replicasets"}
EVENT_REASON = "KaleRescale"
#: Kubernetes object names (a DNS subdomain) and namespaces (a DNS label).
OBJECT_NAME = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"
NAMESPACE = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"


@dataclass(frozen=True)
class ScaleTargetLauncherConfig(LauncherConfig):
    """Size a Kubernetes workload through its scale subresource (``workload_kind``/``name``: HPA's scaleTargetRef)."""

    workload_kind: str = setting(
        pattern=r"[A-Z][A-Za-z0-9]*", description="the workload's kind: Deployment, StatefulSet, or a custom kind"
    )
    name: str = setting(pattern=OBJECT_NAME, description="the workload's name")
    namespace: str = setting("default", pattern=NAMESPACE, description="the workload's namespace")
    api_version: str = setting(
        "apps/v1",
        pattern=r"[a-z0-9.-]+/v[a-z0-9]+",
        description="group/version of the kind (a custom resource's, for instance kubeflow.org/v1)",
    )
    plural: str = setting(
        "",
        pattern=r"|[a-z][a-z0-9-]*",
        description="the resource's plural name; derived for Deployment, StatefulSet and ReplicaSet",
    )
    ready_timeout_s: float = setting(
        600.0, gt=0, le=86_400, unit="s", description="how long a rescale waits for the workers to be ready"
    )
    capacity_timeout_s: float = capacity_timeout_setting()
    capacity_hold_s: float = capacity_hold_setting()
    rescale_service_account: str | None = rescale_service_account_setting()

    def __post_init__(self):
        apps = self.api_version == "apps/v1"
        check(
            self,
            lambda: need(
                not apps or self.workload_kind in APPS_PLURALS,
                "workload_kind",
                f"{self.workload_kind!r} is no kind of apps/v1: {', '.join(APPS_PLURALS)} (a custom resource needs "
                "its api_version and plural too)",
            ),
            lambda: need(
                bool(self.plural) or apps,
                "plural",
                f"a {self.workload_kind} of {self.api_version} needs its plural resource name (pytorchjobs, ...)",
            ),
        )

    @property
    def resource(self) -> str:
        return self.plural or APPS_PLURALS[self.workload_kind]

    @property
    def rescale_timeout_s(self) -> float:  # the patch, the wait, and a margin
        return self.ready_timeout_s + 120.0

    def build(self, pipeline: str, source: KafkaSource, trainer: TrainerSpec, workers_per_pod: int = 1) -> ScaleTarget:
        return ScaleTarget(pipeline, self, workers_per_pod=workers_per_pod)

    @property
    def rescale_run_tags(self) -> dict[str, str]:
        return service_account_tags(self.rescale_service_account)

    def describe(self) -> str:
        return f"{self.workload_kind} {self.namespace}/{self.name}"


class ScaleTarget(Launcher):
    """Reads and patches one workload's scale subresource; what the rescale job and the controller call.

    ``custom_api``, ``autoscaling_api`` and ``core_api`` are the kubernetes client's ``CustomObjectsApi``,
    ``AutoscalingV2Api`` and ``CoreV1Api`` (built from the cluster's config when not given): the scale
    subresource of any group is reached through the custom-objects client's generic path.
    """

    def __init__(
        self,
        pipeline: str,
        config: ScaleTargetLauncherConfig,
        custom_api: Any = None,
        autoscaling_api: Any = None,
        core_api: Any = None,
        sleeper: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 2.0,
        workers_per_pod: int = 1,
        wall: Callable[[], float] = time.time,
    ):
        if custom_api is None or autoscaling_api is None or core_api is None:
            from kubernetes import client
            from kubernetes import config as kube_config

            try:
                kube_config.load_incluster_config()
            except kube_config.ConfigException:
                kube_config.load_kube_config()
            custom_api = custom_api or client.CustomObjectsApi()
            autoscaling_api = autoscaling_api or client.AutoscalingV2Api()
            core_api = core_api or client.CoreV1Api()
        self.pipeline, self.config = pipeline, config
        self.custom_api, self.autoscaling_api, self.core_api = custom_api, autoscaling_api, core_api
        self.sleeper, self.clock, self.poll_s, self.wall = sleeper, clock, poll_s, wall
        self.per_pod = workers_per_pod  # a replica is a pod of this many workers (a PyTorchJob's nprocPerNode)
        group, _, version = config.api_version.rpartition("/")
        self._path = dict(
            group=group, version=version, namespace=config.namespace, plural=config.resource, name=config.name
        )

    def _replicas(self) -> tuple[int, int, str]:
        """(the workers the workload's spec asks for, those its status shows, its pods' label selector), from the
        scale subresource's replicas (pods of ``workers_per_pod`` workers)."""
        scale = self.custom_api.get_namespaced_custom_object_scale(**self._path)
        scale = scale if isinstance(scale, dict) else scale.to_dict()
        spec, status = (scale.get(part) or {} for part in ("spec", "status"))
        wanted, running = int(spec.get("replicas") or 0), int(status.get("replicas") or 0)
        return wanted * self.per_pod, running * self.per_pod, str(status.get("selector") or "")

    def _ready(self, workload: dict, running: int) -> int:
        """The workers ready and training: a Deployment's or StatefulSet's ``readyReplicas`` (its scale status
        counts Pending pods too); for a custom resource, what its scale status shows while its Running condition
        is True and it is neither restarting nor failed (a PyTorchJob's active Worker pods), else none."""
        status = workload.get("status") or {}
        if self._path["group"] == "apps":
            return int(status.get("readyReplicas") or 0) * self.per_pod
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        settled = conditions.get("Running") == "True" and "True" not in (
            conditions.get("Restarting"),
            conditions.get("Failed"),
        )
        return running if settled else 0

    def _patch(self, workers: int) -> None:
        replicas = workers // self.per_pod  # decisions come in whole pods
        self.custom_api.patch_namespaced_custom_object_scale(**self._path, body={"spec": {"replicas": replicas}})

    def _workload(self) -> dict:
        workload = self.custom_api.get_namespaced_custom_object(**self._path)
        return workload if isinstance(workload, dict) else workload.to_dict()

    def _gpus_in_use(self) -> int:
        return gpus_in_use(self.core_api.list_namespaced_pod(self.config.namespace).items)

    def status(self) -> LauncherStatus:
        wanted, running, _ = self._replicas()
        workload = self._workload()
        ready = self._ready(workload, running)
        annotations = (workload.get("metadata") or {}).get("annotations")
        # While pods start or stop the allocation is the target (its GPUs are held), as for Kale's own launchers.
        return LauncherStatus(
            workers=wanted,
            rescaling=running != wanted or ready < wanted,
            measures=False,
            observed_from=f"the scale status of {self.config.describe()}",
            **capacity_holding(annotations, self.wall(), self._gpus_in_use),
        )

    @property
    def supports_retarget(self) -> bool:
        return True

    def _autoscaler(self) -> str | None:
        """The HorizontalPodAutoscaler that already scales this workload, if one does."""
        listed = self.autoscaling_api.list_namespaced_horizontal_pod_autoscaler(self.config.namespace)
        for hpa in listed.items:
            ref = hpa.spec.scale_target_ref
            if ref.kind == self.config.workload_kind and ref.name == self.config.name:
                return hpa.metadata.name
        return None

    def rescale(self, m: int, reason: str = "rescale") -> RescaleRecord | None:
        from kubernetes.client.rest import ApiException

        try:
            return self._rescale(m, reason)
        except ApiException as exc:
            raise RuntimeError(api_error(self.config, exc)) from exc

    def _rescale(self, m: int, reason: str) -> RescaleRecord | None:
        before = self.status().workers
        if before == m:
            return None
        self._check_elastic_bounds(m)
        owner = self._autoscaler()
        if owner is not None:
            raise RuntimeError(
                f"{self.config.describe()} is scaled by HorizontalPodAutoscaler {owner!r} (KEDA's ScaledObjects "
                "scale through one): two controllers on one scale target undo each other; remove it, or run this "
                "pipeline in advisory mode"
            )
        started, notes = self.clock(), []
        self._patch(m)
        notes += self._event(before, m, reason)
        m = self._wait_ready(m, before, started, notes)
        took = self.clock() - started
        return RescaleRecord(
            time=time.time(),
            from_workers=before,
            to_workers=m,
            downtime_s=took,
            reason="; ".join([reason, *notes]),
            phases={"scale": round(took, 3)},
        )

    def _wait_ready(self, m: int, before: int, started: float, notes: list[str]) -> int:
        """Until ``m`` workers are ready, following a retarget of the spec; pods no node holds past
        ``capacity_timeout_s`` make it settle for the largest size that runs, never less than ``before``, recorded
        on the workload as a ceiling.  Returns the size reached."""
        kept = ""  # the shortfall's note, once settled
        while True:
            wanted, running, selector = self._replicas()
            if wanted != m and not kept:  # a retarget raised the spec, from this process or the sensor's
                notes.append(retarget_note(wanted, self.clock() - started, "a later decision (its Event says why)"))
                m = wanted
            ready = self._ready(self._workload(), running)
            if running == m and ready >= m:
                if kept:
                    record = capacity_record(m, self.wall() + self.config.capacity_hold_s, self._gpus_in_use(), kept)
                    self.custom_api.patch_namespaced_custom_object(
                        **self._path, body={"metadata": {"annotations": record}}
                    )
                return m
            waited = self.clock() - started
            if not kept and waited > self.config.capacity_timeout_s:
                settled = self._settle(wanted, before, selector)
                if settled is not None:
                    m, kept = settled
                    notes.append(kept)
                    self._patch(m)
                    notes += self._event(wanted, m, kept)
            if waited > self.config.ready_timeout_s:
                raise RescaleFailed(
                    f"{self.config.describe()} did not have {m} workers ready within {self.config.ready_timeout_s:g} "
                    f"s ({ready} ready, its scale status shows {running}); its spec asks for {m}",
                    restored=None,
                )
            self.sleeper(self.poll_s)

    def _settle(self, wanted: int, before: int, selector: str) -> tuple[int, str] | None:
        """With pods no node holds: the size to keep (what the placed pods run, never less than ``before``) and
        why; None while every pod is placed."""
        pods = self.core_api.list_namespaced_pod(self.config.namespace, label_selector=selector).items
        live = [p for p in pods if not p.metadata.deletion_timestamp]
        missing, why = unplaced(live)
        if not missing:
            return None
        placed = (len(live) - missing) * self.per_pod
        keep, at = max(before, placed), time.strftime("%H:%M:%S", time.gmtime(self.wall()))
        return keep, (
            f"asked for {wanted} workers, the cluster placed {placed} within {self.config.capacity_timeout_s:g} s "
            f"({missing} pods unplaced: {why}); kept {keep} at {at} UTC, a ceiling for "
            f"{self.config.capacity_hold_s:g} s or until GPUs free up"
        )

    def retarget(self, m: int, reason: str = "retarget") -> bool:
        """While the workload has not reached its spec (a rescale waits on it), patch the spec to ``m`` replicas,
        more than it asks for; the rescale's wait follows the spec.  False when the workload runs at its spec or
        ``m`` is not larger."""
        wanted, running, _ = self._replicas()
        if (running == wanted and self._ready(self._workload(), running) >= wanted) or m <= wanted:
            return False
        self._check_elastic_bounds(m)
        self._patch(m)
        self._event(wanted, m, reason)
        return True

    def _check_elastic_bounds(self, m: int) -> None:
        if self._path["group"] == "apps":
            return
        spec = self.custom_api.get_namespaced_custom_object(**self._path).get("spec") or {}
        elastic = spec.get("elasticPolicy") or {}
        per_node = str(spec.get("nprocPerNode", elastic.get("nProcPerNode")))  # the v1.7+ field, or the deprecated
        if per_node.isdigit() and int(per_node) != self.per_pod:  # "auto", "gpu": torchrun decides
            raise RuntimeError(
                f"{self.config.describe()} runs {per_node} processes per pod (nprocPerNode) but the pipeline "
                f"plans pods of {self.per_pod} workers: set the limits' workers_per_pod to {per_node}"
            )
        low, high, replicas = elastic.get("minReplicas"), elastic.get("maxReplicas"), m // self.per_pod
        if (low is not None and replicas < low) or (high is not None and replicas > high):
            raise RuntimeError(
                f"{self.config.describe()}'s elasticPolicy allows {low if low is not None else 'any'} to "
                f"{high if high is not None else 'any'} replicas, not {replicas}: align the pipeline's limits "
                "(min_workers, max_workers) with it, or widen the policy"
            )

    def _event(self, before: int, after: int, reason: str) -> list[str]:
        """An Event on the workload: ``kubectl describe`` shows why Kale resized it.  The patch it describes has
        happened: a refused Event is said in the record (a list of one note), not raised."""
        from kubernetes.client.rest import ApiException

        try:
            self.core_api.create_namespaced_event(
                self.config.namespace, scale_event(self.pipeline, self.config, before, after, reason)
            )
        except ApiException as exc:
            return [f"its Event was refused (API error {exc.status} {exc.reason}): grant create on events"]
        return []


def api_error(config: ScaleTargetLauncherConfig, exc: Any) -> str:
    """One line for an API error while sizing the workload: what failed, and what to do."""
    what = f"{config.describe()} (API error {exc.status} {exc.reason})"
    hints = {
        403: "grant the verbs of docs/kubernetes/rbac-scale-target.yaml to the rescale job's service account",
        404: f"no {config.workload_kind} {config.name!r} in namespace {config.namespace!r}: check the declaration",
        409: "the workload changed while Kale sized it; the next decision tries again",
        422: "the API server refused the size; see the workload's admission policies",
    }
    return f"{what}: {hints.get(exc.status, 'the API server failed; the next decision tries again')}"


def scale_event(pipeline: str, config: ScaleTargetLauncherConfig, before: int, after: int, reason: str) -> dict:
    """The core/v1 Event a rescale leaves on its workload."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{config.name}.kale-", "namespace": config.namespace},
        "involvedObject": {
            "apiVersion": config.api_version,
            "kind": config.workload_kind,
            "name": config.name,
            "namespace": config.namespace,
        },
        "reason": EVENT_REASON,
        "message": f"pipeline {pipeline}: {before} -> {after} replicas: {reason}"[:1024],
        "type": "Normal",
        "source": {"component": "kale-dagster"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
