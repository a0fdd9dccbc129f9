"""A user's own trainer, declared by import path, under the harness and the local launcher, on the embedded
broker: the example demand regressor (JSON records, its own model and producer) across planned rescales and
a crash, and trainers that fail (a factory that raises, a loss that turns NaN, a decode that refuses every
record), each reported in one line with nothing checkpointed or committed past it."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from kale_dagster import KafkaSource
from kale_dagster.launchers import LocalLauncher, TrainerSettings
from kale_dagster.stream.producer import ensure_topic
from kale_dagster.trainer import TrainerSpec
from kale_dagster.trainer.checkpoint import list_checkpoints, load_latest
from support import committed_offsets, end_offsets, trained_samples, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "demand_forecaster" / "src"
TOPIC, PARTITIONS = "demand", 3


@pytest.fixture(autouse=True)
def user_code_on_the_path(monkeypatch):
    """The workers import the user's module by its path, as they would from the user's installed package."""
    paths = [str(EXAMPLE), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    monkeypatch.syspath_prepend(str(EXAMPLE))


def _settings(servers: str, tmp_path: Path, trainer: str, **options) -> TrainerSettings:
    return TrainerSettings(
        KafkaSource(servers, (TOPIC,), "demand"),
        str(tmp_path / "ckpt"),
        batch_size=32,
        emulate_gpu_rate=120,
        checkpoint_every_s=2.0,
        metrics_every_s=1.0,
        trained_log=str(tmp_path / "trained"),
        collective_timeout_s=15,
        trainer=TrainerSpec(trainer, options),
        pipeline="demand",
    )


def _producing(servers: str, seconds: float, rate: float = 150.0) -> threading.Thread:
    from demand_forecaster.produce import produce

    ensure_topic(servers, TOPIC, PARTITIONS)
    thread = threading.Thread(target=produce, args=(servers, TOPIC, rate, seconds), daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_the_example_trainer_rescales_and_survives_a_crash_losing_nothing(kafka_broker, tmp_path):
    servers = kafka_broker.bootstrap_servers
    (tmp_path / "trained").mkdir()
    producer = _producing(servers, seconds=24.0)
    launcher = LocalLauncher(_settings(servers, tmp_path, "demand_forecaster.train:make_trainer", lr=0.02), pool_size=2)
    metrics: list[float] = []
    crash_repeats = 0
    try:
        launcher.start(2)

        def sample_metric(seconds: float) -> None:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                status = launcher.status()
                if status.metric is not None:
                    assert status.metric_name == "mae"
                    metrics.append(status.metric)
                time.sleep(0.5)

        sample_metric(5)
        launcher.rescale(3, reason="planned up")
        sample_metric(5)
        launcher.rescale(1, reason="planned down")
        sample_metric(4)
        # A crash: kill rank 0 without warning; the launcher restarts the group from the last checkpoint.
        before = len(trained_samples(tmp_path / "trained"))
        # Up to here only planned rescales: nothing repeated (rows still in a worker's write buffer aside).
        rows = np.concatenate(
            [
                np.frombuffer(f.read_bytes()[: f.stat().st_size // 24 * 24], np.int64)
                for f in (tmp_path / "trained").glob("*.bin")
            ]
        ).reshape(-1, 3)
        planned_repeats = len(rows) - len(np.unique(rows[:, :2], axis=0))
        assert planned_repeats == 0, planned_repeats
        os.killpg(launcher._group[0].proc.pid, signal.SIGKILL)
        wait_for(lambda: launcher.supervise_once() is not None, 30, "the crash-restart")
        producer.join()
        ends = end_offsets(servers, TOPIC, PARTITIONS)
        wait_for(
            lambda: (
                launcher.supervise_once() is None and committed_offsets(servers, TOPIC, "demand", PARTITIONS) == ends
            ),
            90,
            "every offset committed",
        )
        sample_metric(1)
        crash_repeats = len(trained_samples(tmp_path / "trained")) - before
    finally:
        launcher.stop()
    trained = trained_samples(tmp_path / "trained")
    keys, counts = np.unique(trained[:, :2], axis=0, return_counts=True)
    produced = sum(ends.values())
    assert len(keys) == produced, f"{produced - len(keys)} of {produced} observations never trained"
    repeated = int((counts - 1).sum())
    print(
        f"{produced} observations; {len(rows)} trained before the crash, repeated {planned_repeats}; "
        f"in all repeated {repeated} (the crash); MAE {metrics[0]:.2f} -> {metrics[-1]:.2f}"
    )
    print(
        "restarts: "
        + ", ".join(f"{r.reason} {r.from_workers}->{r.to_workers} {r.downtime_s:.1f} s" for r in launcher.records)
    )
    # Planned rescales repeat nothing; the crash at most what was trained since the last checkpoint (2 s at
    # 120 samples/s, plus the batch in flight).
    assert repeated <= 2.0 * 120 + 64, repeated
    assert [r.reason for r in launcher.records][:3] == ["start", "planned up", "planned down"]
    assert metrics[-1] < 0.7 * metrics[0], metrics  # the model learns: its progressive MAE falls
    state = load_latest(tmp_path / "ckpt")
    assert state is not None and state["world"] == 1 and crash_repeats >= 0


def test_a_factory_that_raises_is_one_line_and_no_crash_loop(kafka_broker, tmp_path):
    servers = kafka_broker.bootstrap_servers
    ensure_topic(servers, TOPIC, PARTITIONS)
    launcher = LocalLauncher(_settings(servers, tmp_path, "user_trainers:raising"), pool_size=1)
    try:
        with pytest.raises(RuntimeError) as err:
            launcher.start(1)
        assert str(err.value) == (
            "the trainer failed: user_trainers:raising raised RuntimeError: the feature store is unreachable"
        )
    finally:
        launcher.stop()
    assert not list_checkpoints(tmp_path / "ckpt")


def test_a_factory_path_that_does_not_resolve_in_the_workers_is_one_line(kafka_broker, tmp_path):
    servers = kafka_broker.bootstrap_servers
    ensure_topic(servers, TOPIC, PARTITIONS)
    launcher = LocalLauncher(_settings(servers, tmp_path, "user_trainers:no_such_factory"), pool_size=1)
    try:
        with pytest.raises(RuntimeError, match="the trainer failed: trainer: user_trainers:no_such_factory: .* has no"):
            launcher.start(1)
    finally:
        launcher.stop()


def test_a_nan_loss_stops_the_group_before_its_step_and_nothing_is_committed_past_it(kafka_broker, tmp_path):
    import pandas as pd

    from kale_dagster.stream.producer import ReplaySettings, replay

    servers = kafka_broker.bootstrap_servers
    (tmp_path / "trained").mkdir()
    history = pd.DataFrame({"timestamp": pd.date_range("2026-01-01", periods=2, freq="1min", tz="UTC"), "rate": 1000.0})
    replay(servers, history, ReplaySettings(topic=TOPIC, partitions=PARTITIONS), max_wall_s=4.0)
    launcher = LocalLauncher(_settings(servers, tmp_path, "user_trainers:nan_after", steps=30), pool_size=0)
    try:
        launcher.start(2)
        wait_for(lambda: launcher.supervise_once() is None and launcher.status().failed, 60, "the group to fail")
        status = launcher.status()
        assert "the trainer failed: user_trainers:nan_after: the loss is not finite at step" in status.failed
        assert launcher.supervise_once() is None and launcher.records[-1].reason == "start"  # not restarted
        state = load_latest(tmp_path / "ckpt")
        # Each rank's loss turns NaN after its 30th call (about 8 s at 120 samples/s each), a step or two later when
        # a rank's batch was empty at some step; checkpoints every 2 s, none at or past the failed step.
        failed_step = int(re.search(r"not finite at step (\d+)", status.failed).group(1))
        assert failed_step > 30 and state is not None and 0 < state["step"] < failed_step, (failed_step, state["step"])
        committed = committed_offsets(servers, TOPIC, "demand", PARTITIONS)
        checkpointed = state["offsets"] if state else {}
        assert all(committed[p] <= checkpointed.get(p, 0) for p in committed), (committed, checkpointed)
    finally:
        launcher.stop()


def test_a_decode_that_refuses_every_record_counts_them_and_trains_nothing(kafka_broker, tmp_path):
    servers = kafka_broker.bootstrap_servers
    (tmp_path / "trained").mkdir()
    _producing(servers, seconds=3.0).join()
    launcher = LocalLauncher(_settings(servers, tmp_path, "user_trainers:refuses_everything"), pool_size=0)
    try:
        launcher.start(1)
        wait_for(lambda: launcher.status().poison_records >= 300, 30, "the refused records counted")
        assert not launcher.status().failed and len(trained_samples(tmp_path / "trained")) == 0
        log = next((tmp_path / "ckpt" / "logs").glob("worker-*.log")).read_text()
        assert "user_trainers:refuses_everything's decode refused in demand[" in log
        assert "schema v2 expected" in log
    finally:
        launcher.stop()
