"""Advisory mode on a consumer group Kale did not start: membership as a worker count (table tests), and an
advisory pipeline deciding at every reading on a real group of consumers on the embedded broker."""

from __future__ import annotations

import threading
import time

import pytest

from kale_dagster import KafkaSource, KaleConfigError, Limits, OnlineTrainingPipeline, ThroughputModel
from kale_dagster.launchers import ObservedGroupLauncherConfig
from kale_dagster.stream.group import GroupView, describe_group, view_of, worker_count
from support import wait_for

SOURCE = KafkaSource("127.0.0.1:9092", ("samples",), "their-trainer")


def _member(assignment=None, instance=None) -> dict:
    return {"member_id": "m", "group_instance_id": instance, "member_assignment": assignment}


class _Assignment:
    def __init__(self, *topics):
        self.assigned_partitions = [(t, [0, 1]) for t in topics]


@pytest.mark.parametrize(
    "description, declared, workers, says",
    [
        # Apache Kafka: assignments are readable; members without the topics are not workers of this trainer.
        (
            {"group_state": "Stable", "members": [_member(_Assignment("samples")), _member(_Assignment("other"))]},
            None,
            1,
            "1 of the group's 2 members are assigned the topics",
        ),
        # The embedded broker: no assignments in the answer; every member is taken as a worker, and it says so.
        ({"group_state": "Stable", "members": [_member(b""), _member(b""), _member(b"")]}, None, 3, "not readable"),
        ({"group_state": "Stable", "members": [_member(b"", instance="pod-0")]}, None, 1, "1 static members"),
        ({"group_state": "Empty", "members": []}, None, None, "no members (consumers that assign()"),
        ({"group_state": "Empty", "members": []}, 4, 4, "the declared 4 workers are used"),
        ({"group_state": "Dead", "members": []}, None, None, "not known to the classic group API"),
        (None, 2, 2, "KIP-848"),
        (
            {"group_state": "Stable", "members": [_member(_Assignment("other"))]},
            None,
            None,
            "0 of the group's 1 members",
        ),
    ],
)
def test_membership_as_a_worker_count(description, declared, workers, says):
    view = view_of(description, ("samples",)) if description is not None else None
    count, how = worker_count(view, declared)
    assert count == workers and says in how, how
    assert count != 0  # an unknown count is never 0 workers


def test_rebalancing_is_a_restart_in_progress():
    view = view_of({"group_state": "PreparingRebalance", "members": [_member(b"")]}, ("samples",))
    assert view == GroupView("PreparingRebalance", "", 1, None, 0)


def test_the_pipelines_launcher_measures_rebalances_across_ticks_and_shares_them_with_no_other(monkeypatch):
    """Built once per pipeline per process: the rebalance seen at one tick and the stable group at a later one make
    one measured restart; a second pipeline watching the same group has a launcher, and a memory, of its own."""
    views = iter([("Stable",), ("PreparingRebalance",), ("CompletingRebalance",), ("Stable",), ("Stable",)])
    monkeypatch.setattr(
        "kale_dagster.launchers.observed.describe_group",
        lambda config, group, topics: GroupView(*next(views), "consumer", 3, 3, 0),
    )
    p = OnlineTrainingPipeline(name="theirs", source=SOURCE, advisory=True, launcher=ObservedGroupLauncherConfig())
    other = OnlineTrainingPipeline(
        name="also_theirs", source=SOURCE, advisory=True, launcher=ObservedGroupLauncherConfig()
    )
    now = iter([0.0, 10.0, 40.0, 70.0])
    launcher = p.launcher_instance
    assert launcher is p.launcher_instance and launcher is not other.launcher_instance
    launcher.clock = lambda: next(now)  # type: ignore[attr-defined]
    seen = [launcher.status() for _ in range(4)]
    assert [s.rescaling for s in seen] == [False, True, True, False]
    assert seen[-1].downtimes_s == (60.0,)  # from the first reading that saw the rebalance to the first stable one
    assert other.launcher_instance.status().downtimes_s == ()  # no module-level memory shared across pipelines


def test_an_observed_group_is_only_advised_on():
    with pytest.raises(KaleConfigError, match="advisory: an observed consumer group is never rescaled"):
        OnlineTrainingPipeline(name="theirs", source=SOURCE, launcher=ObservedGroupLauncherConfig(), advisory=False)
    assert OnlineTrainingPipeline(
        name="theirs", source=SOURCE, launcher=ObservedGroupLauncherConfig()
    ).advisory  # the default
    with pytest.raises(KaleConfigError, match="workers: must be >= 1"):
        ObservedGroupLauncherConfig(workers=0)


@pytest.mark.integration
def test_an_advisory_pipeline_decides_at_every_reading_on_a_group_it_did_not_start(kafka_broker, tmp_path):
    from dagster import AssetMaterialization, build_sensor_context, instance_for_test
    from kafka import KafkaConsumer, KafkaProducer

    from kale_dagster import build_definitions
    from kale_dagster.control.clock import PipelineClock
    from kale_dagster.stream.producer import ensure_topic

    servers = kafka_broker.bootstrap_servers
    ensure_topic(servers, "samples", 4)
    stop = threading.Event()
    consumers = [
        KafkaConsumer(
            "samples",
            bootstrap_servers=servers,
            group_id="their-trainer",
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
            enable_auto_commit=True,
            auto_commit_interval_ms=500,
        )
        for _ in range(2)
    ]

    def consume(consumer):
        while not stop.is_set():
            consumer.poll(200)

    threads = [threading.Thread(target=consume, args=(c,), daemon=True) for c in consumers]
    for t in threads:
        t.start()
    producer = KafkaProducer(bootstrap_servers=servers)

    def pipeline(name: str, group: str, declared: int | None) -> OnlineTrainingPipeline:
        return OnlineTrainingPipeline(
            name=name,
            source=KafkaSource(servers, ("samples",), group, request_timeout_ms=3000),
            limits=Limits(min_workers=1, max_workers=8),
            throughput_prior=ThroughputModel.linear(100.0),
            advisory=True,
            launcher=ObservedGroupLauncherConfig(workers=declared),
            clock=PipelineClock(30.0, wall_start=time.time()),
            history_url=f"sqlite:///{tmp_path / 'm.db'}",
            forecaster="ewma",
            record_every_minutes=0,  # every decision an event too, to read what each one said
        )

    watched = [
        pipeline("theirs", "their-trainer", None),
        pipeline("assigned", "nobody", 3),
        pipeline("unknown", "nobody", None),
    ]
    decisions: dict[str, list[dict]] = {p.name: [] for p in watched}
    try:
        # The group forms (the embedded broker's JoinGroup waits half the session timeout): both consumers are
        # members of a stable group.
        def formed() -> bool:
            view = describe_group(watched[0].source.client_config(), "their-trainer", ("samples",))
            return view is not None and view.state == "Stable" and view.members == 2

        wait_for(formed, 60, "the consumer group formed", poll_s=0.5)
        with instance_for_test() as instance:
            for p in watched:
                repo = build_definitions(p).get_repository_def()
                sensor = {s.name: s for s in repo.sensor_defs}[f"{p.name}_stream_metrics"]
                cursor = None
                for _ in range(4):
                    for i in range(50):
                        producer.send("samples", b"x" * 29, partition=i % 4)
                    producer.flush()
                    result = sensor(build_sensor_context(instance=instance, cursor=cursor))
                    cursor = result.cursor
                    event = next(
                        e
                        for e in result.asset_events
                        if isinstance(e, AssetMaterialization) and e.asset_key.path == [p.name, "gpu_allocation"]
                    )
                    decisions[p.name].append({k: v.value for k, v in event.metadata.items()})
                    # advisory: refits are requested, rescales never
                    assert all(r.job_name == f"{p.name}_refit" for r in result.run_requests)
                    time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join()
        for c in consumers:
            c.close()
        producer.close()
    theirs = decisions["theirs"]
    assert len(theirs) == 4  # a decision at every reading
    recorded = watched[0].history().stream("theirs")
    assert recorded["decided_workers"].notna().sum() == 4 and recorded["decision"].str.len().min() > 0
    assert all(d["running_workers"] == 2 and "2 members" in d["workers_observed_from"] for d in theirs), theirs[-1]
    assert all("would_change_workers_by" in d for d in theirs)
    assigned = decisions["assigned"]
    assert all(d["running_workers"] == 3 and "declared 3 workers" in d["workers_observed_from"] for d in assigned)
    unknown = decisions["unknown"]
    assert all("cannot tell how many workers" in d["held"] for d in unknown), unknown[-1]


@pytest.mark.integration
def test_a_decision_that_changes_nothing_reaches_the_history_not_the_event_log(kafka_broker, tmp_path):
    """By default the event log gets the decisions that change something and one every record_every_minutes:
    a quiet advisory pipeline decides at every reading, all of them in the metrics history."""
    from dagster import AssetMaterialization, AssetObservation, build_sensor_context, instance_for_test

    from kale_dagster import build_definitions
    from kale_dagster.control.clock import PipelineClock
    from kale_dagster.stream.producer import ensure_topic

    ensure_topic(kafka_broker.bootstrap_servers, "quiet", 2)
    p = OnlineTrainingPipeline(
        name="quiet",
        source=KafkaSource(kafka_broker.bootstrap_servers, ("quiet",), "nobody", request_timeout_ms=3000),
        advisory=True,
        launcher=ObservedGroupLauncherConfig(workers=2),
        clock=PipelineClock(30.0, wall_start=time.time()),  # 10 pipeline minutes are 20 s: longer than this test
        history_url=f"sqlite:///{tmp_path / 'm.db'}",
        forecaster="ewma",
    )
    repo = build_definitions(p).get_repository_def()
    sensor = {s.name: s for s in repo.sensor_defs}["quiet_stream_metrics"]
    kinds: list[list[str]] = []
    with instance_for_test() as instance:
        cursor = None
        for _ in range(6):
            result = sensor(build_sensor_context(instance=instance, cursor=cursor))
            cursor = result.cursor
            kinds.append([type(e).__name__ for e in result.asset_events])
            time.sleep(0.3)
    materialized = sum(AssetMaterialization.__name__ in k for k in kinds)
    assert kinds[0] == ["AssetObservation", "AssetCheckEvaluation", "AssetMaterialization"]
    assert 1 <= materialized <= 3 and [] in kinds, kinds  # the first, and any that changed something
    assert all(k.count(AssetObservation.__name__) == k.count(AssetMaterialization.__name__) for k in kinds)
    recorded = p.history().stream("quiet")
    assert len(recorded) == 6 and recorded["decided_workers"].notna().all()
