"""Kubernetes launcher: manifests validated offline against the official schema, API mocked at the client boundary.

As in dagster-k8s's own unit tests, the kubernetes client's BatchV1Api and
CoreV1Api are MagicMocks behind a real DagsterKubernetesClient; no API
server runs here.
"""

from __future__ import annotations

import json
import re
from unittest import mock

import kubernetes_validate
import pytest
from dagster_k8s.client import DagsterKubernetesClient
from kubernetes.client import (
    V1ContainerState,
    V1ContainerStateWaiting,
    V1ContainerStatus,
    V1Job,
    V1JobSpec,
    V1ObjectMeta,
    V1PersistentVolumeClaim,
    V1PersistentVolumeClaimSpec,
    V1Pod,
    V1PodCondition,
    V1PodList,
    V1PodStatus,
)
from kubernetes.client.rest import ApiException

from kale_dagster import KafkaSource, KaleConfigError
from kale_dagster.launchers import RescaleFailed
from kale_dagster.launchers.kubernetes import KubernetesLauncher, KubernetesLauncherConfig, render
from kale_dagster.launchers.pods import pods_state
from kale_dagster.model.limits import Limits

K8S_VERSION = kubernetes_validate.utils.latest_version()
SOURCE = KafkaSource(
    "kafka-0.kafka:9093",
    ("clicks",),
    "ctr",
    security_protocol="SASL_SSL",
    sasl_mechanism="SCRAM-SHA-512",
    sasl_username="kale",
    sasl_password_env="KAFKA_PASSWORD",
)


def _config(**kw):
    base = dict(
        image="registry.example.com/ctr-trainer:1.4",
        checkpoint_pvc="ctr-checkpoints",
        kafka_secret="ctr-kafka-credentials",
    )
    base.update(kw)
    return KubernetesLauncherConfig(**base)


CONFIGS = [
    _config(),
    _config(
        namespace="ml",
        gpus_per_worker=2,
        node_selector={"nvidia.com/gpu.product": "NVIDIA-A10"},
        tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
        image_pull_secrets=("regcred",),
        service_account="kale-trainer",
        image_pull_policy="Always",
    ),
    _config(checkpoint_pvc="shared-ckpt", kafka_secret=None, gpus_per_worker=0, trainer_args=("--batch-size", "512")),
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("workers", [1, 4, 32])
def test_manifests_validate_against_the_kubernetes_schema(config, workers):
    manifests = render("ctr", config, SOURCE, workers)
    assert [m["kind"] for m in manifests] == ["Service", "Job"]
    for manifest in manifests:
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    job = manifests[1]
    spec = job["spec"]
    assert spec["parallelism"] == spec["completions"] == workers and spec["completionMode"] == "Indexed"
    container = spec["template"]["spec"]["containers"][0]
    assert container["command"] == ["torchrun"] and f"--nnodes={workers}" in container["args"]
    args = container["args"]
    assert (
        args[args.index("--bootstrap-servers") + 1] == SOURCE.bootstrap_servers
        and args[args.index("--topics") + 1] == "clicks"
    )
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (
        env["KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
        and env["KAFKA_SASL_USERNAME"] == "kale"
        and "KAFKA_SASL_PASSWORD" not in env
    )
    if config.gpus_per_worker:
        assert container["resources"]["limits"]["nvidia.com/gpu"] == str(config.gpus_per_worker)
    assert spec["template"]["spec"]["subdomain"] == manifests[0]["metadata"]["name"]
    assert manifests[0]["spec"]["clusterIP"] == "None"


def test_the_streams_tls_files_come_from_a_secret_mounted_read_only_by_file_name():
    from dataclasses import replace

    source = replace(
        SOURCE,
        security_protocol="SSL",
        ssl_cafile="/home/me/certs/ca.pem",
        ssl_certfile="/home/me/certs/client.pem",
        ssl_keyfile="/home/me/certs/client.key",
        ssl_password_env="KEY_PASSPHRASE",
    )
    service, job = render("ctr", _config(kafka_tls_secret="ctr-kafka-tls"), source, 4)
    for manifest in (service, job):
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["KAFKA_SSL_CAFILE"], env["KAFKA_SSL_CERTFILE"], env["KAFKA_SSL_KEYFILE"]) == (
        "/etc/kale/kafka-tls/ca.pem",
        "/etc/kale/kafka-tls/client.pem",
        "/etc/kale/kafka-tls/client.key",
    )
    assert "KAFKA_SSL_PASSWORD" not in env  # the passphrase comes with kafka_secret's keys, never the manifest
    assert {"name": "kafka-tls", "mountPath": "/etc/kale/kafka-tls", "readOnly": True} in container["volumeMounts"]
    assert {"name": "kafka-tls", "secret": {"secretName": "ctr-kafka-tls", "defaultMode": 0o400}} in pod["volumes"]
    # Without the Secret, the paths are the image's own.
    (_, plain) = render("ctr", _config(), source, 4)
    plain_env = {e["name"]: e.get("value") for e in plain["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert plain_env["KAFKA_SSL_CAFILE"] == "/home/me/certs/ca.pem"
    # Two files of one name cannot share the Secret: refused when the pipeline loads, naming the field.
    from kale_dagster import OnlineTrainingPipeline

    clash = replace(source, ssl_cafile="/etc/ca/client.pem")
    with pytest.raises(KaleConfigError, match="kafka_tls_secret: the source's TLS files share a file name"):
        OnlineTrainingPipeline(name="ctr", source=clash, launcher=_config(kafka_tls_secret="ctr-kafka-tls"))


def test_checkpoints_in_a_bucket_need_no_volume_and_their_keys_come_from_a_secret():
    config = _config(checkpoint_pvc=None, checkpoint_url="s3://ml-checkpoints/ctr", storage_secret="ctr-s3")
    service, job = render("ctr", config, SOURCE, 4)
    for manifest in (service, job):
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = container["args"]
    assert args[args.index("--checkpoint-dir") + 1] == "s3://ml-checkpoints/ctr"
    assert not pod.get("volumes") and not container.get("volumeMounts")
    assert {"secretRef": {"name": "ctr-s3"}} in container["envFrom"]
    assert {"secretRef": {"name": "ctr-kafka-credentials"}} in container["envFrom"]
    with_volume = render("ctr", _config(), SOURCE, 4)[1]["spec"]["template"]["spec"]
    assert with_volume["volumes"] == [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ctr-checkpoints"}}
    ]
    args = with_volume["containers"][0]["args"]
    assert args[args.index("--checkpoint-dir") + 1] == "/checkpoints"


@pytest.mark.parametrize(
    "places, message",
    [
        ({"checkpoint_pvc": None}, "checkpoint_pvc: give one place for the checkpoints"),
        ({"checkpoint_url": "s3://b/p"}, "checkpoint_pvc: give one place for the checkpoints"),
        (
            {"checkpoint_pvc": None, "checkpoint_url": "/mnt/ckpt"},
            "checkpoint_url: '/mnt/ckpt' must be an object-store URL",
        ),
        ({"checkpoint_pvc": None, "checkpoint_url": "hdfs://nn/ckpt"}, "checkpoint_url: 'hdfs://nn/ckpt' must be an"),
    ],
)
def test_the_checkpoints_have_exactly_one_place(places, message):
    with pytest.raises(KaleConfigError, match=re.escape(message)):
        _config(**places)


def test_credentials_are_referenced_never_inlined(monkeypatch):
    monkeypatch.setenv("KAFKA_PASSWORD", "hunter2-secret-value")
    text = json.dumps(render("ctr", _config(), SOURCE, 2))
    assert "hunter2" not in text
    assert '"secretRef": {"name": "ctr-kafka-credentials"}' in text
    with pytest.raises(KaleConfigError, match="trainer_args"):
        _config(trainer_args=("--sasl-password", "x"))


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(image=""), "image"),
        (dict(checkpoint_pvc=""), "checkpoint_pvc"),
        (dict(image_pull_policy="Sometimes"), "image_pull_policy"),
        (dict(termination_grace_period_s=1), "termination_grace_period_s"),
    ],
)
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(KaleConfigError) as err:
        _config(**kwargs)
    assert err.value.field == field


# --- a fake cluster behind mocked API objects ------------------------------------------------


def _pod(name, ready=True, waiting=None, phase="Running"):
    statuses = [
        V1ContainerStatus(
            name="dagster",
            image="x",
            image_id="",
            ready=ready,
            restart_count=0,
            state=V1ContainerState(
                waiting=V1ContainerStateWaiting(reason=waiting, message="back-off") if waiting else None
            ),
        )
    ]
    conditions = [V1PodCondition(type="Ready", status="True" if ready else "False")]
    return V1Pod(
        metadata=V1ObjectMeta(name=name),
        status=V1PodStatus(phase=phase, conditions=conditions, container_statuses=statuses),
    )


class FakeCluster:
    """Jobs and their pods; what create/delete/list calls on the mocked APIs see."""

    def __init__(self, fail_create=None, pod_problem=None):
        self.jobs: dict[str, V1Job] = {}
        self.fail_create = fail_create or {}  # workers -> ApiException
        self.pod_problem = pod_problem or {}  # workers -> waiting reason, or "never-ready"
        self.batch = mock.MagicMock()
        self.core = mock.MagicMock()
        self.batch.create_namespaced_job.side_effect = self._create
        self.batch.list_namespaced_job.side_effect = lambda *a, **kw: mock.Mock(items=list(self.jobs.values()))
        self.batch.delete_namespaced_job.side_effect = self._delete
        self.batch.patch_namespaced_job.side_effect = self._patch
        self.core.list_namespaced_pod.side_effect = self._pods
        self.core.read_namespaced_service.side_effect = ApiException(status=404)
        self.core.read_namespaced_pod_log.side_effect = self._log
        self.access_modes = ["ReadWriteMany"]
        self.core.read_namespaced_persistent_volume_claim.side_effect = lambda *a, **kw: V1PersistentVolumeClaim(
            spec=V1PersistentVolumeClaimSpec(access_modes=self.access_modes)
        )
        self.created = []
        self.silent = set()  # worker counts whose pods never log a training step
        self.failed_jobs = set()  # jobs whose first pod has failed since (OOM, node lost, preemption)

    def _create(self, namespace=None, body=None):
        workers = body["spec"]["parallelism"]
        if workers in self.fail_create:
            raise self.fail_create[workers]
        name = body["metadata"]["name"]
        self.created.append(workers)
        self.jobs[name] = V1Job(
            metadata=V1ObjectMeta(
                name=name,
                labels=body["metadata"]["labels"],
                annotations=dict(body["metadata"].get("annotations") or {}),
                creation_timestamp=len(self.created),
            ),
            spec=V1JobSpec(parallelism=workers, template=mock.Mock()),
        )

    def _patch(self, name=None, namespace=None, body=None, **kwargs):
        if name not in self.jobs:
            raise ApiException(status=404)
        meta = self.jobs[name].metadata
        merged = {**(meta.annotations or {}), **body["metadata"]["annotations"]}
        meta.annotations = {k: v for k, v in merged.items() if v is not None}  # a merge patch's null removes

    def _delete(self, name=None, namespace=None, **kwargs):
        if name not in self.jobs:
            raise ApiException(status=404)
        del self.jobs[name]
        self.failed_jobs.discard(name)  # a job created again under this name is a new one

    def _log(self, name=None, namespace=None, **kwargs):
        workers = int(name.split("-w")[-1].split("-")[0])
        lines = ['{"event": "ready", "pid": 7}', '[rank0]:{"event": "started", "rank": 0}']
        if workers not in self.silent:
            lines.append('[rank0]:{"event": "step", "rank": 0, "step": 1, "first": true}')
        return mock.Mock(data="\n".join(lines).encode())

    def _pods(self, namespace=None, label_selector=""):
        name = label_selector.split("job-name=")[-1]
        job = self.jobs.get(name)
        if job is None:
            return V1PodList(items=[])
        problem = self.pod_problem.get(job.spec.parallelism)
        return V1PodList(
            items=[
                _pod(
                    f"{name}-{i}",
                    ready=problem is None,
                    waiting=problem if problem not in (None, "never-ready") else None,
                    phase="Failed" if i == 0 and name in self.failed_jobs else "Running",
                )
                for i in range(job.spec.parallelism)
            ]
        )


def _launcher(cluster, workers_per_pod=1):
    client = DagsterKubernetesClient(
        batch_api=cluster.batch, core_api=cluster.core, logger=lambda *_: None, sleeper=lambda *_: None, timer=lambda: 0
    )
    clock = iter(range(0, 10_000, 5))
    return KubernetesLauncher(
        "ctr",
        _config(ready_timeout_s=60, stop_timeout_s=60),
        SOURCE,
        workers_per_pod=workers_per_pod,
        client=client,
        sleeper=lambda *_: None,
        clock=lambda: next(clock),
    )


def test_rescale_replaces_the_job_and_is_idempotent():
    cluster = FakeCluster()
    launcher = _launcher(cluster)
    assert launcher.start(2).to_workers == 2
    record = launcher.rescale(4)
    assert (record.from_workers, record.to_workers) == (2, 4)
    assert cluster.created == [2, 4] and len(cluster.jobs) == 1
    assert launcher.rescale(4) is None  # same target twice: nothing happens
    assert cluster.created == [2, 4]
    cluster.core.create_namespaced_service.assert_called()
    launcher.stop()
    assert cluster.jobs == {}


def test_workers_in_pods_of_eight_rescale_by_whole_pods():
    cluster = FakeCluster()
    launcher = _launcher(cluster, workers_per_pod=8)
    assert launcher.start(8).to_workers == 8 and launcher.workers == 8
    record = launcher.rescale(16)
    assert (record.from_workers, record.to_workers) == (8, 16)
    assert cluster.created == [1, 2] and launcher.workers == 16  # pods created; workers read from the Job
    assert launcher.rescale(16) is None


def test_scale_to_zero_deletes_the_job_and_the_next_rescale_starts_one():
    cluster = FakeCluster()
    launcher = _launcher(cluster)
    launcher.start(2)
    record = launcher.rescale(0, "idle")
    assert (record.from_workers, record.to_workers) == (2, 0) and cluster.jobs == {}
    assert launcher.workers == 0 and launcher.rescale(0) is None  # already at zero
    assert launcher.rescale(3).from_workers == 0 and cluster.created == [2, 3] and len(cluster.jobs) == 1
    assert launcher.status().downtimes_s == ()  # neither a stop to nothing nor a start from it is a restart


def test_downtime_ends_at_the_first_training_step_in_the_pod_logs():
    """Ready pods are not yet training: the downtime runs on until every pod logged its first step."""
    cluster = FakeCluster()
    launcher = _launcher(cluster)
    record = launcher.start(3)
    assert set(record.phases) == {"stop", "pods_ready", "first_step"}
    assert record.downtime_s >= sum(record.phases.values()) > 0 and record.phases["first_step"] > 0
    assert cluster.core.read_namespaced_pod_log.call_count == 3  # one read per pod, each already stepped
    cluster.silent.add(5)
    with pytest.raises(RescaleFailed, match="5 pods of job .* ready but no training step after 60 s") as err:
        launcher.rescale(5)
    assert err.value.restored == 3


def test_a_retarget_deletes_the_forming_job_at_once_and_creates_the_larger_one():
    cluster = FakeCluster(pod_problem={4: "never-ready"})  # the Job of 4 is still forming when the burst comes
    launcher = _launcher(cluster)
    launcher.start(8)
    launcher.sleeper = lambda *_: launcher.retarget(19, reason="burst")
    record = launcher.rescale(4, reason="scale in")
    assert (record.from_workers, record.to_workers) == (8, 19) and "retargeted to 19" in record.reason
    assert cluster.created == [8, 4, 19] and [j.spec.parallelism for j in cluster.jobs.values()] == [19]
    assert record.phases["abandoned"] > 0
    # Its pods had trained nothing: deleted without a grace period, where a stop would wait out their restore.
    deleted = {
        (call.args[0] if call.args else call.kwargs["name"]): call.kwargs.get("grace_period_seconds")
        for call in cluster.core.delete_namespaced_pod.call_args_list
    }
    forming = {pod: grace for pod, grace in deleted.items() if "-w4-" in pod}
    assert len(forming) == 4 and set(forming.values()) == {0}, deleted


def test_a_retarget_from_the_sensors_process_reaches_the_restart_through_the_forming_jobs_annotation():
    cluster = FakeCluster(pod_problem={4: "never-ready"})
    launcher, sensors = _launcher(cluster), _launcher(cluster)  # the rescale run's launcher, and the sensor's
    launcher.start(8)
    assert sensors.retarget(19) is False  # the Job of 8 has formed: no restart to redirect
    answers = []
    launcher.sleeper = lambda *_: answers.append(sensors.retarget(19, reason="burst"))
    record = launcher.rescale(4, reason="scale in")
    assert (record.from_workers, record.to_workers) == (8, 19) and record.reason.endswith(
        "retargeted to 19 after 40.0 s: burst"
    )
    assert answers[0] is True and cluster.created == [8, 4, 19]
    assert sensors.retarget(19) is False  # the Job of 19 runs


def test_a_failed_start_after_a_retarget_restores_the_group_that_ran():
    cluster = FakeCluster(pod_problem={4: "never-ready", 19: "ImagePullBackOff"})
    launcher = _launcher(cluster)
    launcher.start(8)
    launcher.sleeper = lambda *_: launcher.retarget(19, reason="burst")
    with pytest.raises(RescaleFailed, match="ImagePullBackOff") as err:
        launcher.rescale(4)
    assert err.value.restored == 8 and [j.spec.parallelism for j in cluster.jobs.values()] == [8]


@pytest.mark.parametrize("status", [403, 409, 422, 500, 503])
def test_api_errors_restore_the_previous_size(status):
    cluster = FakeCluster(fail_create={8: ApiException(status=status, reason="nope")})
    launcher = _launcher(cluster)
    launcher.start(3)
    with pytest.raises(RescaleFailed, match=f"API error {status}") as err:
        launcher.rescale(8)
    assert err.value.restored == 3
    assert [j.spec.parallelism for j in cluster.jobs.values()] == [3]


@pytest.mark.parametrize(
    "problem, message",
    [
        ("ImagePullBackOff", "ImagePullBackOff"),
        ("ErrImagePull", "ErrImagePull"),
        ("never-ready", "0/6 pods ready after 60 s"),
    ],
)
def test_pods_that_cannot_start_restore_the_previous_size(problem, message):
    cluster = FakeCluster(pod_problem={6: problem})
    launcher = _launcher(cluster)
    launcher.start(2)
    with pytest.raises(RescaleFailed, match=message) as err:
        launcher.rescale(6)
    assert err.value.restored == 2
    assert [j.spec.parallelism for j in cluster.jobs.values()] == [2]


def test_pods_state():
    assert pods_state([]) == ("pending", "no pods yet")
    assert pods_state([_pod("a"), _pod("b")])[0] == "ready"
    assert pods_state([_pod("a"), _pod("b", ready=False)]) == ("pending", "1/2 pods ready")
    assert pods_state([_pod("a", phase="Failed")])[0] == "failed"


@pytest.mark.integration
def test_rescale_job_applies_the_allocation_once(monkeypatch, tmp_path):
    """The Dagster rescale job against the mocked cluster: applies gpu_allocation, records downtime, idempotent."""
    from dagster import AssetKey, AssetMaterialization, instance_for_test

    from kale_dagster import OnlineTrainingPipeline, build_definitions

    p = OnlineTrainingPipeline(
        name="ctr",
        source=KafkaSource("127.0.0.1:9092", ("clicks",), "ctr"),
        limits=Limits(max_workers=8),
        history_url=f"sqlite:///{tmp_path / 'm.db'}",
        launcher=_config(),
        advisory=False,
    )
    cluster = FakeCluster()
    launcher = _launcher(cluster)
    launcher.start(2)
    # The job builds its launcher from the declaration; this one talks to the mocked cluster.
    monkeypatch.setattr(KubernetesLauncherConfig, "build", lambda self, pipeline, source, trainer, **kw: launcher)
    defs = build_definitions(p)
    repo = defs.get_repository_def()
    assert {"ctr_rescale"} <= {j.name for j in repo.get_all_jobs()}
    assert "ctr_stream_metrics" in {s.name for s in repo.sensor_defs}
    with instance_for_test() as instance:
        instance.report_runless_asset_event(
            AssetMaterialization(
                AssetKey(["ctr", "gpu_allocation"]), metadata={"workers": 5, "reason": "forecast peak"}
            )
        )
        job = defs.resolve_job_def("ctr_rescale")
        assert job.execute_in_process(instance=instance).success
        assert [j.spec.parallelism for j in cluster.jobs.values()] == [5]
        observations = instance.fetch_observations(AssetKey(["ctr", "gpu_allocation"]), limit=5).records
        meta = observations[0].asset_observation.metadata
        assert meta["changed"].value is True and meta["from_workers"].value == 2 and "downtime_s" in meta
        assert job.execute_in_process(instance=instance).success  # same target again: no restart
        assert cluster.created == [2, 5]


def test_advisory_pipelines_have_no_rescale_job(tmp_path):
    from kale_dagster import OnlineTrainingPipeline, build_definitions

    p = OnlineTrainingPipeline(
        name="ctr", source=KafkaSource("127.0.0.1:9092", ("clicks",), "ctr"), launcher=_config(), advisory=True
    )
    assert "ctr_rescale" not in {j.name for j in build_definitions(p).get_repository_def().get_all_jobs()}


def test_only_the_rescale_runs_get_the_rescale_service_account():
    """dagster-k8s's own reader of the per-job tag gives the rescale job's run pods the declared account; the other
    jobs' runs keep the chart's (the namespace default), which may not touch the workers."""
    from dagster_k8s.job import get_user_defined_k8s_config

    from kale_dagster import OnlineTrainingPipeline, build_definitions

    p = OnlineTrainingPipeline(
        name="ctr",
        source=KafkaSource("127.0.0.1:9092", ("clicks",), "ctr"),
        launcher=_config(rescale_service_account="kale-rescaler"),
        advisory=False,
    )
    jobs = {j.name: j for j in build_definitions(p).get_repository_def().get_all_jobs()}
    accounts = {
        name: get_user_defined_k8s_config(job.tags).pod_spec_config.get("service_account_name")
        for name, job in jobs.items()
    }
    assert accounts.pop("ctr_rescale") == "kale-rescaler"
    assert accounts and set(accounts.values()) == {None}, accounts


def test_cli_render_prints_valid_manifests():
    import subprocess
    import sys

    import yaml

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kale_dagster.cli",
            "k8s",
            "render",
            "--pipeline",
            "ctr_production",
            "--workers",
            "16",
            "--validate",
            K8S_VERSION,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    docs = list(yaml.safe_load_all(proc.stdout))
    assert [d["kind"] for d in docs] == ["Service", "Job"]
    # The example's 8-GPU nodes: 16 workers are two pods of eight processes, each pod asking for eight GPUs.
    job = docs[1]
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 2
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert {"--nnodes=2", "--nproc-per-node=8"} <= set(container["args"])
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert job["metadata"]["labels"]["kale.dev/workers"] == "16"
    assert "&id" not in proc.stdout  # plain YAML, no anchors, for GitOps diffs
    for argv, says in [
        (["--pipeline", "nope", "--workers", "3"], "no pipeline 'nope'"),
        (["--pipeline", "ctr_production", "--workers", "12"], "whole number (>= 1) of pods of 8 workers, got 12"),
    ]:
        bad = subprocess.run(
            [sys.executable, "-m", "kale_dagster.cli", "k8s", "render", *argv],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert bad.returncode == 2 and says in bad.stderr, bad.stderr


@pytest.mark.faults
def test_a_failed_pod_is_reported_and_the_same_size_restarts_the_group(fault_record):
    """A worker pod fails (OOM, node lost, preemption): backoffLimit 0 and torchrun's --max-restarts=0 leave the
    group down, so the launcher says so and a rescale to the same size restarts it (the controller asks for one)."""
    cluster = FakeCluster()
    launcher = _launcher(cluster)
    launcher.start(3)
    assert launcher.status().failed == ""
    assert launcher.rescale(3) is None  # healthy: nothing to do
    cluster.failed_jobs.add(launcher.current_job().metadata.name)
    status = launcher.status()
    assert status.workers == 3 and "failed" in status.failed and "-w3-" in status.failed
    record = launcher.rescale(3, reason="restart after failure")
    survived = (
        (record.from_workers, record.to_workers) == (3, 3)
        and cluster.created == [3, 3]
        and launcher.status().failed == ""
    )
    fault_record(
        fault="Kubernetes worker pod failed (Job failed; mocked API server)", injected=1, survived=int(survived)
    )
    assert (record.from_workers, record.to_workers) == (3, 3) and cluster.created == [3, 3]
    assert launcher.status().failed == ""


def test_worker_pods_mount_no_service_account_token():
    _, job = render("ctr", _config(service_account="trainer"), SOURCE, workers=2)
    assert job["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("modes", [["ReadWriteOnce"], ["ReadWriteOncePod"], []])
def test_a_checkpoint_claim_the_pods_cannot_share_is_refused_before_anything_stops(modes):
    cluster = FakeCluster()
    launcher = _launcher(cluster)
    cluster.access_modes = ["ReadWriteMany"]
    launcher.start(2)
    fresh = _launcher(cluster)  # another run process: checks the claim again
    cluster.access_modes = modes
    with pytest.raises(RescaleFailed, match="must be ReadWriteMany"):
        fresh.rescale(4)
    assert cluster.created == [2] and fresh.workers == 2  # the running group was left alone


@pytest.mark.parametrize(
    "path", ["docs/kubernetes/rbac.yaml", "docs/kubernetes/rbac-scale-target.yaml", "docs/kubernetes/metrics.yaml"]
)
def test_shipped_manifests_validate(path):
    import pathlib

    import yaml

    docs = list(yaml.safe_load_all((pathlib.Path(__file__).resolve().parents[1] / path).read_text()))
    assert docs
    for manifest in docs:
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_a_users_trainer_runs_in_the_users_image_through_the_harness(monkeypatch):
    """Declared on the pipeline, the trainer reaches the Job the launcher creates through the (mocked) API: the
    harness entrypoint with the user's factory and options, every body valid against the schema."""
    import sys
    from pathlib import Path

    from kale_dagster import OnlineTrainingPipeline

    sys.path.insert(0, str(Path(__file__).parent))
    p = OnlineTrainingPipeline(
        name="ctr",
        source=SOURCE,
        trainer="user_trainers:with_state",
        trainer_options={"lr": 0.01, "towers": [64, 32]},
        launcher=_config(image="registry.example.com/my-trainer:2.0"),
    )
    cluster = FakeCluster()
    bodies = []
    cluster.batch.create_namespaced_job.side_effect = lambda namespace=None, body=None: (
        bodies.append(body),
        cluster._create(namespace=namespace, body=body),
    )
    client = DagsterKubernetesClient(
        batch_api=cluster.batch, core_api=cluster.core, logger=lambda *_: None, sleeper=lambda *_: None, timer=lambda: 0
    )
    monkeypatch.setattr(DagsterKubernetesClient, "production_client", staticmethod(lambda: client))
    launcher = p.launcher.build(p.name, p.source, p.trainer_spec)
    assert isinstance(launcher, KubernetesLauncher)
    launcher.sleeper = lambda *_: None
    clock = iter(range(0, 10_000, 5))
    launcher._clock = lambda: next(clock)
    assert launcher.start(3).to_workers == 3
    (job,) = bodies
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    container = job["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert container["image"] == "registry.example.com/my-trainer:2.0"
    assert args[args.index("-m") + 1] == "kale_dagster.trainer.worker"
    assert args[args.index("--trainer") + 1] == "user_trainers:with_state"
    assert json.loads(args[args.index("--trainer-options") + 1]) == {"lr": 0.01, "towers": [64, 32]}
    assert args[args.index("--pipeline") + 1] == "ctr"
