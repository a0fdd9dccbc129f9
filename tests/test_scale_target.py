"""A workload sized through its scale subresource: the kubernetes client mocked at its boundary (no API server runs
here), every object Kale writes validated offline against the official schema."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import jsonschema
import kubernetes_validate
import pytest

from kale_dagster import KafkaSource, KaleConfigError, OnlineTrainingPipeline
from kale_dagster.launchers import RescaleFailed
from kale_dagster.launchers.scale_target import EVENT_REASON, ScaleTarget, ScaleTargetConfig

K8S_VERSION = kubernetes_validate.utils.latest_version()


class FakeCluster:
    """One workload's scale subresource, its controller (which reaches the patched size after ``lag_polls`` reads),
    the namespace's HorizontalPodAutoscalers, and the Events written."""

    def __init__(self, replicas: int, lag_polls: int = 2, hpas: tuple[tuple[str, str, str], ...] = ()):
        self.spec = self.status = replicas
        self.lag_polls, self._reads_since_patch = lag_polls, 0
        self.calls: list[tuple[str, dict]] = []
        self.events: list[dict] = []
        self.custom = mock.MagicMock()
        self.custom.get_namespaced_custom_object_scale.side_effect = self._get
        self.custom.patch_namespaced_custom_object_scale.side_effect = self._patch
        self.custom.get_namespaced_custom_object.return_value = {"spec": {}}  # a custom resource without elasticPolicy
        self.autoscaling = mock.MagicMock()
        self.autoscaling.list_namespaced_horizontal_pod_autoscaler.return_value = SimpleNamespace(
            items=[
                SimpleNamespace(
                    metadata=SimpleNamespace(name=name),
                    spec=SimpleNamespace(scale_target_ref=SimpleNamespace(kind=k, name=n)),
                )
                for name, k, n in hpas
            ]
        )
        self.core = mock.MagicMock()
        self.core.create_namespaced_event.side_effect = lambda namespace, body: self.events.append(body)

    def _get(self, **path):
        self.calls.append(("get", path))
        self._reads_since_patch += 1
        if self._reads_since_patch > self.lag_polls:
            self.status = self.spec
        return {"spec": {"replicas": self.spec}, "status": {"replicas": self.status, "selector": "app=trainer"}}

    def _patch(self, body, **path):
        self.calls.append(("patch", {**path, "body": body}))
        self.spec, self._reads_since_patch = body["spec"]["replicas"], 0
        return {"spec": {"replicas": self.spec}}


def _target(cluster: FakeCluster, workers_per_pod: int = 1, **config) -> ScaleTarget:
    config = {"workload_kind": "Deployment", "name": "ranker", "namespace": "ml", **config}
    return ScaleTarget(
        "ranker",
        ScaleTargetConfig(**config),
        workers_per_pod=workers_per_pod,
        custom_api=cluster.custom,
        autoscaling_api=cluster.autoscaling,
        core_api=cluster.core,
        sleeper=lambda s: None,
    )


@pytest.mark.parametrize(
    "config, path",
    [
        (dict(workload_kind="Deployment"), dict(group="apps", version="v1", plural="deployments")),
        (dict(workload_kind="StatefulSet"), dict(group="apps", version="v1", plural="statefulsets")),
        (
            dict(workload_kind="PyTorchJob", api_version="kubeflow.org/v1", plural="pytorchjobs"),
            dict(group="kubeflow.org", version="v1", plural="pytorchjobs"),
        ),
    ],
)
def test_a_rescale_patches_the_scale_subresource_and_waits_for_its_status(config, path):
    cluster = FakeCluster(replicas=2)
    target = _target(cluster, **config)
    assert target.status().workers == 2 and target.status().observed_from.startswith("the scale status")
    record = target.rescale(5, reason="forecast rise")
    assert record is not None and (record.from_workers, record.to_workers) == (2, 5)
    patches = [call for call in cluster.calls if call[0] == "patch"]
    assert patches == [("patch", {**path, "namespace": "ml", "name": "ranker", "body": {"spec": {"replicas": 5}}})]
    assert cluster.status == 5 and not target.status().rescaling
    assert target.rescale(5) is None  # already there: nothing patched, no event
    assert len([c for c in cluster.calls if c[0] == "patch"]) == 1


def test_a_retarget_from_another_process_patches_again_and_the_wait_follows():
    cluster = FakeCluster(replicas=8, lag_polls=3)
    target, sensors = _target(cluster), _target(cluster)  # the rescale run's launcher, and the sensor's
    assert sensors.supports_retarget and sensors.retarget(19) is False  # the workload runs at its spec
    target.sleeper = lambda s: sensors.retarget(19, reason="burst")
    record = target.rescale(4, reason="scale in")
    assert record is not None and (record.from_workers, record.to_workers) == (8, 19)
    assert [call[1]["body"]["spec"]["replicas"] for call in cluster.calls if call[0] == "patch"] == [4, 19]
    assert cluster.status == 19 and record.reason.startswith("scale in; retargeted to 19 after")
    assert [e["message"] for e in cluster.events] == [
        "pipeline ranker: 8 -> 4 replicas: scale in",
        "pipeline ranker: 4 -> 19 replicas: burst",
    ]
    assert sensors.retarget(32) is False  # the rescale has ended


def test_a_deployment_scales_to_zero_and_back():
    cluster = FakeCluster(replicas=2)
    target = _target(cluster)
    assert target.rescale(0, reason="idle").to_workers == 0 and cluster.status == 0
    assert target.status().workers == 0 and target.rescale(0) is None
    assert target.rescale(3, reason="activated").from_workers == 0 and cluster.status == 3


def test_each_rescale_leaves_a_valid_event_on_the_workload():
    cluster = FakeCluster(replicas=3)
    _target(cluster).rescale(1, reason="hold at 1: keeping 1 costs least")
    (event,) = cluster.events
    kubernetes_validate.validate(event, K8S_VERSION, strict=True)
    assert event["reason"] == EVENT_REASON and event["involvedObject"]["kind"] == "Deployment"
    assert event["message"] == "pipeline ranker: 3 -> 1 replicas: hold at 1: keeping 1 costs least"


def test_a_target_an_hpa_already_scales_is_refused_naming_it():
    cluster = FakeCluster(replicas=2, hpas=(("keda-hpa-ranker", "Deployment", "ranker"), ("other", "Deployment", "x")))
    with pytest.raises(RuntimeError, match="HorizontalPodAutoscaler 'keda-hpa-ranker'"):
        _target(cluster).rescale(4)
    assert not [c for c in cluster.calls if c[0] == "patch"] and not cluster.events
    # An HPA of another workload is no conflict.
    assert _target(FakeCluster(2, hpas=(("other", "Deployment", "x"),))).rescale(4) is not None


def test_a_workload_that_never_reaches_the_size_fails_the_rescale():
    cluster = FakeCluster(replicas=2, lag_polls=10**9)  # e.g. no node has a free GPU
    clock = iter(range(0, 10**6, 30))
    target = ScaleTarget(
        "ranker",
        ScaleTargetConfig(workload_kind="Deployment", name="ranker", ready_timeout_s=120),
        custom_api=cluster.custom,
        autoscaling_api=cluster.autoscaling,
        core_api=cluster.core,
        sleeper=lambda s: None,
        clock=lambda: float(next(clock)),
    )
    with pytest.raises(RescaleFailed, match="did not reach 6 replicas within 120 s"):
        target.rescale(6)


@pytest.mark.parametrize(
    "kwargs, says",
    [
        (dict(workload_kind="Deployment", name="ranker"), None),
        (dict(workload_kind="PyTorchJob", name="ranker", api_version="kubeflow.org/v1"), "plural: a PyTorchJob"),
        (dict(workload_kind="deployment", name="ranker"), "workload_kind: 'deployment' must match"),
        (dict(workload_kind="Deployment", name="Ranker_1"), "name: 'Ranker_1' must match"),
        (dict(workload_kind="Deployment", name="ranker", namespace="ML"), "namespace: 'ML' must match"),
        (dict(workload_kind="Deployment", name="ranker", ready_timeout_s=0), "ready_timeout_s"),
    ],
)
def test_declarations(kwargs, says):
    if says is None:
        ScaleTargetConfig(**kwargs)
        return
    with pytest.raises(KaleConfigError, match=says):
        ScaleTargetConfig(**kwargs)


@pytest.mark.integration
def test_the_rescale_job_sizes_the_workload_through_the_mocked_api():
    """The pipeline's rescale job builds the launcher from the declaration; the kubernetes client is mocked where
    it is constructed, as dagster-k8s's tests do."""
    from dagster import AssetKey, AssetMaterialization, instance_for_test

    from kale_dagster import build_definitions

    cluster = FakeCluster(replicas=2, lag_polls=0)
    p = OnlineTrainingPipeline(
        name="ranker",
        source=KafkaSource("127.0.0.1:9092", ("clicks",), "ranker"),
        launcher=ScaleTargetConfig(workload_kind="Deployment", name="ranker", namespace="ml"),
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
    assert cluster.spec == 4 and len(cluster.events) == 1


def test_the_documented_role_grants_exactly_what_the_launcher_calls():
    from pathlib import Path

    import yaml

    permissions = {
        "get_namespaced_custom_object_scale": ("apps", "deployments/scale", "get"),
        "patch_namespaced_custom_object_scale": ("apps", "deployments/scale", "patch"),
        "list_namespaced_horizontal_pod_autoscaler": ("autoscaling", "horizontalpodautoscalers", "list"),
        "create_namespaced_event": ("", "events", "create"),
    }
    cluster = FakeCluster(replicas=2)
    target = _target(cluster)
    target.rescale(3)
    _ = target.workers
    calls = cluster.custom.method_calls + cluster.autoscaling.method_calls + cluster.core.method_calls
    used = {permissions[call[0]] for call in calls}
    docs = yaml.safe_load_all(
        (Path(__file__).resolve().parents[1] / "docs/kubernetes/rbac-scale-target.yaml").read_text()
    )
    role = next(d for d in docs if d["kind"] == "Role")
    granted = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    assert used == granted


def yaml_load(name: str) -> dict:
    from pathlib import Path

    import yaml

    return yaml.safe_load((Path(__file__).parent / "fixtures" / name).read_text())


class FakePyTorchJob(FakeCluster):
    """An elastic PyTorchJob behind the same mocked client: its scale subresource reads and writes the paths
    the published CRD declares, and every object a patch leaves validates against the CRD's schema."""

    CRD = yaml_load("kubeflow.org_pytorchjobs.yaml")

    def __init__(self, replicas: int, low: int, high: int):
        super().__init__(replicas, lag_polls=0)
        self.obj = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "ranker", "namespace": "ml"},
            "spec": {
                "elasticPolicy": {"minReplicas": low, "maxReplicas": high, "rdzvBackend": "c10d"},
                "pytorchReplicaSpecs": {"Worker": {"replicas": replicas, "restartPolicy": "OnFailure", "template": {}}},
            },
        }
        self.custom.get_namespaced_custom_object.side_effect = lambda **path: self.obj
        scale = self.CRD["spec"]["versions"][0]["subresources"]["scale"]
        assert scale["specReplicasPath"] == ".spec.pytorchReplicaSpecs.Worker.replicas"

    def _patch(self, body, **path):
        answer = super()._patch(body, **path)
        self.obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = body["spec"]["replicas"]
        schema = self.CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        jsonschema.validate(self.obj, schema)  # what the API server would check against the CRD
        return answer


def test_an_elastic_pytorchjob_is_sized_within_its_elastic_policy():
    job = FakePyTorchJob(replicas=2, low=1, high=4)
    target = _target(job, workload_kind="PyTorchJob", api_version="kubeflow.org/v1", plural="pytorchjobs")
    assert target.rescale(4) is not None and job.obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 4
    with pytest.raises(RuntimeError, match="elasticPolicy allows 1 to 4 replicas, not 6: align the pipeline's limits"):
        target.rescale(6)
    assert job.spec == 4 and len(job.events) == 1  # nothing patched past the policy


def test_a_pytorchjob_of_eight_processes_per_pod_is_sized_in_pods_and_a_mismatch_is_refused():
    job = FakePyTorchJob(replicas=1, low=1, high=4)
    job.obj["spec"]["nprocPerNode"] = "8"
    kind = dict(workload_kind="PyTorchJob", api_version="kubeflow.org/v1", plural="pytorchjobs")
    target = _target(job, workers_per_pod=8, **kind)
    assert target.status().workers == 8
    assert target.rescale(24) is not None and job.obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    with pytest.raises(
        RuntimeError,
        match="runs 8 processes per pod .nprocPerNode. but the pipeline plans pods of 4 "
        "workers: set the limits' workers_per_pod to 8",
    ):
        _target(job, workers_per_pod=4, **kind).rescale(8)
    assert job.spec == 3  # nothing patched
