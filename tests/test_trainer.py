"""Trainer pieces: checkpoints, balancing, samples; and the reliability of rescales and crashes end to end."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pandas as pd
import pytest
import torch

from kale_dagster import KaleConfigError
from kale_dagster.launchers import LocalLauncher, TrainerSettings
from kale_dagster.stream.producer import ReplaySettings, ensure_topic, replay
from kale_dagster.stream.samples import RECORD_SIZE, GroundTruth, decode, encode, partition_weights
from kale_dagster.stream.source import KafkaSource
from kale_dagster.trainer.balance import AcceptState, assign_by_rate, forwarding_plan, round_robin
from kale_dagster.trainer.checkpoint import CheckpointWriteError, list_checkpoints, load_latest, save_atomic
from kale_dagster.trainer.metrics import RollingAUC
from kale_dagster.trainer.ordering import ArrivalOrder
from support import S3_BUCKET, committed_offsets, end_offsets, trained_samples, trained_seqs, wait_for


def test_checkpoint_is_atomic_and_pruned(tmp_path):
    for step in (1, 2, 3, 4):
        save_atomic(tmp_path, step, {"step": step, "w": torch.ones(3) * step}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-000000000003.pt", "ckpt-000000000004.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-000000000003.json",
        "ckpt-000000000003.pt",
        "ckpt-000000000004.json",
        "ckpt-000000000004.pt",
    ]
    # A half-written file is never a candidate, nor is data whose manifest was never written...
    (tmp_path / "ckpt-000000000009.pt.tmp").write_bytes(b"\x80\x02partial")
    (tmp_path / "ckpt-000000000008.pt").write_bytes(b"\x80\x02written, manifest never")
    # ...and a complete one whose data does not match its manifest is skipped for the previous good one.
    save_atomic(tmp_path, 5, {"step": 5}, keep=10)
    (tmp_path / "ckpt-000000000005.pt").write_bytes(b"not a checkpoint")
    assert load_latest(tmp_path)["step"] == 4
    assert load_latest(tmp_path / "missing") is None
    # The next checkpoint prunes the data that never got a manifest (older than it), never a newer write's.
    (tmp_path / "ckpt-000000000006.pt").write_bytes(b"\x80\x02an upload cut off before its manifest")
    save_atomic(tmp_path, 7, {"step": 7}, keep=10)
    assert not (tmp_path / "ckpt-000000000006.pt").exists() and (tmp_path / "ckpt-000000000008.pt").exists()
    assert load_latest(tmp_path)["step"] == 7


def test_a_checkpoint_that_cannot_be_written_says_why_and_leaves_the_last_one(tmp_path):
    save_atomic(tmp_path, 1, {"step": 1})
    (tmp_path / "ckpt-000000000002.pt.tmp").symlink_to("/dev/full")  # every write: ENOSPC, as on a full volume
    with pytest.raises(CheckpointWriteError, match=r"No space left on device; ckpt-000000000001.pt stays the latest"):
        save_atomic(tmp_path, 2, {"step": 2})
    assert not (tmp_path / "ckpt-000000000002.pt.tmp").exists()  # the partial file is gone
    assert load_latest(tmp_path)["step"] == 1


def test_a_read_only_volume_says_so_and_is_not_a_crash(tmp_path, monkeypatch):
    import errno
    import os

    save_atomic(tmp_path, 1, {"step": 1})

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr("builtins.open", refuse)  # the volume turned read-only: every write and unlink is refused
    monkeypatch.setattr(os, "unlink", refuse)
    with pytest.raises(CheckpointWriteError, match=r"Read-only file system; ckpt-000000000001.pt stays the latest"):
        save_atomic(tmp_path, 2, {"step": 2})
    monkeypatch.undo()
    assert load_latest(tmp_path)["step"] == 1


@pytest.mark.parametrize(
    "rates, workers, expected",
    [
        ({0: 50.0, 1: 10.0, 2: 10.0, 3: 10.0, 4: 10.0, 5: 10.0}, 2, [[0], [1, 2, 3, 4, 5]]),
        ({0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}, 2, [[0, 2], [1, 3]]),
        ({0: 5.0, 1: 4.0, 2: 3.0}, 4, [[0], [1], [2], []]),
    ],
)
def test_assign_by_rate(rates, workers, expected):
    assert assign_by_rate(rates, workers) == expected


def test_round_robin_ignores_rates():
    assert round_robin([3, 0, 1, 2], 2) == [[0, 2], [1, 3]]


def test_accept_state_hysteresis():
    s = AcceptState(high=10, low=4)
    assert [s.update(n) for n in (0, 9, 10, 7, 5, 3, 8)] == [True, True, False, False, False, True, True]


@pytest.mark.parametrize(
    "own, total, accepting, high, expected_moved",
    [
        ([30, 0, 0], [30, 0, 0], [True, True, True], 10, 20),  # overflow 20, room 10 + 10
        ([30, 0, 5], [30, 0, 5], [True, False, True], 10, 5),  # only rank 2 accepts, with room 5
        ([12, 0], [12, 9], [True, True], 10, 1),  # room of 1 on the receiver
        ([5, 5], [5, 5], [True, True], 10, 0),  # nobody above high
        ([30, 0], [40, 0], [True, True], 10, 10),  # forwarded samples (total - own) are never sent on
    ],
)
def test_forwarding_plan(own, total, accepting, high, expected_moved):
    plan = forwarding_plan(own, total, accepting, high, seed=1)
    assert sum(n for _, _, n in plan) == expected_moved
    for src, dst, n in plan:
        assert accepting[dst] and src != dst and n > 0
        assert total[dst] + sum(m for s, d, m in plan if d == dst) <= high
    assert plan == forwarding_plan(own, total, accepting, high, seed=1)  # same on every rank


# Each row: polls in order, as (delivered {partition: newest timestamp ms}, backlogged partitions, monotonic s);
# the partitions held back after the last one.  Lead 1,000 ms, stall 2 s.
@pytest.mark.parametrize(
    "polls, held",
    [
        pytest.param([({0: 10_000, 1: 1_000}, {0, 1}, 0.0)], {0}, id="ahead by more than the lead: held"),
        pytest.param([({0: 1_900, 1: 1_000}, {0, 1}, 0.0)], set(), id="within the lead: free"),
        pytest.param(
            [({0: 10_000, 1: 1_000}, {0}, 0.0)], set(), id="the one behind has caught up: it holds nothing back"
        ),
        pytest.param(
            [({0: 5_000}, {0, 1}, 0.0)],
            {0},
            id="a backlogged partition that delivered nothing yet is the furthest behind",
        ),
        pytest.param(
            [({0: 5_000}, {0, 1}, 0.0), ({1: 4_500}, {0, 1}, 0.1)],
            set(),
            id="the laggard caught up to within the lead: resumed",
        ),
        pytest.param(
            [({0: 5_000, 1: 1_000, 2: 9_000}, {0, 1, 2}, 0.0), ({1: 4_200}, {0, 1, 2}, 0.1)],
            {2},
            id="the frontier moves with the laggard: one still ahead stays held",
        ),
        pytest.param(
            [({0: 5_000}, {0, 1}, 0.0), ({}, {0, 1}, 1.0), ({}, {0, 1}, 3.0)],
            set(),
            id="a laggard that delivers nothing for the stall time stops holding the rank back",
        ),
        pytest.param(
            [({0: 5_000}, {0, 1}, 0.0), ({}, {0, 1}, 1.0), ({}, {0, 1}, 3.0), ({1: 1_000}, {0, 1}, 3.5)],
            {0},
            id="a stalled laggard that delivers again counts again",
        ),
        pytest.param(
            [({0: 5_000}, {0, 1}, 0.0), ({}, {0, 1}, 1.0), ({}, {0, 1}, 2.9)], {0}, id="a short wait is no stall"
        ),
        pytest.param(
            [({0: 5_000, 1: 1_000}, {0, 1}, 0.0), ({0: 4_000}, {0, 1}, 0.1)],
            {0},
            id="an out-of-order timestamp never moves a partition back",
        ),
    ],
)
def test_arrival_order_holds_back_the_partitions_ahead(polls, held):
    order = ArrivalOrder(lead_ms=1_000, stall_s=2.0)
    for delivered, backlogged, now in polls:
        result = order.polled(delivered, backlogged, now)
    assert result == held


@pytest.mark.parametrize("lead_ms, stall_s", [(-1, 1.0), (0, 0.0)])
def test_arrival_order_rejects_a_negative_lead_or_no_stall_time(lead_ms, stall_s):
    with pytest.raises(ValueError, match="lead_ms >= 0 and stall_s > 0"):
        ArrivalOrder(lead_ms=lead_ms, stall_s=stall_s)


def test_samples_round_trip_and_learnable_labels():
    rng = np.random.default_rng(0)
    records = GroundTruth().sample(5000, rng)
    values = encode(records)
    assert all(len(v) == RECORD_SIZE for v in values)
    samples, counts = decode(values)
    assert (samples == records).all() and (counts == 1).all()
    packed = encode(records, samples_per_record=16)  # micro-batches; the last one is short
    assert len(packed) == 313 and len(packed[-1]) == 8 * RECORD_SIZE
    samples, counts = decode(packed)
    assert (samples == records).all() and counts.sum() == 5000 and counts[-1] == 8
    # The hidden model makes labels predictable: its own logit ranks them well.
    assert 0.05 < records["label"].mean() < 0.6
    # Poison records (not whole samples, a label that is not 0/1, a NaN feature) carry no sample and are skipped.
    nan = records[:1].copy()
    nan["dense"][0, 3] = np.nan
    label = records[1:2].copy()
    label["label"] = 7
    samples, counts = decode(
        [b"short", values[0], nan.tobytes(), label.tobytes(), b"", None, packed[0]]
    )  # None: a tombstone
    assert list(counts) == [0, 1, 0, 0, 0, 0, 16] and (samples == np.concatenate([records[:1], records[:16]])).all()
    assert np.allclose(partition_weights(4, 0.5), [0.5, 1 / 6, 1 / 6, 1 / 6])


def test_rolling_auc():
    auc = RollingAUC(window=100)
    auc.add(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1]))
    assert auc.value() == pytest.approx(0.75)


def _train_through(
    kafka_broker,
    tmp_path,
    scenario,
    produce_s: float,
    restore_s: float = 0.0,
    checkpoint_dir: str | None = None,
    start: int = 2,
):
    """Replay ``produce_s`` seconds of samples (4 partitions, 3 samples per record, a hot partition) into a
    trainer that ``scenario(launcher, trained)`` rescales and crashes (``trained()``: the samples checkpointed so
    far; each group restoring for ``restore_s``); once the
    group has caught up, the samples trained (from every worker's accounting log), the produced count, and the
    launcher's records.  Asserts that every produced sample was trained."""
    # Three samples per record (batches of 64 split records), so a checkpoint
    # can fall inside a record: resuming must still lose no sample of it.
    servers, topic, partitions, per_record = kafka_broker.bootstrap_servers, "samples", 4, 3
    logs = tmp_path / "trained"
    logs.mkdir()
    history = pd.DataFrame({"timestamp": pd.date_range("2026-01-01", periods=2, freq="1min", tz="UTC"), "rate": 250.0})
    stop = threading.Event()
    producer = threading.Thread(
        target=replay,
        args=(
            servers,
            history,
            ReplaySettings(topic=topic, partitions=partitions, hot_share=0.4, samples_per_record=per_record),
        ),
        kwargs=dict(stop=stop, max_wall_s=produce_s),
    )
    producer.start()
    wait_for(lambda: sum(end_offsets(servers, topic, partitions).values()), 30, "the first records", poll_s=0.1)
    settings = TrainerSettings(
        KafkaSource(servers, (topic,), "trainer"),
        checkpoint_dir or str(tmp_path / "ckpt"),
        batch_size=64,
        emulate_gpu_rate=150,
        checkpoint_every_s=2.0,
        trained_log=str(logs),
        collective_timeout_s=15,
        emulate_restore_s=restore_s,
    )
    launcher = LocalLauncher(settings, pool_size=3)
    try:
        launcher.start(start)
        scenario(launcher, lambda: len(trained_samples(logs)))
        producer.join()
        ends = end_offsets(servers, topic, partitions)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and committed_offsets(servers, topic, "trainer", partitions) != ends:
            time.sleep(1.0)
            launcher.supervise_once()
        assert committed_offsets(servers, topic, "trainer", partitions) == ends
    finally:
        stop.set()
        launcher.stop()
    trained = trained_samples(logs)
    unique = {(int(p), int(o)) for p, o, _ in trained}
    missing = [(p, o) for p, end in ends.items() for o in range(end) if (p, o) not in unique]
    assert not missing, f"{len(missing)} produced records never trained, e.g. {missing[:5]}"
    produced = sum(ends.values()) * per_record  # sequence numbers 0 .. produced-1, one per sample
    seqs = np.unique(trained_seqs(logs, servers, topic))
    assert len(seqs) == produced and seqs[0] == 0 and seqs[-1] == produced - 1, (
        f"{produced - len(seqs)} produced samples never trained"
    )
    assert all(r.downtime_s < 30 for r in launcher.records)
    return trained, produced, launcher.records


#: Samples a group trains and checkpoints before the next change (2 workers at 150/s: about two checkpoints' worth).
TRAIN_BETWEEN = 600


def _trains(trained, samples: int = TRAIN_BETWEEN) -> None:
    """Wait until the running group has checkpointed ``samples`` more."""
    start = trained()
    wait_for(lambda: trained() >= start + samples, 60, f"{samples} more samples trained", poll_s=0.2)


def _rescale_after_training(launcher, trained, *targets: int) -> None:
    """Each rescale once the group before it has trained (a group of 0 trains nothing: the next comes at once)."""
    for target in targets:
        if launcher.workers > 0:
            _trains(trained)
        launcher.rescale(target)


@pytest.mark.integration
@pytest.mark.slow
def test_planned_rescales_lose_nothing_and_repeat_nothing(kafka_broker, tmp_path):
    trained, produced, records = _train_through(
        kafka_broker,
        tmp_path,
        lambda launcher, trained: _rescale_after_training(launcher, trained, 3, 1, 0, 2),
        produce_s=14,
    )
    assert len(records) == 5  # start and 4 rescales, one of them a stop to zero (min_workers: 0) and back
    assert [r.to_workers for r in records] == [2, 3, 1, 0, 2] and records[3].phases.keys() == {"stop"}
    print(f"produced {produced}, trained {len(trained)}")
    assert len(trained) == produced  # every sample exactly once


@pytest.mark.integration
@pytest.mark.slow
def test_checkpoints_in_a_bucket_carry_a_group_across_rescales_and_a_crash(
    kafka_broker, tmp_path, s3_server, monkeypatch
):
    pytest.importorskip("s3fs")
    _, endpoint, client = s3_server
    # As a deployment gives them: keys and endpoint in the workers' environment, nothing in their flags.
    for name, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "FSSPEC_S3_ENDPOINT_URL": endpoint,
    }.items():
        monkeypatch.setenv(name, value)

    def two_rescales_and_a_crash(launcher, trained):
        _rescale_after_training(launcher, trained, 3, 1)  # two planned rescales
        _crash_one(launcher, trained)

    trained, produced, records = _train_through(
        kafka_broker, tmp_path, two_rescales_and_a_crash, produce_s=16, checkpoint_dir=f"s3://{S3_BUCKET}/ctr"
    )
    # Nothing lost (_train_through checks every produced sample trained), each group restored from the bucket.
    assert [r.to_workers for r in records] == [2, 3, 1, 1] and records[-1].reason.startswith("crash-restart")
    _repeated_by_a_crash(trained, produced, workers=1)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=S3_BUCKET, Prefix="ctr/")["Contents"]]
    assert len([k for k in keys if k.endswith(".json")]) == 3 and not (tmp_path / "s3:").exists()


def _crash_one(launcher, trained) -> None:
    """Once the group has trained, kill one of its workers mid-step (no checkpoint, no goodbye); the supervisor
    restarts the group from the last checkpoint."""
    _trains(trained)
    launcher._group[-1].signal(signal.SIGKILL)
    deadline = time.monotonic() + 60
    record = None
    while record is None and time.monotonic() < deadline:
        time.sleep(0.2)
        record = launcher.supervise_once()
    assert record is not None and record.reason.startswith("crash-restart")


def _repeated_by_a_crash(trained, produced: int, workers: int) -> int:
    """Samples trained twice; a crash repeats at most what its group (``workers`` at 150 samples/s) trained since
    the last checkpoint: one interval (counted from the checkpoint's end), the step under way when the interval
    ran out (the round that finds a checkpoint due starts after it), the step that round trains before it
    checkpoints, and a record's rest per partition.  Planned rescales repeat nothing (the tests above)."""
    duplicates = len(trained) - produced
    bound = workers * (150 * 2.0 + 2 * 64) + 4 * 3
    print(f"produced {produced}, trained {len(trained)}, repeated {duplicates} ({duplicates / produced:.1%}), "
          f"bound {bound:.0f}")  # fmt: skip
    assert 0 <= duplicates <= bound
    return duplicates


@pytest.mark.integration
@pytest.mark.slow
def test_rescales_and_a_crash_lose_no_sample(kafka_broker, tmp_path):
    def rescales_and_a_crash(launcher, trained):
        _rescale_after_training(launcher, trained, 3, 1, 2)
        _crash_one(launcher, trained)
        _rescale_after_training(launcher, trained, 3, 2)

    trained, produced, records = _train_through(kafka_broker, tmp_path, rescales_and_a_crash, produce_s=30)
    assert len(records) == 7  # start, 5 rescales, 1 crash restart
    _repeated_by_a_crash(trained, produced, workers=2)


@pytest.mark.integration
@pytest.mark.slow
def test_a_retarget_gives_up_a_restoring_group_and_loses_and_repeats_nothing(kafka_broker, tmp_path):
    def scale_in_met_by_a_burst(launcher, trained):
        _trains(trained)
        done = []
        rescale = threading.Thread(target=lambda: done.append(launcher.rescale(1, reason="scale in")))
        rescale.start()
        # The group of 1 has been formed and is restoring (3 s): it has trained nothing.
        wait_for(lambda: len(launcher._group) == 1 and launcher.status().rescaling, 30, "the group of 1", poll_s=0.05)
        (forming,) = launcher._group
        assert launcher.retarget(3, reason="burst")
        rescale.join(60)
        (record,) = done
        assert (record.from_workers, record.to_workers) == (2, 3) and "retargeted to 3" in record.reason
        # Killed, not waited for: its restore would hold the larger group back.
        assert forming.proc.returncode == -signal.SIGKILL
        print(f"retargeted after {record.phases['abandoned']:.1f} s of {record.downtime_s:.1f} s: {record.phases}")
        _trains(trained)

    trained, produced, records = _train_through(
        kafka_broker, tmp_path, scale_in_met_by_a_burst, produce_s=10, restore_s=3.0
    )
    assert [r.to_workers for r in records] == [2, 3]
    assert len(trained) == produced  # the killed group trained nothing: every sample exactly once


@pytest.mark.integration
def test_worker_runs_under_torchrun_and_stops_cleanly_on_sigterm(kafka_broker, tmp_path):
    """The same worker entrypoint the Kubernetes launcher runs under torchrun."""
    import os
    import subprocess
    import sys

    from kale_dagster.stream.broker import free_loopback_port
    from kale_dagster.trainer.checkpoint import load_latest

    servers = kafka_broker.bootstrap_servers
    replay(
        servers,
        pd.DataFrame({"timestamp": pd.date_range("2026-01-01", periods=2, freq="1min", tz="UTC"), "rate": 300.0}),
        ReplaySettings(topic="tr", partitions=2),
        max_wall_s=2,
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=2",
        f"--master-port={free_loopback_port()}",
        "-m",
        "kale_dagster.trainer.worker",
        "--bootstrap-servers",
        servers,
        "--topic",
        "tr",
        "--group-id",
        "g",
        "--checkpoint-dir",
        str(tmp_path),
        "--emulate-gpu-rate",
        "200",
        "--checkpoint-every-s",
        "1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and load_latest(tmp_path) is None:
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGTERM)  # as Kubernetes does on pod deletion
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # torchrun's agent re-raises the signal after its workers exit (non-zero
    # status); what matters is that every worker checkpointed and stopped.
    assert out.count('"event": "stopped"') == 2, err[-2000:]
    state = load_latest(tmp_path)
    assert state["world"] == 2 and sum(state["offsets"].values()) > 0


@pytest.mark.integration
def test_stopped_workers_return_to_the_pool_and_are_reused(kafka_broker, tmp_path):
    """A rescale reuses the stopped processes (no torch import, no teardown on the critical path);
    the pool keeps at most pool_size standbys, and stop() leaves no process behind."""
    servers = kafka_broker.bootstrap_servers
    replay(
        servers,
        pd.DataFrame({"timestamp": pd.date_range("2026-01-01", periods=2, freq="1min", tz="UTC"), "rate": 200.0}),
        ReplaySettings(topic="reuse", partitions=2),
        max_wall_s=1,
    )
    settings = TrainerSettings(
        KafkaSource(servers, ("reuse",), "g"),
        str(tmp_path / "ckpt"),
        batch_size=32,
        emulate_gpu_rate=500,
        emulate_restore_s=0.5,
    )
    launcher = LocalLauncher(settings, pool_size=1)
    seen = set()
    try:
        launcher.start(2)
        first = {w.proc.pid for w in launcher._group}
        seen |= set(launcher._group + launcher._pool)
        launcher.rescale(3)
        assert first <= {w.proc.pid for w in launcher._group}
        assert load_latest(tmp_path / "ckpt")["world"] == 2  # the stopped group checkpointed
        seen |= set(launcher._group + launcher._pool)
        launcher.rescale(1)
        assert len(launcher._pool) <= 1 and all(w.alive() for w in launcher._group + launcher._pool)
        seen |= set(launcher._group + launcher._pool)
        assert all(0.5 <= r.downtime_s < 30 for r in launcher.records)  # the emulated restore is in every (re)start
    finally:
        launcher.stop()
    for w in seen:
        w.proc.wait(15)  # released extras and the final group all exit


@pytest.mark.parametrize(
    "field, value",
    [
        ("batch_size", 0),
        ("emulate_gpu_rate", -1.0),
        ("emulate_restore_s", -1.0),
        ("balance", "random"),
        ("order_lead_s", -1.0),
    ],
)
def test_trainer_settings_errors_name_the_field(field, value):
    with pytest.raises(KaleConfigError, match=field):
        TrainerSettings(KafkaSource("127.0.0.1:9092", ("t",), "g"), "/tmp/ckpt", **{field: value})


@pytest.mark.integration
def test_standbys_cover_a_scale_up_to_max_workers_and_no_more(kafka_broker, tmp_path):
    """With max_workers, group + standbys never exceed it: a scale-up takes warm standbys and
    starts no process (one importing torch would slow the new group); a scale-in keeps the stopped ones."""
    ensure_topic(kafka_broker.bootstrap_servers, "capped", 2)
    settings = TrainerSettings(
        KafkaSource(kafka_broker.bootstrap_servers, ("capped",), "g"), str(tmp_path / "ckpt"), batch_size=32
    )
    launcher = LocalLauncher(settings, pool_size=3, max_workers=3)
    try:
        launcher.wait_warm()
        assert len(launcher._pool) == 3
        launcher.start(2)
        launcher.wait_warm()
        started = {w.proc.pid for w in launcher._group + launcher._pool}
        assert len(launcher._pool) == 1
        launcher.rescale(3)
        time.sleep(1.0)  # a refill would have started by now
        assert launcher._pool == [] and {w.proc.pid for w in launcher._group} == started
        launcher.rescale(1)
        launcher.wait_warm()
        assert len(launcher._pool) == 2 and {w.proc.pid for w in launcher._group + launcher._pool} == started
    finally:
        launcher.stop()
    with pytest.raises(KaleConfigError, match="max_workers"):
        LocalLauncher(settings, max_workers=0)


def test_the_offset_committer_commits_the_newest_offsets_in_order_and_retries():
    from kale_dagster.trainer.committer import OffsetCommitter

    attempts, gate = [], threading.Event()

    class Flaky(OffsetCommitter):
        def _commit(self, offsets):
            attempts.append(dict(offsets))
            if len(attempts) == 1:
                gate.wait(5)  # a slow broker: newer offsets arrive meanwhile
                raise ConnectionError("broker went away")

    committer = Flaky({}, "g", "t", retry_s=0.05)
    committer.submit({0: 10})
    wait_for(lambda: attempts, 5, "the first commit under way", poll_s=0.01)
    committer.submit({0: 20})  # replaces the pending one: only the newest matters
    committer.submit({0: 30})
    gate.set()
    assert committer.flush(5)
    committer.close()
    assert attempts == [{0: 10}, {0: 30}] and committer.committed == {0: 30}


@pytest.mark.integration
def test_a_backlog_over_several_partitions_is_trained_oldest_first(kafka_broker, tmp_path):
    """A worker catching up on 4 partitions trains their backlog in arrival order, not a partition at a time:
    the lag is the oldest unconsumed sample's over all partitions, so a partition left for last would age."""
    servers, topic = kafka_broker.bootstrap_servers, "ordered"
    logs = tmp_path / "trained"
    logs.mkdir()
    history = pd.DataFrame({"timestamp": pd.date_range("2026-01-01", periods=2, freq="1min", tz="UTC"), "rate": 600.0})
    produced = replay(servers, history, ReplaySettings(topic=topic, partitions=4), max_wall_s=5.0)
    settings = TrainerSettings(
        KafkaSource(servers, (topic,), "ordered"),
        str(tmp_path / "ckpt"),
        batch_size=64,
        emulate_gpu_rate=1500,
        trained_log=str(logs),
        order_lead_s=0.1,
    )
    launcher = LocalLauncher(settings, pool_size=1)
    try:
        launcher.start(1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(trained_samples(logs)) < produced:
            time.sleep(0.5)
    finally:
        launcher.stop()
    seqs = trained_seqs(logs, servers, topic)  # one rank: its log is in training order
    assert np.array_equal(np.sort(seqs), np.arange(produced))
    # How far each sample was trained from its place in arrival order, as a share of the backlog.
    displacement = np.abs(np.arange(len(seqs)) - seqs).max() / produced
    print(f"{produced} samples over 4 partitions; largest displacement from arrival order {displacement:.1%}")
    assert displacement <= 0.10
