"""Warm start from Kafka: per-bucket arrivals rebuilt from retained records, exact, on either broker behaviour.

Apache Kafka cannot run here, so the unit rows run both lookups against a stand-in consumer at
kafka-python's interface that answers ListOffsets by timestamp as Kafka does, or as the embedded
broker (Tansu) does; the integration test runs on the embedded broker itself.
"""

from __future__ import annotations

import random
import sys
import time
from collections import namedtuple

import pytest
from kafka import TopicPartition

from kale_dagster.stream.backfill import (
    FetchSearchLookup,
    RecordReader,
    TimestampIndexLookup,
    choose_lookup,
    partition_spans,
    rebuild_arrivals,
)

Record = namedtuple("Record", "offset timestamp")
Answer = namedtuple("Answer", "offset timestamp")


class StandInConsumer:
    """Records per partition as (offset, timestamp ms); ``time_index``: "kafka" answers ListOffsets by timestamp
    with the first record stamped at or after it, "tansu" with the partition's first offset for any earlier time."""

    def __init__(self, partitions: dict, time_index: str = "kafka", run=7):
        self.partitions, self.time_index, self.run = partitions, time_index, run
        self.position = {}

    def partitions_for_topic(self, topic):
        return {tp.partition for tp in self.partitions if tp.topic == topic}

    def beginning_offsets(self, tps):
        return {tp: self.partitions[tp][0][0] if self.partitions[tp] else 0 for tp in tps}

    def end_offsets(self, tps):
        return {tp: self.partitions[tp][-1][0] + 1 if self.partitions[tp] else 0 for tp in tps}

    def assign(self, tps):
        self.assigned = list(tps)

    def seek(self, tp, offset):
        self.position[tp] = offset

    def poll(self, timeout_ms, max_records):
        tp = self.assigned[0]
        records = [Record(o, t) for o, t in self.partitions[tp] if o >= self.position[tp]][: min(self.run, max_records)]
        return {tp: records} if records else {}

    def highwater(self, tp):
        return self.end_offsets([tp])[tp]

    def offsets_for_times(self, query):
        out = {}
        for tp, t in query.items():
            records = self.partitions[tp]
            if self.time_index == "tansu":
                out[tp] = Answer(records[0][0], records[0][1]) if records and records[-1][1] >= t else None
            else:
                out[tp] = next((Answer(o, ts) for o, ts in records if ts >= t), None)
        return out


#: The stand-in broker's clock: its records are stamped in the week after the epoch.
NOW_S = 8 * 86_400.0


def traffic(
    seed: int, partitions: int, start_ms: int, span_ms: int, n: int, first_offset: int = 0, same_time: int = 1
) -> dict:
    """Records with non-decreasing timestamps per partition (``same_time`` records share each timestamp)."""
    rng = random.Random(seed)
    out = {}
    for p in range(partitions):
        stamps = sorted(rng.randrange(start_ms, start_ms + span_ms) for _ in range(n // same_time))
        stamps = [max(t, 1) for t in stamps for _ in range(same_time)]  # a stamp of 0 is no time (record_time)
        out[TopicPartition("t", p)] = [(first_offset + i, t) for i, t in enumerate(stamps)]
    return out


def truth(partitions: dict, boundaries: list[int]) -> dict:
    return {
        tp: [next((o for o, t in records if t >= b), records[-1][0] + 1 if records else 0) for b in boundaries]
        for tp, records in partitions.items()
    }


CASES = [
    # (case, time index, records, boundaries)
    ("dense, Kafka's index", "kafka", traffic(1, 3, 0, 100_000, 400), list(range(-5_000, 110_000, 7_000))),
    ("dense, Tansu's index", "tansu", traffic(1, 3, 0, 100_000, 400), list(range(-5_000, 110_000, 7_000))),
    ("sparse: many boundaries between records", "tansu", traffic(2, 2, 0, 100_000, 5), list(range(0, 100_000, 1_000))),
    (
        "equal timestamps at boundaries",
        "tansu",
        traffic(3, 2, 0, 50_000, 120, same_time=4),
        list(range(0, 50_000, 500)),
    ),
    (
        "a truncated log (offsets from 1000)",
        "kafka",
        traffic(4, 2, 0, 10_000, 50, first_offset=1000),
        list(range(0, 10_000, 900)),
    ),
    (
        "an empty partition",
        "tansu",
        {**traffic(5, 1, 0, 10_000, 30), TopicPartition("t", 1): []},
        list(range(0, 10_000, 900)),
    ),
    (
        "offset gaps (compaction, transaction markers)",
        "tansu",
        {tp: [(o * 3, t) for o, t in records] for tp, records in traffic(8, 2, 0, 100_000, 300).items()},
        list(range(0, 100_000, 20_000)),
    ),
]


@pytest.mark.parametrize("case, time_index, partitions, boundaries", CASES, ids=[c[0] for c in CASES])
def test_both_lookups_find_the_first_record_at_or_after_each_boundary(case, time_index, partitions, boundaries):
    consumer = StandInConsumer(partitions, time_index)
    # Sparse rows take the search, dense ones the in-order read; the stamps are judged against the stand-in's clock.
    reader = RecordReader(consumer, run_records=consumer.run, now_s=NOW_S)
    spans = partition_spans(reader, list(partitions))
    expected = truth(partitions, boundaries)
    assert FetchSearchLookup(reader, spans).offsets(boundaries) == expected
    if time_index == "kafka":
        assert TimestampIndexLookup(reader, spans).offsets(boundaries) == expected


@pytest.mark.parametrize("time_index, method", [("kafka", "list-offsets-by-timestamp"), ("tansu", "fetch-search")])
def test_the_lookup_is_chosen_by_probing_the_broker(time_index, method):
    partitions = traffic(6, 4, 0, 100_000, 300, same_time=3)
    reader = RecordReader(StandInConsumer(partitions, time_index), now_s=NOW_S)
    assert choose_lookup(reader, partition_spans(reader, list(partitions))).method == method


def test_the_fetch_search_reads_far_fewer_runs_than_a_scan_when_boundaries_are_sparse():
    partitions = traffic(7, 1, 0, 7 * 86_400_000, 20_000)
    reader = RecordReader(StandInConsumer(partitions, "tansu", run=50), run_records=50, now_s=NOW_S)
    spans = partition_spans(reader, list(partitions))
    boundaries = list(range(0, 7 * 86_400_000 + 1, 6 * 3_600_000))  # 6-hourly over a week: 29 boundaries
    assert FetchSearchLookup(reader, spans).offsets(boundaries) == truth(partitions, boundaries)
    assert (
        reader.fetches < 20_000 / 50 / 2
    )  # a scan would read 400 runs; the search about log2(400 / 29) + 1 per boundary


def test_buckets_older_than_what_every_partition_retains_are_left_out():
    day = 86_400_000
    partitions = {
        TopicPartition("t", 0): [(i, 1 + i * 60_000) for i in range(0, 3 * 1440)],  # 3 days, from offset 0
        TopicPartition("t", 1): [(500 + i, day + i * 60_000) for i in range(2 * 1440)],
    }  # retention cut it at day 1
    result = rebuild_arrivals(StandInConsumer(partitions, "tansu"), ["t"], days=7, bucket_s=3600, now=3 * 86_400)
    assert result.start == 86_400 and result.end == 3 * 86_400 and "retains 2.00 of the 7 days" in result.note
    assert list(result.rows["records"]) == [120] * 24 + [120] * 24  # both partitions' 60 records an hour


@pytest.mark.integration
def test_backfill_on_the_embedded_broker_matches_what_was_produced(kafka_broker, tmp_path, monkeypatch):
    """A week of records stamped by the producer, 4 partitions: the rebuilt hourly counts equal the produced ones,
    through the CLI and the pipeline's job, seeded into its history up to the first live reading, not over it."""
    from kafka import KafkaProducer

    from kale_dagster.cli import main
    from kale_dagster.stream.history import MetricsHistory
    from kale_dagster.stream.producer import ensure_topic

    ensure_topic(kafka_broker.bootstrap_servers, "clicks", 4)
    bucket_s, now = 3600, time.time()
    start = (int(now) // bucket_s - 7 * 24) * bucket_s
    rng = random.Random(11)
    produced = [0] * (7 * 24)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers, linger_ms=5)
    for p in range(4):
        stamps = sorted(rng.uniform(start, start + 7 * 86_400) for _ in range(rng.randrange(300, 600)))
        for t in stamps:
            producer.send("clicks", value=b"x" * 29, partition=p, timestamp_ms=int(t * 1000))
            produced[int((t - start) // bucket_s)] += 1
    producer.flush()
    producer.close()

    history_url = f"sqlite:///{tmp_path / 'm.db'}"
    (tmp_path / "backfill_pipelines.py").write_text(
        "from kale_dagster import KafkaSource, OnlineTrainingPipeline\n"
        f"clicks = OnlineTrainingPipeline(name='clicks', source=KafkaSource('{kafka_broker.bootstrap_servers}', "
        "('clicks',), 'g'),"
        f" history_url='{history_url}', metrics_interval_seconds={bucket_s})\n"
    )
    live_at = start + 5 * 86_400 + 1800  # the metrics sensor's first reading: the backfill stops before it
    MetricsHistory(history_url).append_stream("clicks", live_at, {"arrival_rate": 1.0})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "backfill_pipelines", raising=False)
    assert (
        main(["history", "backfill", "--pipeline", "clicks", "--module", "backfill_pipelines", "--days", "7", "--json"])
        == 0
    )

    rows = MetricsHistory(history_url).stream("clicks")
    seeded, live = rows[rows["seeded"].astype(bool)], rows[~rows["seeded"].astype(bool)]
    assert list(live["ts"]) == [live_at] and list(live["arrival_rate"]) == [1.0]
    assert [round(r * bucket_s) for r in seeded["arrival_rate"]] == produced[: 5 * 24]
    assert list(seeded["ts"]) == [start + (k + 1) * bucket_s for k in range(5 * 24)]

    # The pipeline's Dagster job does the same, idempotently (seeded rows are rewritten, not duplicated).
    import backfill_pipelines
    from dagster import AssetKey, instance_for_test

    from kale_dagster import build_definitions

    with instance_for_test() as instance:
        job = build_definitions(backfill_pipelines.clicks).resolve_job_def("clicks_backfill")
        assert job.execute_in_process(
            instance=instance, run_config={"ops": {"clicks_backfill_history": {"config": {"days": 7.0}}}}
        ).success
        observed = (
            instance.fetch_observations(AssetKey(["clicks", "stream_metrics"]), limit=1)
            .records[0]
            .asset_observation.metadata
        )
        assert observed["backfilled_buckets"].value == 5 * 24 and observed["backfilled_records"].value == sum(
            produced[: 5 * 24]
        )
        assert observed["method"].value == "fetch-search"
    assert len(MetricsHistory(history_url).stream("clicks")) == 5 * 24 + 1
