"""A source of several topics, trained by Kale's harness: its partitions numbered as one set, balanced across the
topics, and every record of every topic trained once across rescales."""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pytest

from kale_dagster import KafkaSource, KaleConfigError, OnlineTrainingPipeline
from kale_dagster.launchers import LocalLauncher, TrainerSettings
from kale_dagster.stream.producer import ReplaySettings, replay
from kale_dagster.trainer.balance import assign_by_rate
from kale_dagster.trainer.checkpoint import load_latest
from kale_dagster.trainer.partitions import TOPIC_STRIDE, StreamPartitions
from kale_dagster.trainer.settings import worker_parser
from support import committed_offsets, end_offsets, trained_samples, wait_for

TOPICS = {"clicks": 3, "views": 2}  # partitions of each


@pytest.mark.parametrize(
    "saved, now, offsets, restored",
    [
        # A checkpoint of a one-topic harness (no topics recorded) is its source's first topic, as it was.
        (None, ("clicks",), {0: 5, 1: 7}, {0: 5, 1: 7}),
        (None, ("clicks", "views"), {0: 5}, {0: 5}),
        # Reordered topics: each offset goes back to its own topic.
        (("clicks", "views"), ("views", "clicks"), {1: 5, TOPIC_STRIDE + 1: 9}, {TOPIC_STRIDE + 1: 5, 1: 9}),
        # A topic dropped from the source is left out; one added starts from the group's committed offsets.
        (("clicks", "views"), ("views", "orders"), {0: 5, TOPIC_STRIDE: 9}, {0: 9}),
    ],
)
def test_a_checkpoint_restores_each_offset_to_its_own_topic(saved, now, offsets, restored):
    assert StreamPartitions(now).restored(offsets, saved) == restored


def test_the_partitions_of_every_topic_are_balanced_as_one_set():
    stream = StreamPartitions(tuple(TOPICS))
    keys = [stream.key(t, p) for t, n in TOPICS.items() for p in range(n)]
    assert [stream.topic_partition(k) for k in keys] == [(t, p) for t, n in TOPICS.items() for p in range(n)]
    assert stream.label(keys[-1]) == "views[1]"
    # A hot partition in one topic: the other topic's partitions fill the other ranks (LPT over all five).
    rates = dict(zip(keys, [10.0, 1.0, 1.0, 4.0, 4.0]))
    assert sorted(map(sorted, assign_by_rate(rates, 2))) == sorted([[keys[0]], sorted(keys[1:])])


@pytest.mark.parametrize(
    "topics, says",
    [
        (("clicks", "clicks"), "topics: clicks named more than once"),
        (("clicks", "page views"), "topics: 'page views': a Kafka topic's name is 1-249 of a-z A-Z 0-9 . _ -"),
        (("a,b",), "topics: 'a,b': a Kafka topic's name"),
    ],
)
def test_topics_kafka_cannot_have_are_refused_at_load(topics, says):
    with pytest.raises(KaleConfigError) as err:
        OnlineTrainingPipeline(name="ctr", source=KafkaSource("127.0.0.1:9092", topics, "g"))
    assert says in str(err.value)


def test_the_workers_flags_carry_every_topic():
    settings = TrainerSettings(KafkaSource("k:9092", tuple(TOPICS), "g"), "/tmp/ckpt")
    argv = settings.argv()
    assert argv[argv.index("--topics") + 1] == "clicks,views"
    assert worker_parser().parse_args(argv).topics == ("clicks", "views")
    assert worker_parser().parse_args([*argv, "--topic", "clicks"]).topics == ("clicks",)  # the old flag still reads


@pytest.mark.integration
def test_two_topics_are_trained_once_across_rescales(kafka_broker, tmp_path):
    servers, logs = kafka_broker.bootstrap_servers, tmp_path / "trained"
    logs.mkdir()
    history = pd.DataFrame({"timestamp": pd.date_range("2026-01-01", periods=2, freq="1min", tz="UTC"), "rate": 120.0})
    stop = threading.Event()
    producers = [
        threading.Thread(
            target=replay,
            args=(servers, history, ReplaySettings(topic=topic, partitions=n, seed=i)),
            kwargs=dict(stop=stop, max_wall_s=10),
        )
        for i, (topic, n) in enumerate(TOPICS.items())
    ]
    for p in producers:
        p.start()
    settings = TrainerSettings(
        KafkaSource(servers, tuple(TOPICS), "two-topics"),
        str(tmp_path / "ckpt"),
        batch_size=32,
        emulate_gpu_rate=150,
        checkpoint_every_s=1.0,
        trained_log=str(logs),
        collective_timeout_s=15,
    )
    launcher = LocalLauncher(settings, pool_size=3)

    def trained() -> int:
        return len(trained_samples(logs))

    try:
        launcher.start(2)
        for target in (3, 1):
            before = trained()
            wait_for(lambda: trained() >= before + 400, 60, "400 more samples trained", poll_s=0.2)  # noqa: B023
            launcher.rescale(target)
        for p in producers:
            p.join()
        ends = {t: end_offsets(servers, t, n) for t, n in TOPICS.items()}

        def committed() -> dict:
            launcher.supervise_once()
            return {t: committed_offsets(servers, t, "two-topics", n) for t, n in TOPICS.items()}

        wait_for(lambda: committed() == ends, 90, "every topic's offsets committed to its end", poll_s=1.0)
    finally:
        stop.set()
        launcher.stop()
    stream = StreamPartitions(tuple(TOPICS))
    produced = {(stream.key(t, p), o) for t, offsets in ends.items() for p, end in offsets.items() for o in range(end)}
    samples = trained_samples(logs)
    seen = [(int(p), int(o)) for p, o, _ in samples]
    assert set(seen) == produced, f"{len(produced - set(seen))} records of {len(produced)} never trained"
    assert len(seen) == len(produced), f"{len(seen) - len(produced)} records trained twice"
    assert all(sum(offsets.values()) > 500 for offsets in ends.values())  # both topics carried traffic
    assert [r.to_workers for r in launcher.records] == [2, 3, 1]
    assert load_latest(tmp_path / "ckpt")["topics"] == ["clicks", "views"]
    assert np.all(samples[:, 2] == 0)  # one sample per record
