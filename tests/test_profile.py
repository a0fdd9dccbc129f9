"""``kale trainer profile``: the pipeline's trainer measured at a few worker counts, on the records its topic holds,
in a consumer group of its own, each count's capacity written where the throughput model and the report read it."""

from __future__ import annotations

import pandas as pd
import pytest

from kale_dagster.stream.history import MetricsHistory
from kale_dagster.stream.producer import ReplaySettings, replay
from support import committed_offsets

LOCATION = """
from kale_dagster import KafkaSource, Limits, OnlineTrainingPipeline, build_definitions

defs = build_definitions(
    OnlineTrainingPipeline(
        name="ctr",
        source=KafkaSource({servers!r}, ("clicks",), "their-trainer"),
        limits=Limits(min_workers=1, max_workers=4),
        history_url={url!r},
    )
)
"""


def _location(kafka_broker, tmp_path, records: float) -> tuple[str, str]:
    """A code location declaring ``ctr`` over a topic holding about ``records`` records; its file and history."""
    servers = kafka_broker.bootstrap_servers
    trace = pd.DataFrame({"timestamp": pd.date_range("2026-01-01", periods=2, freq="1min", tz="UTC"), "rate": records})
    replay(servers, trace, ReplaySettings(topic="clicks", partitions=4, speedup=60.0), max_wall_s=30)
    url = f"sqlite:///{tmp_path / 'metrics.db'}"
    (tmp_path / "location.py").write_text(LOCATION.format(servers=servers, url=url))
    return str(tmp_path / "location.py"), url


def _profile(location: str, *flags: str) -> int:
    from kale_dagster.cli import main

    return main(["trainer", "profile", "--pipeline", "ctr", "-f", location, "--emulate-gpu-rate", "150", *flags])


@pytest.mark.integration
def test_each_count_is_measured_on_the_backlog_and_recorded(kafka_broker, tmp_path, capsys):
    location, url = _location(kafka_broker, tmp_path, records=14_000 / 60)
    assert _profile(location, "--workers", "1,2", "--seconds", "4") == 0, capsys.readouterr().err
    measured = MetricsHistory(url).throughput("ctr")
    assert list(measured["workers"]) == [1, 2] and measured["emulated"].all()
    # Two workers capped at 150 samples/s each: the capacity, not the topic's pace.
    assert measured["samples_per_s"].to_numpy() == pytest.approx([150, 300], rel=0.2)
    assert committed_offsets(kafka_broker.bootstrap_servers, "clicks", "their-trainer", 4) == {p: 0 for p in range(4)}
    captured = capsys.readouterr()
    assert "1 worker(s): " in captured.out and "recorded in ctr's metrics history" in captured.out
    # Its consumer group deleted, or said to remain: the next profile starts from the oldest record again.
    left = captured.err
    assert left == "" or "the profile's consumer group their-trainer.kale-profile." in left


@pytest.mark.integration
def test_a_topic_that_runs_dry_is_said_and_nothing_is_recorded(kafka_broker, tmp_path, capsys):
    location, url = _location(kafka_broker, tmp_path, records=1)
    assert _profile(location, "--workers", "1", "--seconds", "3") == 2
    err = capsys.readouterr().err
    assert "at 1 worker(s) the workers waited for data" in err and "retained records ran out" in err
    assert MetricsHistory(url).throughput("ctr").empty


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--workers", "0,2"], "worker counts are 1 or more"),
        (["--workers", "two"], "not comma-separated worker counts"),
        (["--workers", "2,8"], "--workers 8 is more than ctr's max_workers (4)"),
    ],
)
def test_counts_it_cannot_measure_are_refused(tmp_path, capsys, flags, says):
    (tmp_path / "location.py").write_text(LOCATION.format(servers="127.0.0.1:9", url=f"sqlite:///{tmp_path}/m.db"))
    try:
        code = _profile(str(tmp_path / "location.py"), *flags)
    except SystemExit as exc:  # argparse's refusal
        code = exc.code
    assert code == 2 and says in capsys.readouterr().err
