"""Telemetry on the embedded broker: exact lag, rates, time lag, outages, and the sensor in a real instance."""

from __future__ import annotations

import time

import pytest
from dagster import SensorResult, SkipReason, build_sensor_context, instance_for_test
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.structs import OffsetAndMetadata

from kale_dagster import KaleConfigError
from kale_dagster.definitions import resources
from kale_dagster.definitions.resources import KafkaStreamResource
from kale_dagster.model.types import PartitionOffsets
from kale_dagster.sensors import StreamMetricsCursor, build_stream_metrics_sensor
from kale_dagster.stream.broker import start_broker
from kale_dagster.stream.history import MetricsHistory
from kale_dagster.stream.telemetry import PreviousOffsets, RawOffsets, build_snapshot, previous_from

pytestmark = pytest.mark.integration

TOPIC, GROUP = "samples", "trainer"


def _setup(servers, partitions=3):
    admin = KafkaAdminClient(bootstrap_servers=servers)
    admin.create_topics([NewTopic(TOPIC, num_partitions=partitions, replication_factor=1)])
    admin.close()


def _produce(servers, per_partition: dict, rate=None):
    # batch_size=0: one record per batch, so every offset is exact on Tansu too.
    producer = KafkaProducer(bootstrap_servers=servers, batch_size=0, linger_ms=0)
    total = sum(per_partition.values())
    start = time.monotonic()
    sent = 0
    for partition, count in per_partition.items():
        for _ in range(count):
            producer.send(TOPIC, value=b"x" * 16, partition=partition)
            sent += 1
            if rate:
                delay = start + sent / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
    producer.flush()
    producer.close()
    return total


def _commit(servers, offsets: dict):
    consumer = KafkaConsumer(bootstrap_servers=servers, group_id=GROUP, enable_auto_commit=False)
    consumer.commit({TopicPartition(TOPIC, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()})
    consumer.close()


def _resource(servers):
    return KafkaStreamResource(bootstrap_servers=servers, topics=[TOPIC], group_id=GROUP, request_timeout_ms=3000)


def test_exact_lag_per_partition(kafka_broker):
    servers = kafka_broker.bootstrap_servers
    _setup(servers)
    # A batched producer: Tansu's ListOffsets would under-report these ends.
    producer = KafkaProducer(bootstrap_servers=servers, linger_ms=50)
    for partition, count in {0: 120, 1: 45, 2: 0}.items():
        for _ in range(count):
            producer.send(TOPIC, value=b"y", partition=partition)
    producer.flush()
    producer.close()
    _commit(servers, {0: 100, 1: 45})
    snap = _resource(servers).snapshot()
    by_partition = {p.partition: p for p in snap.partitions}
    assert {k: v.end_offset for k, v in by_partition.items()} == {0: 120, 1: 45, 2: 0}
    assert {k: v.lag for k, v in by_partition.items()} == {0: 20, 1: 0, 2: 0}
    assert by_partition[2].committed is None
    assert snap.sample_lag == 20
    assert snap.arrival_rate is None  # first snapshot: no rate invented


def test_missing_commit_counts_from_the_earliest_offset(kafka_broker):
    servers = kafka_broker.bootstrap_servers
    _setup(servers, partitions=1)
    _produce(servers, {0: 30})
    assert _resource(servers).snapshot().sample_lag == 30


def test_packed_records_are_counted_in_samples(kafka_broker):
    import pandas as pd

    from kale_dagster.stream.producer import ReplaySettings, replay

    servers = kafka_broker.bootstrap_servers
    trace = pd.DataFrame({"timestamp": pd.date_range("2026-01-01", periods=2, freq="1min", tz="UTC"), "rate": 400.0})
    sent = replay(servers, trace, ReplaySettings(topic=TOPIC, partitions=2, samples_per_record=4), max_wall_s=1.5)
    assert sent > 0 and sent % 4 == 0
    packed = KafkaStreamResource(
        bootstrap_servers=servers, topics=[TOPIC], group_id=GROUP, samples_per_record=4
    ).snapshot()
    assert packed.sample_lag == sent
    assert _resource(servers).snapshot().sample_lag == sent // 4  # the same stream read as one sample per record


def test_arrival_and_consumption_rates(kafka_broker):
    servers = kafka_broker.bootstrap_servers
    _setup(servers, partitions=2)
    resource = _resource(servers)
    first = resource.snapshot()
    _produce(servers, {0: 300, 1: 300}, rate=200)  # 600 samples at 200/s: ~3 s
    _commit(servers, {0: 300, 1: 150})
    second = resource.snapshot(previous=previous_from(first))
    # Rates are over the interval between the snapshots, which also holds the producer's start and the commit:
    # on a loaded host that interval is longer than the 3 s of production (CI read 168/s against 200 once).
    elapsed = second.time - first.time
    assert second.arrival_rate == pytest.approx(600 / elapsed, rel=0.01)
    assert second.consumption_rate == pytest.approx(450 / elapsed, rel=0.01)


def test_time_lag_grows_unconsumed_and_drops_after_consumption(kafka_broker):
    servers = kafka_broker.bootstrap_servers
    _setup(servers, partitions=2)
    _produce(servers, {0: 10, 1: 10})
    resource = _resource(servers)
    t1 = resource.snapshot().time_lag_s
    time.sleep(1.5)
    t2 = resource.snapshot().time_lag_s
    assert t2 == pytest.approx(t1 + 1.5, abs=0.5)
    _produce(servers, {0: 5})
    _commit(servers, {0: 10, 1: 10})  # only the 5 new samples on partition 0 remain
    t3 = resource.snapshot().time_lag_s
    assert t3 < 0.5 * t2


def test_recreated_topic_gives_no_false_rate():
    raw = RawOffsets(100.0, (PartitionOffsets(0, 5, 5),), ("t",), (None,))
    snap = build_snapshot(raw, PreviousOffsets(40.0, {"t": {"0": [500, 400]}}))
    assert snap.arrival_rate is None


# One validation path: each row is checked on the pipeline's KafkaSource and on the resource.
SOURCE_ROWS = [
    # (KafkaSource keyword arguments, field named in the error, or None for a valid row)
    (dict(bootstrap_servers="localhost:9092", topics=("t",), group_id="g"), None),
    (dict(bootstrap_servers=" a:1, b:2 ", topics=("t", "u"), group_id="g"), None),
    (dict(bootstrap_servers="", topics=("t",), group_id="g"), "bootstrap_servers"),
    (dict(bootstrap_servers="localhost", topics=("t",), group_id="g"), "bootstrap_servers"),
    (dict(bootstrap_servers="localhost:99999", topics=("t",), group_id="g"), "bootstrap_servers"),
    (dict(bootstrap_servers="localhost:9092", topics=("",), group_id="g"), "topics"),
    (dict(bootstrap_servers="localhost:9092", topics="clicks", group_id="g"), "topics"),
    (dict(bootstrap_servers="localhost:9092", topics=("t",), group_id=" "), "group_id"),
    (
        dict(bootstrap_servers="localhost:9092", topics=("t",), group_id="g", security_protocol="TLS"),
        "security_protocol",
    ),
    (
        dict(bootstrap_servers="localhost:9092", topics=("t",), group_id="g", security_protocol="SASL_SSL"),
        "sasl_mechanism",
    ),
    (
        dict(
            bootstrap_servers="localhost:9092",
            topics=("t",),
            group_id="g",
            security_protocol="SASL_SSL",
            sasl_mechanism="PLAIN",
        ),
        "sasl_username",
    ),
    (
        dict(
            bootstrap_servers="localhost:9092",
            topics=("t",),
            group_id="g",
            security_protocol="sasl_ssl",
            sasl_mechanism="PLAIN",
            sasl_username="u",
            sasl_password_env="PW",
        ),
        None,
    ),
    (dict(bootstrap_servers="localhost:9092", topics=("t",), group_id="g", samples_per_record=0), "samples_per_record"),
    (dict(bootstrap_servers="localhost:9092", topics=("t",), group_id="g", request_timeout_ms=5), "request_timeout_ms"),
]


@pytest.mark.parametrize(
    "kwargs, field", SOURCE_ROWS, ids=[f"row{i}-{f or 'ok'}" for i, (_, f) in enumerate(SOURCE_ROWS)]
)
def test_source_and_resource_validate_alike(kwargs, field):
    from pydantic import ValidationError

    from kale_dagster.stream.source import KafkaSource

    if field is None:
        source = KafkaSource(**kwargs)
        resource = KafkaStreamResource.from_source(source)
        assert resource.bootstrap_servers == source.bootstrap_servers and resource.topics == list(source.topics)
        assert resource.security_protocol == source.security_protocol == source.security_protocol.upper()
        return
    with pytest.raises(KaleConfigError) as err:
        KafkaSource(**kwargs)
    assert err.value.field == field
    if isinstance(kwargs["topics"], str):
        return  # the resource's topics field is typed list[str]: pydantic rejects a bare string itself
    resource_kwargs = {k: v for k, v in kwargs.items() if k != "sasl_password_env"}
    resource_kwargs["topics"] = list(kwargs["topics"])
    if "sasl_username" in resource_kwargs:
        resource_kwargs["sasl_plain_username"] = resource_kwargs.pop("sasl_username")
    with pytest.raises(ValidationError, match=f"{field}: "):
        KafkaStreamResource(**resource_kwargs)


def test_workers_get_the_sources_security_settings_through_the_environment(monkeypatch):
    from kale_dagster.stream.source import KafkaSource
    from kale_dagster.trainer.settings import TrainerSettings

    source = KafkaSource(
        "k:9093",
        ("clicks",),
        "ctr",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="kale",
        sasl_password_env="CTR_PW",
    )
    settings = TrainerSettings(source, "/tmp/ckpt")
    argv = settings.argv()
    assert argv[argv.index("--bootstrap-servers") + 1] == "k:9093" and argv[argv.index("--topics") + 1] == "clicks"
    assert not any("kale" == a or "secret" in a for a in argv)  # no credential on a command line
    with pytest.raises(KaleConfigError, match="CTR_PW is not set"):
        settings.env()
    monkeypatch.setenv("CTR_PW", "s3cret")
    env = settings.env()
    assert (
        env["KAFKA_SECURITY_PROTOCOL"],
        env["KAFKA_SASL_MECHANISM"],
        env["KAFKA_SASL_USERNAME"],
        env["KAFKA_SASL_PASSWORD"],
    ) == ("SASL_SSL", "SCRAM-SHA-512", "kale", "s3cret")


def test_sensor_records_in_pipeline_time_skips_on_outage_and_resumes(tmp_path):
    from kale_dagster.control.clock import PipelineClock

    broker = start_broker()
    port = broker.port
    history = MetricsHistory(f"sqlite:///{tmp_path / 'm.db'}")
    clock = PipelineClock(time_scale=10.0, wall_start=time.time(), pipeline_start=1_800_000_000.0)
    try:
        servers = broker.bootstrap_servers
        _setup(servers, partitions=2)
        sensor = build_stream_metrics_sensor(
            name="demo_stream_metrics",
            pipeline="demo",
            history=history,
            stream=_resource(servers),
            clock=clock,
            tick_timeout_s=8,
        )
        with instance_for_test() as instance:
            ctx = build_sensor_context(instance=instance)
            _produce(servers, {0: 50, 1: 50})  # here: the time lag starts now, not while the instance is set up
            first = sensor(ctx)
            assert isinstance(first, SensorResult) and first.run_requests == []
            assert first.asset_events[0].metadata["sample_lag"].value == 100
            cursor = StreamMetricsCursor.from_json(first.cursor)
            assert cursor.offsets == {TOPIC: {"0": [50, None], "1": [50, None]}}

            time.sleep(1.2)
            second = sensor(build_sensor_context(instance=instance, cursor=first.cursor))
            # Pipeline time runs 10x: 1.2 wall seconds of lag read as 12 and more pipeline seconds.
            lag = second.asset_events[0].metadata["time_lag_s"].value
            assert 12.0 <= lag < 60.0
            rows = history.stream("demo")
            assert rows["ts"].iloc[-1] == pytest.approx(clock.now(), abs=30) and rows["time_lag_s"].iloc[
                -1
            ] == pytest.approx(lag)

            broker.stop()
            started = time.monotonic()
            skipped = sensor(build_sensor_context(instance=instance, cursor=second.cursor))
            assert time.monotonic() - started < 8  # within the tick budget, not kafka-python's 30 s bootstrap
            assert isinstance(skipped, SkipReason)
            assert "could not read the stream" in skipped.skip_message and "nothing decided" in skipped.skip_message
            rows_before = len(history.stream("demo"))

            broker = start_broker(port=port)
            _setup(servers, partitions=2)
            _produce(servers, {0: 7, 1: 3})
            resumed = sensor(build_sensor_context(instance=instance, cursor=second.cursor))
            assert isinstance(resumed, SensorResult)
            assert resumed.asset_events[0].metadata["sample_lag"].value == 10
            # The restarted in-memory broker's offsets went backwards: no rate rather than a false one.
            assert resumed.asset_events[0].metadata["arrival_rate"].value == "n/a (first snapshot)"
            assert len(history.stream("demo")) == rows_before + 1
    finally:
        broker.stop()
        history.dispose()


def test_history_is_bounded_and_read_by_time_range(tmp_path):
    history = MetricsHistory(f"sqlite:///{tmp_path / 'm.db'}", retention_days=1)
    base = 1_800_000_000.0
    for i in range(5):
        history.append_stream("p", base + i * 43_200, {"arrival_rate": float(i), "sample_lag": i})
    frame = history.stream("p")
    assert list(frame["arrival_rate"]) == [2.0, 3.0, 4.0]  # older than one day: deleted
    assert list(history.stream("p", start=base + 3 * 43_200)["sample_lag"]) == [3, 4]
    reopened = MetricsHistory(history.url, retention_days=1)  # survives a restart
    assert len(reopened.arrival_history("p")) == 3


def test_request_count_does_not_grow_with_partitions(kafka_broker, monkeypatch):
    # Count requests at kafka-python's connection manager, which every client uses.
    from kafka.net.manager import KafkaConnectionManager

    sent: list[str] = []
    original = KafkaConnectionManager.send

    def counting_send(self, request, *args, **kwargs):
        sent.append(type(request).__name__)
        return original(self, request, *args, **kwargs)

    monkeypatch.setattr(KafkaConnectionManager, "send", counting_send)
    servers = kafka_broker.bootstrap_servers
    admin = KafkaAdminClient(bootstrap_servers=servers)
    admin.create_topics([NewTopic(f"t{n}", num_partitions=n, replication_factor=1) for n in (4, 64)])
    admin.close()  # its background metadata refreshes are not the snapshot's requests
    counts = {}
    for partitions in (4, 64):
        topic = f"t{partitions}"
        producer = KafkaProducer(bootstrap_servers=servers, linger_ms=20)
        for p in range(partitions):
            producer.send(topic, value=b"z", partition=p)
        producer.flush()
        producer.close()
        reader = KafkaStreamResource(bootstrap_servers=servers, topics=[topic], group_id="g")
        reader.snapshot()  # the clients stay open across ticks: count a tick's requests once they are
        sent.clear()
        snap = reader.snapshot()
        assert snap.sample_lag == partitions
        counts[partitions] = {name: sent.count(name) for name in set(sent) if "Heartbeat" not in name}
    # Same requests of each kind for 4 and 64 partitions (Fetch may take an extra round, and kafka-python's
    # background metadata refresh, up to two requests, may land inside either snapshot's window): per-partition
    # requests would add 60.
    small, large = counts[4], counts[64]
    background = {"MetadataRequest"}
    assert set(small) - background == set(large) - background, (small, large)
    for name in small.keys() | large.keys():
        slack = {"FetchRequest": 2, "MetadataRequest": 2}.get(name, 0)
        assert large.get(name, 0) <= small.get(name, 0) + slack, (name, small, large)


def test_clients_no_tick_uses_are_closed_and_the_rest_kept(kafka_broker, monkeypatch):
    """A removed pipeline's telemetry clients do not stay open for the code server's life: a tick closes the
    clients idle past IDLE_CLIENTS_S and keeps its own; a pipeline that comes back connects afresh."""
    servers = kafka_broker.bootstrap_servers
    _setup(servers)
    kept, removed = _resource(servers), KafkaStreamResource(bootstrap_servers=servers, topics=[TOPIC], group_id="old")
    with resources._OPEN_LOCK:
        resources._close_idle(float("inf"))  # earlier tests' clients
    removed.snapshot()
    old = next(iter(resources._OPEN.values()))
    kept.snapshot()
    assert len(resources._OPEN) == 2 and old.consumer is not None
    monkeypatch.setattr(resources, "IDLE_CLIENTS_S", 0.0)
    time.sleep(0.01)
    assert kept.snapshot().sample_lag == 0
    assert old not in resources._OPEN.values() and old.consumer is None  # closed and forgotten
    assert len(resources._OPEN) == 1
    assert removed.snapshot().sample_lag == 0  # back: new clients


def test_any_cursor_text_reads_as_a_cursor_the_sensor_can_use():
    """Property-based: whatever text sits in the sensor's cursor (another version's, a hand edit, garbage), reading
    it gives a cursor of the shapes this version writes (else a fresh one), and the snapshot arithmetic runs on it."""
    import json

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from kale_dagster.control.tick import ControlCursor

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False), st.text(max_size=3))
    values = st.recursive(
        scalars,
        lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
        max_leaves=8,
    )
    keys = st.sampled_from(["time", "offsets", "control", "warned_partitions", "other"])
    texts = st.one_of(
        st.text(max_size=30), st.dictionaries(keys, values, max_size=4).map(json.dumps), values.map(json.dumps)
    )
    raw = RawOffsets(100.0, (PartitionOffsets(0, 5, 5),), ("t",), (None,))

    @settings(max_examples=150, deadline=None)
    @given(texts)
    def check(text):
        cursor = StreamMetricsCursor.from_json(text)
        assert cursor.valid()
        build_snapshot(raw, cursor.previous())
        ControlCursor.from_dict(cursor.control)  # a control part of another shape starts fresh

    check()
    good = StreamMetricsCursor(
        time=50.0, offsets={"t": {"0": [3, None]}}, control={"predictions": [[1.0, 2.0]], "recorded_at": None}
    )
    assert StreamMetricsCursor.from_json(good.to_json()) == good  # what this version writes reads back as written


@pytest.mark.parametrize(
    "stamp_ms",
    [1, 4_000_000_000_000],  # a millisecond after the epoch; a stamp in 2096
    ids=["epoch", "future"],
)
def test_a_record_whose_timestamp_cannot_be_used_leaves_the_time_lag_incomplete_not_made_up(kafka_broker, stamp_ms):
    """On the broker: partition 0's oldest unconsumed record carries a bad stamp, partition 1's a real one."""
    servers = kafka_broker.bootstrap_servers
    _setup(servers, partitions=2)
    producer = KafkaProducer(bootstrap_servers=servers, batch_size=0, linger_ms=0)
    producer.send(TOPIC, value=b"x" * 16, partition=0, timestamp_ms=stamp_ms)
    producer.send(TOPIC, value=b"x" * 16, partition=1)
    producer.flush()
    producer.close()
    time.sleep(1.0)
    snap = _resource(servers).snapshot()
    assert snap.sample_lag == 2  # the backlog is counted whatever its stamps say
    assert not snap.time_lag_complete and snap.unusable_stamps == 1
    assert 0.5 < snap.time_lag_s < 60  # partition 1's real age: neither decades nor nothing
