"""A namespace of a Kubernetes cluster at the client boundary, behaving as upstream's API server and controllers do.

No API server runs here, so the launchers' calls land on this fake, which keeps upstream's semantics where the
launchers depend on them (kubernetes/kubernetes, release-1.31, paths below):

* optimistic concurrency: a create of a name that exists answers 409 AlreadyExists, an update carrying a stale
  ``metadata.resourceVersion`` 409 Conflict (``apiserver/pkg/registry/generic/registry/store.go``: Create,
  GuaranteedUpdate); every write bumps the object's resourceVersion;
* RBAC: every call is checked against the Role's rules by API group, resource and verb, and refused 403 Forbidden
  (``plugin/pkg/auth/authorizer/rbac/rbac.go``: RulesAllow);
* the Job controller creates one pod per index up to ``parallelism`` unless the Job is suspended, named
  ``<job>-<index>-<suffix>`` with the ``job-name`` label (``pkg/controller/job/job_controller.go``: manageJob,
  ``indexed_job_utils.go``); deleting a batch/v1 Job without a propagation policy orphans its pods
  (``pkg/registry/batch/job/strategy.go``: DefaultGarbageCollectionPolicy), Foreground keeps the Job with a
  ``deletionTimestamp`` until its pods are gone, Background deletes them after it;
* the scheduler binds a pod to a node with enough free ``nvidia.com/gpu``; one it cannot place stays Pending with
  PodScheduled=False, reason Unschedulable, and a FailedScheduling Warning event whose message is the FitError's
  (``pkg/scheduler/schedule_one.go``: handleSchedulingFailure; ``framework/types.go``: FitError.Error);
* deleting a pod sets its ``deletionTimestamp``; it goes, and frees its GPUs, after the grace period (the call's, or
  its ``terminationGracePeriodSeconds``); a pod no node holds goes at once (``pkg/registry/core/pod/strategy.go``:
  CheckGracefulDelete);

* a Deployment's status: ``replicas`` counts its pods not terminating, ``readyReplicas`` the Ready ones, and a
  scale-in deletes unscheduled, then not-ready, then the newest pods first (``pkg/controller/deployment/sync.go``:
  calculateStatus, over ``pkg/controller/replicaset/replica_set_utils.go``: calculateStatus with
  FilterActivePods, and ``pkg/controller/controller_utils.go``: ActivePods' order); a StatefulSet creates pod
  ``<name>-<i>`` only once every lower ordinal is Running and Ready, deletes the highest first, and counts
  terminating pods in ``replicas`` (``pkg/controller/statefulset/stateful_set_control.go``: OrderedReady,
  computeReplicaStatus); a Kubeflow PyTorchJob runs ``<name>-worker-<i>`` pods, its ``active`` Worker count (the
  scale subresource's status) counting Running pods and its Running condition True once all are
  (training-operator ``pkg/controller.v1/common/pod.go``: updateJobReplicaStatuses);
* the scale subresource reads and writes the paths the resource declares (``spec.replicas``, ``status.replicas``,
  ``status.selector``; a PyTorchJob's from its CRD), and HorizontalPodAutoscalers are listed as given.

Time is the fake's: ``sleep`` advances it (hand it to a launcher as its sleeper and ``clock`` as its clock).  A
placed pod is Ready ``start_s`` after it is bound and logs its first training step ``step_s`` later.
"""

from __future__ import annotations

import copy
import itertools
import json
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import yaml
from kubernetes.client import ApiClient
from kubernetes.client.rest import ApiException

GPU = "nvidia.com/gpu"
ROOT = Path(__file__).resolve().parents[1]

#: The API group, resource and verb of each client method the launchers call.
PERMISSIONS = {
    "list_namespaced_job": ("batch", "jobs", "list"),
    "read_namespaced_job": ("batch", "jobs", "get"),
    "create_namespaced_job": ("batch", "jobs", "create"),
    "patch_namespaced_job": ("batch", "jobs", "patch"),
    "delete_namespaced_job": ("batch", "jobs", "delete"),
    "list_namespaced_pod": ("", "pods", "list"),
    "delete_namespaced_pod": ("", "pods", "delete"),
    "read_namespaced_pod_log": ("", "pods/log", "get"),
    "read_namespaced_service": ("", "services", "get"),
    "create_namespaced_service": ("", "services", "create"),
    "read_namespaced_persistent_volume_claim": ("", "persistentvolumeclaims", "get"),
    "create_namespaced_event": ("", "events", "create"),
}


#: The custom-objects client's generic calls: (the verb, whether on the scale subresource).
CUSTOM = {
    "get_namespaced_custom_object": ("get", False),
    "patch_namespaced_custom_object": ("patch", False),
    "get_namespaced_custom_object_scale": ("get", True),
    "patch_namespaced_custom_object_scale": ("patch", True),
}


def permission(method: str, kwargs: dict) -> tuple[str, str, str]:
    """(API group, resource, verb) of one client call."""
    if method in CUSTOM:
        verb, scale = CUSTOM[method]
        return kwargs["group"], kwargs["plural"] + ("/scale" if scale else ""), verb
    if method == "list_namespaced_horizontal_pod_autoscaler":
        return "autoscaling", "horizontalpodautoscalers", "list"
    return PERMISSIONS[method]


def shipped_role(name: str) -> list[dict]:
    """The rules of the Role in ``docs/kubernetes/<name>``."""
    docs = yaml.safe_load_all((ROOT / "docs" / "kubernetes" / name).read_text())
    return next(d for d in docs if d["kind"] == "Role")["rules"]


def _model(data: dict, kind: str):
    """A kubernetes client model from a manifest, as the client deserializes an answer."""
    return ApiClient().deserialize(SimpleNamespace(data=json.dumps(data)), kind)


class _Api:
    """One client API object: every method call is authorized, may be failed on purpose, then reconciled."""

    def __init__(self, cluster: FakeKubernetes, methods: dict):
        self._cluster, self._methods = cluster, methods

    def __getattr__(self, name):
        if name not in self._methods:
            raise AttributeError(name)

        def call(*args, **kwargs):
            self._cluster.calls.append(name)
            self._cluster.authorize(name, args, kwargs)
            failure = self._cluster.failures.get(name)
            if failure:
                raise failure.pop(0) if isinstance(failure, list) else failure
            self._cluster.reconcile()
            return self._methods[name](*args, **kwargs)

        return call


class FakeKubernetes:
    """One namespace: Jobs, Deployments, StatefulSets, PyTorchJobs, their pods, Services, nodes with GPUs, Events
    (module docstring)."""

    def __init__(
        self,
        node_gpus: tuple[int, ...] = (8, 8),
        rules: list[dict] | None = None,
        namespace: str = "ml",
        start_s: float = 20.0,
        step_s: float = 10.0,
    ):
        self.node_gpus, self.rules, self.namespace = list(node_gpus), rules, namespace
        self.start_s, self.step_s, self.now = start_s, step_s, 1_000.0
        self.jobs: dict[str, dict] = {}
        self.pods: dict[str, dict] = {}
        self.services: dict[str, dict] = {}
        self.events: list[dict] = []
        self.calls: list[str] = []
        self.used: set[tuple[str, str, str]] = set()  # (group, resource, verb) of every call
        self.failures: dict[str, ApiException | list[ApiException]] = {}
        self._rv, self._suffix = itertools.count(1), itertools.count(1)
        self.workloads: dict[tuple[str, str], dict] = {}  # (plural, name) -> a Deployment, StatefulSet, PyTorchJob
        self.hpas: list = []
        self.custom = _Api(
            self,
            {
                "get_namespaced_custom_object": lambda **kw: copy.deepcopy(self._workload(kw)),
                "patch_namespaced_custom_object": self._patch_workload,
                "get_namespaced_custom_object_scale": self._scale,
                "patch_namespaced_custom_object_scale": self._patch_scale,
            },
        )
        self.autoscaling = _Api(
            self,
            {"list_namespaced_horizontal_pod_autoscaler": lambda namespace, **kw: SimpleNamespace(items=self.hpas)},
        )
        self.batch = _Api(
            self,
            {
                "list_namespaced_job": self._list_jobs,
                "read_namespaced_job": lambda name, namespace, **kw: _model(self._job(name), "V1Job"),
                "create_namespaced_job": self._create_job,
                "patch_namespaced_job": self._patch_job,
                "delete_namespaced_job": self._delete_job,
            },
        )
        self.core = _Api(
            self,
            {
                "list_namespaced_pod": self._list_pods,
                "delete_namespaced_pod": self._delete_pod,
                "read_namespaced_pod_log": self._log,
                "read_namespaced_service": self._read_service,
                "create_namespaced_service": self._create_service,
                "read_namespaced_persistent_volume_claim": lambda name, namespace, **kw: _model(
                    {"spec": {"accessModes": ["ReadWriteMany"]}}, "V1PersistentVolumeClaim"
                ),
                "create_namespaced_event": lambda namespace, body, **kw: self.events.append(body),
            },
        )

    # --- time and the controllers --------------------------------------------------

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.reconcile()

    def free_gpus(self) -> list[int]:
        used = [0] * len(self.node_gpus)
        for pod in self.pods.values():
            node = pod["spec"].get("nodeName")
            if node is not None:
                used[int(node.split("-")[-1])] += _gpus(pod)
        return [total - u for total, u in zip(self.node_gpus, used)]

    def reconcile(self) -> None:
        """Each controller's pass: the kubelet ends pods past their grace, the Job controller creates pods, the
        scheduler binds what fits, the kubelet starts what is bound, the garbage collector ends foreground deletes."""
        for name, pod in list(self.pods.items()):
            gone = pod.get("_gone_at")
            if gone is not None and self.now >= gone:
                del self.pods[name]
        for job in self.jobs.values():
            if not job["spec"].get("suspend") and "_deleted_at" not in job:
                self._job_pods(job)
        for name in [n for n, j in self.jobs.items() if "_deleted_at" in j]:
            if not self._pods_of(name):
                del self.jobs[name]
        for (plural, name), workload in self.workloads.items():
            CONTROLLERS[plural](self, name, workload)
        self._schedule()
        for pod in self.pods.values():
            bound = pod["status"].get("boundAt")
            if bound is not None and self.now >= bound + self.start_s:
                pod["status"].update(phase="Running", conditions=[{"type": "Ready", "status": "True"}])

    def _job_pods(self, job: dict) -> None:
        name = job["metadata"]["name"]
        have = {p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] for p in self._pods_of(name)}
        for index in range(int(job["spec"]["parallelism"])):
            if str(index) not in have:
                self._add_pod(f"{name}-{index}-{next(self._suffix):05d}", job["spec"]["template"], name, index)

    def _add_pod(self, name: str, template: dict, job: str | None, index: int | None, labels: dict | None = None):
        meta = template.get("metadata") or {}
        pod_labels = {**(meta.get("labels") or {}), **(labels or {})}
        if job is not None:
            pod_labels.update({"job-name": job, "batch.kubernetes.io/job-completion-index": str(index)})
        self.pods[name] = {
            "metadata": {"name": name, "labels": pod_labels, "creationTimestamp": _iso(self.now)},
            "_created": self.now,
            "spec": copy.deepcopy(template["spec"]),
            "status": {"phase": "Pending", "conditions": []},
        }

    def _schedule(self) -> None:
        for pod in sorted(self.pods.values(), key=lambda p: p["_created"]):
            if pod["spec"].get("nodeName") or "_gone_at" in pod:
                continue
            free = self.free_gpus()
            fits = [i for i, f in enumerate(free) if f >= _gpus(pod)]
            if fits:
                pod["spec"]["nodeName"] = f"gpu-node-{fits[0]}"
                pod["status"].update(conditions=[{"type": "PodScheduled", "status": "True"}], boundAt=self.now)
                continue
            short = sum(1 for f in free if f < _gpus(pod))
            message = f"0/{len(free)} nodes are available: {short} Insufficient {GPU}."
            if not pod["status"]["conditions"]:
                self.events.append(
                    {
                        "reason": "FailedScheduling",
                        "type": "Warning",
                        "message": message,
                        "involvedObject": {"kind": "Pod", "name": pod["metadata"]["name"]},
                    }
                )
            pod["status"]["conditions"] = [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
            ]

    # --- RBAC and concurrency ------------------------------------------------------

    def authorize(self, method: str, args: tuple, kwargs: dict) -> None:
        """RBAC's RulesAllow: a rule matches the group, resource and verb, and, when it names resources, the
        object's name (never a list or a create, which name none)."""
        group, resource, verb = permission(method, kwargs)
        name = kwargs.get("name") or (args[0] if args and method.split("_")[0] in ("read", "patch", "delete") else None)
        self.used.add((group, resource, verb))
        if self.rules is None:
            return
        for rule in self.rules:
            named = rule.get("resourceNames")
            if group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]:
                if not named or name in named:
                    return
        raise ApiException(status=403, reason="Forbidden")

    def _stamp(self, obj: dict) -> dict:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        return obj

    @staticmethod
    def _check_version(obj: dict, body: dict) -> None:
        sent = (body.get("metadata") or {}).get("resourceVersion")
        if sent is not None and sent != obj["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")

    # --- Jobs --------------------------------------------------------------------------

    def _job(self, name: str) -> dict:
        if name not in self.jobs:
            raise ApiException(status=404, reason="Not Found")
        return self.jobs[name]

    def _pods_of(self, job: str) -> list[dict]:
        return [p for p in self.pods.values() if p["metadata"]["labels"].get("job-name") == job]

    def _list_jobs(self, namespace, label_selector="", **kw):
        key, _, value = label_selector.partition("=")
        items = [j for j in self.jobs.values() if (j["metadata"].get("labels") or {}).get(key) == value]
        return _model({"items": copy.deepcopy(items)}, "V1JobList")

    def _create_job(self, namespace, body, **kw):
        name = body["metadata"]["name"]
        if name in self.jobs:
            raise ApiException(status=409, reason="AlreadyExists")
        job = copy.deepcopy(body)
        job["metadata"]["creationTimestamp"] = _iso(self.now)
        self.jobs[name] = self._stamp(job)
        self.reconcile()
        return _model(job, "V1Job")

    def _patch_job(self, name, namespace, body, **kw):
        job = self._job(name)
        self._check_version(job, body)
        merged = {**(job["metadata"].get("annotations") or {}), **(body["metadata"].get("annotations") or {})}
        job["metadata"]["annotations"] = {k: v for k, v in merged.items() if v is not None}  # null removes
        if "spec" in body:
            job["spec"].update(body["spec"])
        return _model(self._stamp(job), "V1Job")

    def _delete_job(self, name, namespace, propagation_policy=None, grace_period_seconds=None, **kw):
        job = self._job(name)
        if propagation_policy in ("Foreground", "Background"):
            for pod in self._pods_of(name):
                self._delete_pod(pod["metadata"]["name"], namespace, grace_period_seconds=grace_period_seconds)
        if propagation_policy == "Foreground" and self._pods_of(name):
            job["metadata"]["deletionTimestamp"], job["_deleted_at"] = _iso(self.now), self.now
        else:
            del self.jobs[name]  # orphaned pods (batch/v1's default) keep running, and their job-name label

    # --- pods ----------------------------------------------------------------------------

    def _list_pods(self, namespace, label_selector="", **kw):
        wanted = dict(part.split("=", 1) for part in label_selector.split(",") if part)
        items = [p for p in self.pods.values() if all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())]
        return _model({"items": copy.deepcopy(items)}, "V1PodList")

    def _delete_pod(self, name, namespace, grace_period_seconds=None, **kw):
        if name not in self.pods:
            raise ApiException(status=404, reason="Not Found")
        pod = self.pods[name]
        if not pod["spec"].get("nodeName"):
            del self.pods[name]  # never bound: nothing to stop
            return
        grace = grace_period_seconds
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        pod["_gone_at"] = min(self.now + grace, pod.get("_gone_at", float("inf")))
        pod["metadata"]["deletionTimestamp"] = _iso(pod["_gone_at"])

    def _log(self, name, namespace, **kw):
        pod = self.pods.get(name)
        if pod is None:
            raise ApiException(status=404, reason="Not Found")
        lines = ['{"event": "ready", "pid": 7}']
        bound = pod["status"].get("boundAt")
        if bound is not None and self.now >= bound + self.start_s + self.step_s:
            lines.append('[rank0]:{"event": "step", "rank": 0, "step": 1, "first": true}')
        return SimpleNamespace(data="\n".join(lines).encode())

    def _read_service(self, name, namespace, **kw):
        if name not in self.services:
            raise ApiException(status=404, reason="Not Found")
        return self.services[name]

    def _create_service(self, namespace, body, **kw):
        name = body["metadata"]["name"]
        if name in self.services:
            raise ApiException(status=409, reason="AlreadyExists")
        self.services[name] = body

    # --- workloads sized through their scale subresource ---------------------------------------

    def add_workload(self, kind: str, name: str, replicas: int, gpus: int = 1, **spec) -> dict:
        """A Deployment, StatefulSet or (elastic) PyTorchJob of ``replicas`` pods, each asking for ``gpus``."""
        plural = PLURALS[kind]
        template = {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "trainer", "resources": {"limits": {GPU: str(gpus)}}}]},
        }
        if kind == "PyTorchJob":
            body = {
                "pytorchReplicaSpecs": {
                    "Worker": {"replicas": replicas, "restartPolicy": "OnFailure", "template": template}
                },
                **spec,
            }
        else:
            body = {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template, **spec}
        group = "kubeflow.org/v1" if kind == "PyTorchJob" else "apps/v1"
        workload = {
            "apiVersion": group,
            "kind": kind,
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": body,
            "status": {},
        }
        self.workloads[(plural, name)] = self._stamp(workload)
        self.reconcile()
        return workload

    def _workload(self, path: dict) -> dict:
        workload = self.workloads.get((path["plural"], path["name"]))
        if workload is None:
            raise ApiException(status=404, reason="Not Found")
        return workload

    def _scale(self, **path):
        workload = self._workload(path)
        if path["plural"] == "pytorchjobs":
            worker = (workload["status"].get("replicaStatuses") or {}).get("Worker") or {}
            replicas, running = workload["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"], worker.get("active", 0)
            selector = worker.get("selector", "")
        else:
            replicas, running = workload["spec"]["replicas"], workload["status"].get("replicas", 0)
            selector = f"app={workload['metadata']['name']}"
        return {"spec": {"replicas": replicas}, "status": {"replicas": running, "selector": selector}}

    def _patch_scale(self, body, **path):
        workload = self._workload(path)
        self._check_version(workload, body)
        if path["plural"] == "pytorchjobs":
            workload["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = body["spec"]["replicas"]
        else:
            workload["spec"]["replicas"] = body["spec"]["replicas"]
        self._stamp(workload)
        return self._scale(**path)

    def _patch_workload(self, body, **path):
        workload = self._workload(path)
        self._check_version(workload, body)
        meta = workload["metadata"]
        merged = {**(meta.get("annotations") or {}), **(body.get("metadata", {}).get("annotations") or {})}
        meta["annotations"] = {k: v for k, v in merged.items() if v is not None}
        return copy.deepcopy(self._stamp(workload))

    def _owned(self, name: str) -> list[dict]:
        return sorted(
            (
                p
                for p in self.pods.values()
                if p["metadata"]["labels"].get("app") == name and "job-name" not in p["metadata"]["labels"]
            ),
            key=lambda p: p["_created"],
        )

    def _deployment(self, name: str, workload: dict) -> None:
        active = [p for p in self._owned(name) if "_gone_at" not in p]
        want = int(workload["spec"]["replicas"])
        for _ in range(want - len(active)):
            self._add_pod(f"{name}-{next(self._suffix):05d}", workload["spec"]["template"], None, None)
        # ActivePods' order: unscheduled before scheduled, pending before running, not ready before ready, newest.
        doomed = sorted(active, key=lambda p: (bool(p["spec"].get("nodeName")), _ready(p), -p["_created"]))
        for pod in doomed[: max(len(active) - want, 0)]:
            self._delete_pod(pod["metadata"]["name"], self.namespace)
        live = [p for p in self._owned(name) if "_gone_at" not in p]
        workload["status"] = {"replicas": len(live), "readyReplicas": sum(_ready(p) for p in live)}

    def _statefulset(self, name: str, workload: dict) -> None:
        want, pods = int(workload["spec"]["replicas"]), {p["metadata"]["name"]: p for p in self._owned(name)}
        for i in range(want):
            if f"{name}-{i}" not in pods:
                if all(_ready(pods[f"{name}-{j}"]) for j in range(i) if f"{name}-{j}" in pods):
                    self._add_pod(f"{name}-{i}", workload["spec"]["template"], None, None)
                break  # OrderedReady: one ordinal at a time
        extra = sorted((int(n.rsplit("-", 1)[1]) for n in pods if int(n.rsplit("-", 1)[1]) >= want), reverse=True)
        if extra and f"{name}-{extra[0]}" in self.pods and "_gone_at" not in self.pods[f"{name}-{extra[0]}"]:
            self._delete_pod(f"{name}-{extra[0]}", self.namespace)
        created = self._owned(name)
        workload["status"] = {"replicas": len(created), "readyReplicas": sum(_ready(p) for p in created)}

    def _pytorchjob(self, name: str, workload: dict) -> None:
        spec = workload["spec"]["pytorchReplicaSpecs"]["Worker"]
        want, pods = int(spec["replicas"]), {p["metadata"]["name"]: p for p in self._owned(name)}
        for i in range(want):
            if f"{name}-worker-{i}" not in pods:
                self._add_pod(f"{name}-worker-{i}", spec["template"], None, None)
        for pod_name in pods:
            if int(pod_name.rsplit("-", 1)[1]) >= want and "_gone_at" not in pods[pod_name]:
                self._delete_pod(pod_name, self.namespace)
        active = [p for p in self._owned(name) if p["status"]["phase"] == "Running" and "_gone_at" not in p]
        conditions = [c for c in workload["status"].get("conditions", []) if c["type"] != "Running"]
        if len(active) == want or any(c["type"] == "Running" for c in workload["status"].get("conditions", [])):
            conditions.append({"type": "Running", "status": "True" if active else "False"})
        workload["status"] = {
            "replicaStatuses": {"Worker": {"active": len(active), "selector": f"app={name}"}},
            "conditions": conditions,
        }

    # --- what a test reads -----------------------------------------------------------------

    def running_workers(self, per_pod: int = 1) -> int:
        """Workers in Jobs' pods that are Ready and not terminating."""
        ready = [
            p
            for p in self.pods.values()
            if p["status"]["phase"] == "Running" and "_gone_at" not in p and "job-name" in p["metadata"]["labels"]
        ]
        return len(ready) * per_pod


PLURALS = {"Deployment": "deployments", "StatefulSet": "statefulsets", "PyTorchJob": "pytorchjobs"}
CONTROLLERS = {
    "deployments": FakeKubernetes._deployment,
    "statefulsets": FakeKubernetes._statefulset,
    "pytorchjobs": FakeKubernetes._pytorchjob,
}


def _ready(pod: dict) -> bool:
    return pod["status"]["phase"] == "Running" and "_gone_at" not in pod


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _gpus(pod: dict) -> int:
    return sum(
        int(((c.get("resources") or {}).get("limits") or {}).get(GPU, 0)) for c in pod["spec"].get("containers", [])
    )
