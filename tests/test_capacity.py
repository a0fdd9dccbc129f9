"""Rescales that know the cluster's capacity, against a fake cluster with upstream's semantics
(``tests/fake_kubernetes.py``): pods beyond the free GPUs stay Pending, Kueue holds a Job suspended, deletions take
their grace period, every call is checked against the shipped Role."""

from __future__ import annotations

import pytest
from dagster_k8s.client import DagsterKubernetesClient
from kubernetes.client.rest import ApiException

from fake_kubernetes import FakeKubernetes, shipped_role
from kale_dagster import KafkaSource
from kale_dagster.control.controller import ControlInput, Controller, ControlSettings, StreamReading
from kale_dagster.launchers import RescaleFailed
from kale_dagster.launchers.kubernetes import KubernetesLauncher, KubernetesLauncherConfig
from kale_dagster.model.limits import Limits
from kale_dagster.model.throughput import ThroughputModel

SOURCE = KafkaSource("kafka-0.kafka:9093", ("clicks",), "ctr")


def _launcher(cluster: FakeKubernetes, workers_per_pod: int = 1, **config) -> KubernetesLauncher:
    client = DagsterKubernetesClient(
        batch_api=cluster.batch,
        core_api=cluster.core,
        logger=lambda *_: None,
        sleeper=cluster.sleep,
        timer=cluster.clock,
    )
    declared = dict(
        image="registry.example.com/ctr:1.4",
        checkpoint_url="s3://ckpt/ctr",
        namespace="ml",
        gpus_per_worker=1,
        termination_grace_period_s=30,
        capacity_timeout_s=60,
        capacity_hold_s=600,
    )
    return KubernetesLauncher(
        "ctr_production",
        KubernetesLauncherConfig(**{**declared, **config}),
        SOURCE,
        workers_per_pod=workers_per_pod,
        client=client,
        sleeper=cluster.sleep,
        clock=cluster.clock,
        wall=cluster.clock,
        poll_s=5,
    )


def _another_team(cluster: FakeKubernetes, gpus: int) -> str:
    template = {"spec": {"containers": [{"name": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}
    cluster._add_pod("other-team-0", template, None, None, {"app": "other"})
    cluster.reconcile()
    return "other-team-0"


def test_ten_free_gpus_when_sixteen_are_asked_keeps_ten_and_caps_the_decisions_until_gpus_free_up():
    cluster = FakeKubernetes(node_gpus=(8, 8), rules=shipped_role("rbac.yaml"))
    other = _another_team(cluster, 6)
    launcher = _launcher(cluster)
    launcher.start(4)
    assert cluster.running_workers() == 4 and launcher.status().capacity is None

    record = launcher.rescale(16, reason="burst")
    assert (record.from_workers, record.to_workers) == (4, 10)
    assert (
        "asked for 16 workers, the cluster placed 10 within 60 s (6 of 16 pods unplaced: FailedScheduling: "
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.)" in record.reason
    )
    assert cluster.running_workers() == 10 and [e["reason"] for e in cluster.events].count("FailedScheduling") == 6
    status = launcher.status()
    assert (status.workers, status.capacity) == (10, 10) and "kept 10" in status.capacity_note

    # The planner treats it as a ceiling: the policy keeps wanting 16, the decision stays at 10, nothing is asked.
    controller = Controller(
        ControlSettings(policy="static", limits=Limits(max_workers=32), policy_options={"workers": 16})
    )
    reading = StreamReading(time=1.8e9, arrival_rate=1500.0, consumption_rate=1000.0, backlog=5e4, time_lag_s=60.0)
    model = ThroughputModel.linear(100.0)
    for _ in range(3):
        step = controller.step(ControlInput(reading, launcher.status(), model))
        assert (step.decision.workers, step.rescale_to) == (10, None)
        assert step.decision.reason.startswith("capped at 10, the cluster's capacity (asked for 16 workers")
        cluster.sleep(60)
    assert cluster.jobs and len(cluster.jobs) == 1  # no Job created since

    # Another team's pod ends: its GPUs are free, the ceiling lifts at once, and 16 are asked for again.
    cluster.core.delete_namespaced_pod(other, "ml")
    cluster.sleep(31)
    assert launcher.status().capacity is None
    step = controller.step(ControlInput(reading, launcher.status(), model))
    assert step.rescale_to == 16
    assert launcher.rescale(16).to_workers == 16 and cluster.running_workers() == 16


def test_the_ceiling_lapses_after_its_hold():
    cluster = FakeKubernetes(node_gpus=(8,))
    _another_team(cluster, 4)
    launcher = _launcher(cluster, capacity_hold_s=300)
    launcher.start(2)
    assert launcher.rescale(8).to_workers == 4
    cluster.sleep(250)
    assert launcher.status().capacity == 4
    cluster.sleep(60)
    assert launcher.status().capacity is None


def test_a_shortfall_never_keeps_less_than_ran_before():
    """Pods of 8: the second pod finds no node; the one pod that fits is what ran before, so 8 stay."""
    cluster = FakeKubernetes(node_gpus=(8, 8))
    _another_team(cluster, 2)
    launcher = _launcher(cluster, workers_per_pod=8)
    launcher.start(8)
    record = launcher.rescale(16)
    assert record.to_workers == 8 and launcher.status().capacity == 8
    assert cluster.running_workers(per_pod=8) == 8


def test_a_kueue_job_not_admitted_keeps_the_size_that_ran():
    cluster = FakeKubernetes(node_gpus=(8, 8))
    admit = cluster.reconcile

    def kueue():  # Kueue admits a Job by unsuspending it; this queue's quota admits 4 workers at most
        for queued in cluster.jobs.values():
            if queued["spec"].get("suspend") and int(queued["metadata"]["labels"]["kale.dev/workers"]) <= 4:
                queued["spec"]["suspend"] = False
        admit()

    cluster.reconcile = kueue
    launcher = _launcher(cluster, queue_name="gpu-team")
    launcher.start(2)
    job = next(iter(cluster.jobs.values()))
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-team"
    record = launcher.rescale(12)
    assert record.to_workers == 2 and "Kueue has not admitted it from queue 'gpu-team'" in record.reason
    assert launcher.status().capacity == 2 and cluster.running_workers() == 2
    assert all(j["spec"]["suspend"] is False for j in cluster.jobs.values())  # created suspended, then admitted


def test_old_pods_take_their_grace_period_before_the_new_job_starts():
    cluster = FakeKubernetes(node_gpus=(8,))
    launcher = _launcher(cluster)
    launcher.start(2)
    before = cluster.clock()
    record = launcher.rescale(4)
    assert record.phases["stop"] >= 30 - 5  # the pods' 30 s grace, seen at 5 s polls
    assert cluster.clock() - before >= 30 + cluster.start_s + cluster.step_s


@pytest.mark.parametrize(
    "method, error, says",
    [
        ("create_namespaced_job", ApiException(status=403, reason="Forbidden"), "API error 403 Forbidden"),
        ("create_namespaced_job", ApiException(status=409, reason="AlreadyExists"), "API error 409 AlreadyExists"),
        ("create_namespaced_job", ApiException(status=422, reason="Unprocessable Entity"), "API error 422"),
        ("create_namespaced_job", ApiException(status=500, reason="Internal Server Error"), "API error 500"),
        ("patch_namespaced_job", ApiException(status=409, reason="Conflict"), "API error 409 Conflict"),
    ],
)
def test_api_errors_restore_the_size_that_ran(method, error, says):
    cluster = FakeKubernetes(node_gpus=(8,))
    launcher = _launcher(cluster)
    launcher.start(2)
    cluster.failures[method] = [error]  # once: the restore goes through
    with pytest.raises(RescaleFailed, match=says) as failed:
        launcher.rescale(4)
    assert failed.value.restored == 2 and cluster.running_workers() == 2


def test_a_role_without_a_verb_is_refused_403_naming_the_call():
    rules = [r for r in shipped_role("rbac.yaml") if "pods/log" not in r["resources"]]
    cluster = FakeKubernetes(node_gpus=(8,), rules=rules)
    launcher = _launcher(cluster)
    with pytest.raises(RescaleFailed, match="403"):
        launcher.start(2)


def test_the_shipped_role_grants_exactly_what_the_launcher_calls():
    """Every path (start, a rescale short of capacity, a retarget from the sensor's process, a failed start
    restored, a stop, checkpoints on a claim) runs under the shipped Role, which refuses anything it does not
    grant; and it grants nothing those paths do not call."""
    cluster = FakeKubernetes(node_gpus=(8, 8), rules=shipped_role("rbac.yaml"))
    _another_team(cluster, 6)
    launcher, sensors = _launcher(cluster), _launcher(cluster)
    launcher.start(4)
    launcher.rescale(16)  # short of capacity: reads the Job, records the capacity on it
    launcher.status()
    launcher.sleeper = lambda s: (sensors.retarget(6), cluster.sleep(s))  # a burst while 2 form
    launcher.rescale(2)
    cluster.failures["create_namespaced_job"] = [ApiException(status=500, reason="Internal Server Error")]
    with pytest.raises(RescaleFailed):
        launcher.rescale(3)
    launcher.stop()
    on_a_claim = _launcher(cluster, checkpoint_url=None, checkpoint_pvc="ctr-checkpoints")
    on_a_claim.start(1)  # its claim is read: it must be ReadWriteMany
    on_a_claim.stop()
    used = cluster.used
    granted = {
        (g, r, v)
        for rule in cluster.rules or []
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert used == granted, (used - granted, granted - used)
