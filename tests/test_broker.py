"""The embedded broker: lifecycle, errors, and a produce/consume round trip with a consumer group."""

from __future__ import annotations

import subprocess
import sys

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from kale_dagster.stream.broker import (
    FAST_GROUP_SESSION_TIMEOUT_MS,
    BrokerError,
    embedded_broker,
    find_tansu_binary,
    start_broker,
)

pytestmark = pytest.mark.integration


def test_context_manager_always_stops_the_broker():
    with pytest.raises(RuntimeError, match="boom"):
        with embedded_broker() as broker:
            process = broker.process
            assert broker.is_running()
            raise RuntimeError("boom")
    assert process.poll() is not None


def test_missing_binary_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("KALE_TANSU_BIN", str(tmp_path / "nope"))
    with pytest.raises(BrokerError, match="KALE_TANSU_BIN"):
        find_tansu_binary()


def test_port_in_use_is_reported(kafka_broker):
    with pytest.raises(BrokerError, match=f"port {kafka_broker.port}"):
        start_broker(port=kafka_broker.port, ready_timeout=5)


def test_group_commits_are_read_back_exactly(kafka_broker):
    servers = kafka_broker.bootstrap_servers
    admin = KafkaAdminClient(bootstrap_servers=servers)
    admin.create_topics([NewTopic("samples", num_partitions=3, replication_factor=1)])
    producer = KafkaProducer(bootstrap_servers=servers)
    sent = {0: 7, 1: 11, 2: 5}
    for partition, count in sent.items():
        for i in range(count):
            producer.send("samples", value=f"{partition}-{i}".encode(), partition=partition)
    producer.flush()
    producer.close()

    consumer = KafkaConsumer(
        "samples",
        bootstrap_servers=servers,
        group_id="trainer",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=FAST_GROUP_SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=1000,
    )
    received: dict[int, list[bytes]] = {p: [] for p in sent}
    while sum(map(len, received.values())) < sum(sent.values()):
        for tp, records in consumer.poll(timeout_ms=1000).items():
            received[tp.partition].extend(r.value for r in records)
    # Commit a known position that differs per partition, not just "the end".
    consumer.commit({TopicPartition("samples", 0): _offset(4), TopicPartition("samples", 1): _offset(11)})
    consumer.close()

    assert received[1] == [f"1-{i}".encode() for i in range(11)]
    committed = admin.list_group_offsets("trainer")["trainer"]
    admin.close()
    assert {tp.partition: meta.offset for tp, meta in committed.items()} == {0: 4, 1: 11}


def _offset(offset: int):
    from kafka.structs import OffsetAndMetadata

    return OffsetAndMetadata(offset, "", -1)


def test_cli_help_lists_subcommands():
    out = subprocess.run(
        [sys.executable, "-m", "kale_dagster.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "broker" in out


@pytest.mark.parametrize(
    "command",
    [
        ["broker"],
        ["demo"],
        ["forecast"],
        ["produce"],
        ["backtest"],
        ["trace", "synth"],
        ["k8s", "render"],
        ["trainer", "serve"],
    ],
)
def test_every_command_help_shows_defaults_and_an_example(command):
    from kale_dagster.cli import COMMANDS, build_parser

    parser = build_parser(COMMANDS)
    for word in command:  # walk down to the subcommand's own parser
        parser = next(a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction)).choices[
            word
        ]
    text = parser.format_help()
    assert f"example: kale {command[0]}" in text or "example: kale trace synth" in text
    assert "default" in text


def test_cli_version():
    from importlib.metadata import version

    out = subprocess.run(
        [sys.executable, "-m", "kale_dagster.cli", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == f"kale-dagster {version('kale-dagster')}"
