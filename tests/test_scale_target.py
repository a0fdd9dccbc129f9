"""A workload sized through its scale subresource, against a fake namespace with upstream's semantics
(``tests/fake_kubernetes.py``: a Deployment's ``status.replicas`` counts Pending pods, ``readyReplicas`` the Ready
ones; a StatefulSet starts one ordinal at a time; a PyTorchJob counts its running Workers), every call checked
against the shipped Role where a test says so, every object Kale writes validated offline."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import jsonschema
import kubernetes_validate
import pytest
import yaml

from fake_kubernetes import ROOT, FakeKubernetes, shipped_role
from kale_dagster import KafkaSource, KaleConfigError, OnlineTrainingPipeline
from kale_dagster.launchers import RescaleFailed
from kale_dagster.launchers.scale_target import EVENT_REASON, ScaleTarget, ScaleTargetLauncherConfig

K8S_VERSION = kubernetes_validate.utils.latest_version()
PYTORCHJOB = dict(workload_kind="PyTorchJob", api_version="kubeflow.org/v1", plural="pytorchjobs")
KINDS = [dict(workload_kind="Deployment"), dict(workload_kind="StatefulSet"), PYTORCHJOB]


def _target(cluster: FakeKubernetes, workers_per_pod: int = 1, **config) -> ScaleTarget:
    declared = {"workload_kind": "Deployment", "name": "ranker", "namespace": "ml", "capacity_timeout_s": 60, **config}
    return ScaleTarget(
        "ranker",
        ScaleTargetLauncherConfig(**declared),
        custom_api=cluster.custom,
        autoscaling_api=cluster.autoscaling,
        core_api=cluster.core,
        sleeper=cluster.sleep,
        clock=cluster.clock,
        wall=cluster.clock,
        poll_s=5,
        workers_per_pod=workers_per_pod,
    )


def _cluster(kind: str, replicas: int, node_gpus=(8, 8), **spec) -> FakeKubernetes:
    cluster = FakeKubernetes(node_gpus=node_gpus)
    cluster.add_workload(kind, "ranker", replicas, **spec)
    cluster.sleep(60)  # its pods run
    return cluster


@pytest.mark.parametrize("config", KINDS, ids=lambda c: c["workload_kind"])
def test_a_rescale_is_done_when_the_new_workers_are_ready(config):
    cluster = _cluster(config["workload_kind"], 2)
    target = _target(cluster, **config)
    assert target.status().workers == 2 and target.status().observed_from.startswith("the scale status")
    started = cluster.clock()
    record = target.rescale(5, reason="forecast rise")
    assert record is not None and (record.from_workers, record.to_workers) == (2, 5)
    # Not when the scale status first counted 5 (pods just created, Pending): when they were Ready.
    assert cluster.clock() - started >= cluster.start_s and record.downtime_s >= cluster.start_s
    assert not target.status().rescaling
    assert target.rescale(5) is None  # already there: nothing patched, no event
    assert len(cluster.events) == 1


def test_a_deployment_counts_pending_pods_in_its_scale_status_but_not_as_ready():
    cluster = _cluster("Deployment", 2)
    target = _target(cluster)
    cluster.custom.patch_namespaced_custom_object_scale(
        group="apps", version="v1", namespace="ml", plural="deployments", name="ranker", body={"spec": {"replicas": 4}}
    )
    scale = cluster.custom.get_namespaced_custom_object_scale(
        group="apps", version="v1", namespace="ml", plural="deployments", name="ranker"
    )
    assert scale["status"]["replicas"] == 4 and target.status().rescaling  # created, not yet Ready
    cluster.sleep(cluster.start_s)
    assert not target.status().rescaling


def test_a_retarget_from_another_process_patches_again_and_the_wait_follows():
    cluster = _cluster("Deployment", 4)
    target, sensors = _target(cluster), _target(cluster)  # the rescale run's launcher, and the sensor's
    assert sensors.supports_retarget and sensors.retarget(12) is False  # the workload runs at its spec
    target.sleeper = lambda s: (sensors.retarget(12, reason="burst"), cluster.sleep(s))
    record = target.rescale(8, reason="rise")
    assert record is not None and (record.from_workers, record.to_workers) == (4, 12)
    assert record.reason.startswith("rise; retarget") and cluster.workloads[("deployments", "ranker")]["status"] == {
        "replicas": 12,
        "readyReplicas": 12,
    }
    assert [e["message"] for e in cluster.events] == [
        "pipeline ranker: 4 -> 8 replicas: rise",
        "pipeline ranker: 8 -> 12 replicas: burst",
    ]
    assert sensors.retarget(16) is False  # the rescale has ended


def test_a_deployment_scales_to_zero_and_back():
    cluster = _cluster("Deployment", 2)
    target = _target(cluster)
    assert target.rescale(0, reason="idle").to_workers == 0
    assert target.status().workers == 0 and target.rescale(0) is None
    assert target.rescale(3, reason="activated").from_workers == 0 and target.status().workers == 3


def test_each_rescale_leaves_a_valid_event_on_the_workload():
    cluster = _cluster("Deployment", 3)
    _target(cluster).rescale(1, reason="hold at 1: keeping 1 costs least")
    (event,) = cluster.events
    kubernetes_validate.validate(event, K8S_VERSION, strict=True)
    assert event["reason"] == EVENT_REASON and event["involvedObject"]["kind"] == "Deployment"
    assert event["message"] == "pipeline ranker: 3 -> 1 replicas: hold at 1: keeping 1 costs least"


def _hpa(name: str, kind: str, target: str):
    return SimpleNamespace(
        metadata=SimpleNamespace(name=name),
        spec=SimpleNamespace(scale_target_ref=SimpleNamespace(kind=kind, name=target)),
    )


def test_a_target_an_hpa_already_scales_is_refused_naming_it():
    cluster = _cluster("Deployment", 2)
    cluster.hpas = [_hpa("keda-hpa-ranker", "Deployment", "ranker"), _hpa("other", "Deployment", "x")]
    with pytest.raises(RuntimeError, match="HorizontalPodAutoscaler 'keda-hpa-ranker'"):
        _target(cluster).rescale(4)
    assert "patch_namespaced_custom_object_scale" not in cluster.calls and not cluster.events
    cluster.hpas = [_hpa("other", "Deployment", "x")]  # an HPA of another workload is no conflict
    assert _target(cluster).rescale(4) is not None


@pytest.mark.parametrize("config", KINDS[:2], ids=lambda c: c["workload_kind"])
def test_short_of_gpus_the_largest_size_that_runs_is_kept_and_recorded_as_a_ceiling(config):
    """Two 8-GPU nodes and 16 asked for while another team holds 6: 10 fit, 10 are kept, the ceiling is 10."""
    cluster = _cluster(config["workload_kind"], 4)
    cluster._add_pod("other-team-0", _gpu_template(6), None, None, {"team": "other"})
    cluster.sleep(30)
    target = _target(cluster, capacity_hold_s=600, **config)
    record = target.rescale(16, reason="burst")
    assert (record.from_workers, record.to_workers) == (4, 10)
    assert "asked for 16 workers, the cluster placed 10 within 60 s (" in record.reason
    assert "pods unplaced: FailedScheduling: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu.)" in record.reason
    status = target.status()
    assert (status.workers, status.capacity, status.rescaling) == (10, 10, False)
    kale_events = [e["message"].split(":")[1].strip() for e in cluster.events if e["reason"] == EVENT_REASON]
    assert kale_events == ["4 -> 16 replicas", "16 -> 10 replicas"]
    cluster.core.delete_namespaced_pod("other-team-0", "ml")
    cluster.sleep(31)
    assert target.status().capacity is None  # a pod freed up: the ceiling lifts


def _gpu_template(gpus: int) -> dict:
    return {"spec": {"containers": [{"name": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def test_workers_that_never_become_ready_fail_the_rescale():
    cluster = _cluster("Deployment", 2)
    cluster.start_s = 10**9  # bound, but the container never passes readiness
    with pytest.raises(RescaleFailed, match=r"did not have 6 workers ready within 120 s \(2 ready, its scale status"):
        _target(cluster, ready_timeout_s=120).rescale(6)


@pytest.mark.parametrize(
    "kwargs, says",
    [
        (dict(workload_kind="Deployment", name="ranker"), None),
        (dict(workload_kind="PyTorchJob", name="ranker", api_version="kubeflow.org/v1"), "plural: a PyTorchJob"),
        (dict(workload_kind="deployment", name="ranker"), "workload_kind: 'deployment' must match"),
        (dict(workload_kind="Deployment", name="Ranker_1"), "name: 'Ranker_1' must match"),
        (dict(workload_kind="Deployment", name="ranker", namespace="ML"), "namespace: 'ML' must match"),
        (dict(workload_kind="Deployment", name="ranker", ready_timeout_s=0), "ready_timeout_s"),
        (dict(workload_kind="Deployment", name="ranker", capacity_timeout_s=0), "capacity_timeout_s"),
    ],
)
def test_declarations(kwargs, says):
    if says is None:
        ScaleTargetLauncherConfig(**kwargs)
        return
    with pytest.raises(KaleConfigError, match=says):
        ScaleTargetLauncherConfig(**kwargs)


@pytest.mark.integration
def test_the_rescale_job_sizes_the_workload_through_the_fake_api():
    """The pipeline's rescale job builds the launcher from the declaration; the kubernetes client is replaced
    where it is constructed, as dagster-k8s's tests do."""
    from dagster import AssetKey, AssetMaterialization, instance_for_test

    from kale_dagster import build_definitions

    cluster = _cluster("Deployment", 2)
    cluster.start_s = 0  # the launcher's own clock runs here: pods are Ready once bound
    p = OnlineTrainingPipeline(
        name="ranker",
        source=KafkaSource("127.0.0.1:9092", ("clicks",), "ranker"),
        launcher=ScaleTargetLauncherConfig(workload_kind="Deployment", name="ranker", namespace="ml"),
        advisory=False,
    )
    defs = build_definitions(p)
    key = AssetKey(["ranker", "gpu_allocation"])
    with (
        mock.patch("kubernetes.config.load_incluster_config"),
        mock.patch("kubernetes.client.CustomObjectsApi", return_value=cluster.custom),
        mock.patch("kubernetes.client.AutoscalingV2Api", return_value=cluster.autoscaling),
        mock.patch("kubernetes.client.CoreV1Api", return_value=cluster.core),
        instance_for_test() as instance,
    ):
        instance.report_runless_asset_event(AssetMaterialization(key, metadata={"workers": 4, "reason": "rise"}))
        assert defs.resolve_job_def("ranker_rescale").execute_in_process(instance=instance).success
        obs = instance.fetch_observations(key, limit=1).records[0].asset_observation
        assert obs.metadata["from_workers"].value == 2 and obs.metadata["workers"].value == 4
    assert cluster.workloads[("deployments", "ranker")]["status"]["readyReplicas"] == 4 and len(cluster.events) == 1


def test_the_documented_role_grants_exactly_what_the_launcher_calls():
    """Every path (a rescale, one short of capacity with its ceiling recorded, the status read) runs under the
    documented Role, which refuses anything it does not grant, names the workload where Kubernetes allows, and
    grants nothing those paths do not call."""
    cluster = _cluster("Deployment", 2)
    cluster.rules = shipped_role("rbac-scale-target.yaml")
    target = _target(cluster)
    target.rescale(3)
    cluster._add_pod("other-team-0", _gpu_template(8), None, None, {"team": "other"})
    assert target.rescale(12).to_workers == 8  # 5 more fit: a shortfall, its ceiling annotated on the Deployment
    _ = target.status()
    granted = {
        (g, r, v) for rule in cluster.rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    assert cluster.used == granted, (cluster.used - granted, granted - cluster.used)
    other = _cluster("Deployment", 2)
    other.add_workload("Deployment", "someone-elses", 1)
    other.rules = cluster.rules
    with pytest.raises(Exception, match="403"):  # the Role names the workload: another one is out of reach
        _target(other, name="someone-elses").rescale(2)


CRD = yaml.safe_load((ROOT / "tests" / "fixtures" / "kubeflow.org_pytorchjobs.yaml").read_text())


def _pytorchjob(replicas: int, low: int, high: int, **spec) -> FakeKubernetes:
    """An elastic PyTorchJob whose scale subresource reads and writes the paths the published CRD declares, every
    object a patch leaves validated against the CRD's schema."""
    scale = CRD["spec"]["versions"][0]["subresources"]["scale"]
    assert scale["specReplicasPath"] == ".spec.pytorchReplicaSpecs.Worker.replicas"
    assert scale["statusReplicasPath"] == ".status.replicaStatuses.Worker.active"
    elastic = {"minReplicas": low, "maxReplicas": high, "rdzvBackend": "c10d"}
    cluster = _cluster("PyTorchJob", replicas, elasticPolicy=elastic, **spec)
    patch = cluster._patch_scale

    def validated(body, **path):
        answer = patch(body, **path)
        job = cluster.workloads[("pytorchjobs", "ranker")]
        jsonschema.validate(
            {k: v for k, v in job.items() if k != "status"}, CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        )  # what the API server would check against the CRD
        return answer

    cluster._patch_scale = validated
    cluster.custom._methods["patch_namespaced_custom_object_scale"] = validated
    return cluster


def test_an_elastic_pytorchjob_is_sized_within_its_elastic_policy():
    cluster = _pytorchjob(replicas=2, low=1, high=4)
    target = _target(cluster, **PYTORCHJOB)
    assert target.rescale(4) is not None
    assert cluster.workloads[("pytorchjobs", "ranker")]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 4
    with pytest.raises(RuntimeError, match="elasticPolicy allows 1 to 4 replicas, not 6: align the pipeline's limits"):
        target.rescale(6)
    assert len(cluster.events) == 1  # nothing patched past the policy


def test_a_pytorchjob_of_eight_processes_per_pod_is_sized_in_pods_and_a_mismatch_is_refused():
    cluster = _pytorchjob(replicas=1, low=1, high=4, nprocPerNode="8")
    target = _target(cluster, workers_per_pod=8, **PYTORCHJOB)
    assert target.status().workers == 8
    assert target.rescale(16) is not None
    assert cluster.workloads[("pytorchjobs", "ranker")]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    with pytest.raises(
        RuntimeError,
        match="runs 8 processes per pod .nprocPerNode. but the pipeline plans pods of 4 "
        "workers: set the limits' workers_per_pod to 8",
    ):
        _target(cluster, workers_per_pod=4, **PYTORCHJOB).rescale(12)
    assert len(cluster.events) == 1  # nothing patched


def _error(status: int, reason: str):
    from kubernetes.client.rest import ApiException

    return ApiException(status=status, reason=reason)


@pytest.mark.parametrize(
    "method, status, reason, says",
    [
        (
            "get_namespaced_custom_object_scale",
            403,
            "Forbidden",
            "grant the verbs of docs/kubernetes/rbac-scale-target",
        ),
        ("get_namespaced_custom_object_scale", 404, "Not Found", "no Deployment 'ranker' in namespace 'ml'"),
        ("patch_namespaced_custom_object_scale", 409, "Conflict", "the workload changed while Kale sized it"),
        ("patch_namespaced_custom_object_scale", 422, "Unprocessable Entity", "the API server refused the size"),
        ("patch_namespaced_custom_object_scale", 503, "Service Unavailable", "the next decision tries again"),
    ],
)
def test_api_errors_are_one_line_naming_the_workload_and_the_fix(method, status, reason, says):
    cluster = _cluster("Deployment", 2)
    cluster.failures[method] = [_error(status, reason)]
    with pytest.raises(RuntimeError) as failed:
        _target(cluster).rescale(4)
    message = str(failed.value)
    assert message.startswith(f"Deployment ml/ranker (API error {status} {reason}): ") and says in message
    assert "\n" not in message and cluster.workloads[("deployments", "ranker")]["spec"]["replicas"] == 2


def test_an_event_refused_after_the_patch_does_not_undo_the_rescale():
    cluster = _cluster("Deployment", 2)
    cluster.failures["create_namespaced_event"] = [_error(403, "Forbidden")]
    record = _target(cluster).rescale(4, reason="rise")
    assert record.to_workers == 4 and cluster.workloads[("deployments", "ranker")]["status"]["readyReplicas"] == 4
    assert record.reason == "rise; its Event was refused (API error 403 Forbidden): grant create on events"
