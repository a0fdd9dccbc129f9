"""A Kubernetes workload Kale sizes through its scale subresource, as HPA does through ``scaleTargetRef``.

Any resource with a ``/scale`` subresource: a Deployment, a StatefulSet, or a custom resource whose CRD declares
one.  Kale reads ``status.replicas`` as the workers that run and patches ``spec.replicas``; the workload's own
controller restarts the pods, and the rescale's downtime runs until the scale status shows the new size.  A
retarget while the workload has not reached its spec (a burst met by the restart) patches the spec again, to the
larger size, from whichever process decided it; the rescale's wait follows the spec.

A custom resource with an ``elasticPolicy`` (Kubeflow's PyTorchJob, whose scale subresource sets its Worker
replicas) is only sized within that policy's minReplicas and maxReplicas: a target outside them fails the rescale
in one line saying which bound to change, rather than a patch the elastic agent would not honour.

Two controllers on one scale target fight (each undoes the other's change), so a target that a
HorizontalPodAutoscaler already scales (KEDA's ScaledObjects scale through one too) is refused, naming it.  Each
rescale leaves an Event on the workload with its reason and the old and new size, where ``kubectl describe``
shows it.  The verbs this needs are in docs/kubernetes/rbac.yaml.
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
class ScaleTargetConfig(LauncherConfig):
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
        600.0, gt=0, le=86_400, unit="s", description="how long a rescale waits for the scale status to show the size"
    )

    def __post_init__(self):
        check(
            self,
            lambda: need(
                bool(self.plural) or (self.api_version == "apps/v1" and self.workload_kind in APPS_PLURALS),
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
        config: ScaleTargetConfig,
        custom_api: Any = None,
        autoscaling_api: Any = None,
        core_api: Any = None,
        sleeper: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 2.0,
        workers_per_pod: int = 1,
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
        self.sleeper, self.clock, self.poll_s = sleeper, clock, poll_s
        self.per_pod = workers_per_pod  # a replica is a pod of this many workers (a PyTorchJob's nprocPerNode)
        group, _, version = config.api_version.rpartition("/")
        self._path = dict(
            group=group, version=version, namespace=config.namespace, plural=config.resource, name=config.name
        )

    def _replicas(self) -> tuple[int, int]:
        """(the workers the workload's spec asks for, those its status shows), from the scale subresource's
        replicas (pods of ``workers_per_pod`` workers)."""
        scale = self.custom_api.get_namespaced_custom_object_scale(**self._path)
        scale = scale if isinstance(scale, dict) else scale.to_dict()
        spec, status = (scale.get(part) or {} for part in ("spec", "status"))
        return int(spec.get("replicas") or 0) * self.per_pod, int(status.get("replicas") or 0) * self.per_pod

    def _patch(self, workers: int) -> None:
        replicas = workers // self.per_pod  # decisions come in whole pods
        self.custom_api.patch_namespaced_custom_object_scale(**self._path, body={"spec": {"replicas": replicas}})

    def status(self) -> LauncherStatus:
        wanted, running = self._replicas()
        # While pods start or stop the allocation is the target (its GPUs are held), as for Kale's own launchers.
        return LauncherStatus(
            workers=wanted,
            rescaling=running != wanted,
            measures=False,
            observed_from=f"the scale status of {self.config.describe()}",
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
        started, retargets = self.clock(), []
        self._patch(m)
        self._event(before, m, reason)
        while True:
            wanted, running = self._replicas()
            if wanted != m:  # a retarget raised the spec, from this process or the sensor's
                retargets.append(retarget_note(wanted, self.clock() - started, "a later decision (its Event says why)"))
                m = wanted
            if running == m:
                break
            if self.clock() - started > self.config.ready_timeout_s:
                raise RescaleFailed(
                    f"{self.config.describe()} did not reach {m} replicas within {self.config.ready_timeout_s:g} "
                    f"s (its scale status shows {running}); its spec asks for {m}",
                    restored=None,
                )
            self.sleeper(self.poll_s)
        took = self.clock() - started
        return RescaleRecord(
            time=time.time(),
            from_workers=before,
            to_workers=m,
            downtime_s=took,
            reason="; ".join([reason, *retargets]),
            phases={"scale": round(took, 3)},
        )

    def retarget(self, m: int, reason: str = "retarget") -> bool:
        """While the workload has not reached its spec (a rescale waits on it), patch the spec to ``m`` replicas,
        more than it asks for; the rescale's wait follows the spec.  False when the workload runs at its spec or
        ``m`` is not larger."""
        wanted, running = self._replicas()
        if running == wanted or m <= wanted:
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

    def _event(self, before: int, after: int, reason: str) -> None:
        """An Event on the workload: ``kubectl describe`` shows why Kale resized it."""
        self.core_api.create_namespaced_event(
            self.config.namespace, scale_event(self.pipeline, self.config, before, after, reason)
        )


def scale_event(pipeline: str, config: ScaleTargetConfig, before: int, after: int, reason: str) -> dict:
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
