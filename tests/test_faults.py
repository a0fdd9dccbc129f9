"""Faults injected into the running system, each recording a row of the fault table (bench/faults.py).

Real parts throughout: the embedded broker, torch workers under the local launcher, the metrics sensor
against a Dagster instance.  Each test asserts what must hold and records what it measured.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kale_dagster import KafkaSource
from kale_dagster.launchers import LocalLauncher, TrainerSettings
from kale_dagster.stream.producer import ensure_topic
from kale_dagster.stream.samples import GroundTruth, encode
from support import (
    committed_offsets,
    decision_of,
    descendants,
    end_offsets,
    prerequisite_missing,
    produce_events,
    running,
    sensor_tick,
    trained_samples,
    trained_seqs,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults]

TOPIC, PARTITIONS = "samples", 2


def produce(servers: str, n: int, start_seq: int = 0, poison: tuple = ()) -> int:
    """``n`` valid samples, one per record, over the partitions in turn, with the ``poison`` values among them;
    returns the next sequence number."""
    from kafka import KafkaProducer

    values = encode(GroundTruth().sample(n, np.random.default_rng(start_seq), start_seq=start_seq))
    for i, bad in enumerate(poison):  # spread through the stream
        values.insert((i + 1) * len(values) // (len(poison) + 1), bad)
    producer = KafkaProducer(bootstrap_servers=servers, linger_ms=5)
    for i, value in enumerate(values):
        producer.send(TOPIC, value=value, partition=i % PARTITIONS)
    producer.flush()
    producer.close()
    return start_seq + n


def trainer(servers: str, tmp_path, **overrides) -> tuple[LocalLauncher, TrainerSettings]:
    settings = TrainerSettings(
        KafkaSource(servers, (TOPIC,), "trainer"),
        str(tmp_path / "ckpt"),
        **{
            "batch_size": 64,
            "emulate_gpu_rate": 300,
            "checkpoint_every_s": 1.0,
            "trained_log": str(tmp_path / "trained"),
            "collective_timeout_s": 5,
            **overrides,
        },
    )
    (tmp_path / "trained").mkdir(exist_ok=True)
    # Worker logs beside, not on, the checkpoint volume, which the volume faults fill or remount read-only.
    return LocalLauncher(settings, pool_size=2, log_dir=tmp_path / "logs"), settings


class Feeder:
    """100 valid samples every half second, in the background, until ``stop``; ``produced`` counts them."""

    def __init__(self, servers: str):
        self.servers, self.produced, self._stop = servers, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.produced = produce(self.servers, 100, start_seq=self.produced)
            self._stop.wait(0.5)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def caught_up(launcher: LocalLauncher, servers: str, timeout: float = 90) -> None:
    ends = end_offsets(servers, TOPIC, PARTITIONS)

    def done():
        launcher.supervise_once()
        return committed_offsets(servers, TOPIC, "trainer", PARTITIONS) == ends

    wait_for(done, timeout, "the group to commit every offset")


def accounting(tmp_path, produced: int, servers: str) -> dict:
    trained = trained_seqs(tmp_path / "trained", servers, TOPIC)
    seqs = set(int(s) for s in trained)
    return {
        "produced": produced,
        "trained": len(trained),
        "lost": produced - len(seqs & set(range(produced))),
        "duplicated": len(trained) - len(seqs),
    }


def test_poison_records_are_skipped_counted_and_do_not_stop_their_partition(kafka_broker, tmp_path, fault_record):
    servers = kafka_broker.bootstrap_servers
    ensure_topic(servers, TOPIC, PARTITIONS)
    nan = GroundTruth().sample(1, np.random.default_rng(1))
    nan["dense"][0, 0] = np.nan
    poison = (b"not a sample", b"", nan.tobytes(), b"\x00" * 31, b'{"json": true}', nan.tobytes() * 2)
    produced = produce(servers, 900, poison=poison)
    launcher, _ = trainer(servers, tmp_path)
    try:
        launcher.start(2)
        caught_up(launcher, servers)
        skipped = wait_for(lambda: launcher.status().poison_records, 30, "the workers to report skipped records")
        restarts = [r for r in launcher.records if r.reason.startswith("crash-restart")]
    finally:
        launcher.stop()
    figures = accounting(tmp_path, produced, servers)
    survived = skipped == len(poison) and not restarts and figures["lost"] == 0 and figures["duplicated"] == 0
    fault_record(
        fault=f"poison records ({len(poison)} kinds among {produced} samples)",
        injected=len(poison),
        survived=int(survived),
        **figures,
    )
    assert skipped == len(poison) and not restarts  # counted, and no crash loop
    assert figures["lost"] == 0 and figures["duplicated"] == 0, figures


def test_a_hung_worker_trips_the_collective_timeout_and_the_group_restarts_from_its_checkpoint(
    kafka_broker, tmp_path, fault_record
):
    servers = kafka_broker.bootstrap_servers
    ensure_topic(servers, TOPIC, PARTITIONS)
    launcher, settings = trainer(servers, tmp_path)
    feeder = Feeder(servers)
    try:
        launcher.start(2)
        feeder.start()
        time.sleep(4.0)
        hung = launcher._group[1]
        os.kill(hung.proc.pid, signal.SIGSTOP)  # alive, holding its rank, answering nothing
        injected_at = time.monotonic()
        record = wait_for(launcher.supervise_once, 60, "the group to restart after the collective timeout")
        recovery_s = time.monotonic() - injected_at
        time.sleep(3.0)
        feeder.stop()
        caught_up(launcher, servers)
    finally:
        feeder.stop()
        launcher.stop()
    figures = accounting(tmp_path, feeder.produced, servers)
    # What a crash may repeat: what the group trained since its last checkpoint (an interval and a step).
    bound = (
        2 * settings.emulate_gpu_rate * (settings.checkpoint_every_s + settings.batch_size / settings.emulate_gpu_rate)
    )
    survived = record.reason.startswith("crash-restart") and figures["lost"] == 0 and figures["duplicated"] <= bound
    fault_record(
        fault="one worker hung (SIGSTOP on rank 1)",
        injected=1,
        survived=int(survived),
        recovery_s=round(recovery_s, 1),
        **figures,
    )
    assert record.reason.startswith("crash-restart"), record
    assert recovery_s < settings.collective_timeout_s + 30
    assert figures["lost"] == 0 and figures["duplicated"] <= bound, (figures, bound)


def test_a_locked_metrics_history_skips_the_tick_and_the_next_one_recovers(controlled, tmp_path, fault_record):
    import sqlite3

    from dagster import SkipReason

    env = controlled
    produce_events(env["servers"], 40)
    first = sensor_tick(env)
    lock = sqlite3.connect(tmp_path / "m.db", isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")  # another writer holds the database
    time.sleep(0.5)
    produce_events(env["servers"], 40)
    skipped = sensor_tick(env, first.cursor)
    lock.execute("ROLLBACK")
    lock.close()
    released_at = time.monotonic()
    recovered = sensor_tick(env, first.cursor)  # the kept cursor: rates over the longer interval, then a decision
    recovery_s = time.monotonic() - released_at
    decision = decision_of(recovered)
    survived = isinstance(skipped, SkipReason) and decision["workers"] == 3 and "held" not in decision
    fault_record(
        fault="metrics history locked by another writer (SQLite)",
        injected=1,
        survived=int(survived),
        recovery_s=round(recovery_s, 1),
    )
    assert isinstance(skipped, SkipReason)
    assert skipped.skip_message.startswith("the metrics history did not answer (OperationalError: database is locked)")
    assert "nothing decided" in skipped.skip_message
    assert decision["workers"] == 3 and "held" not in decision


FREEZE_S = 60.0  # spans many sensor ticks, six of the workers' 10 s request timeouts, and the committer's retries


def test_a_broker_frozen_for_a_minute_skips_ticks_holds_and_training_loses_nothing(
    controlled, kafka_broker, tmp_path, fault_record
):
    """One freeze, both sides of it: the metrics sensor (stand-in workers behind the trainer service) and real torch
    workers training from the same broker."""
    from dagster import SkipReason

    from kale_dagster.stream.history import MetricsHistory

    env, servers = controlled, kafka_broker.bootstrap_servers
    ensure_topic(servers, TOPIC, PARTITIONS)
    produced = produce(servers, 1500)
    (tmp_path / "training").mkdir()
    launcher, _ = trainer(servers, tmp_path / "training")
    try:
        launcher.start(2)
        produce_events(servers, 40)
        first = sensor_tick(env)
        time.sleep(0.5)
        produce_events(servers, 40)
        second = sensor_tick(env, first.cursor)
        before = decision_of(second)
        history = MetricsHistory(env["p"].history_url)
        rows_before = len(history.stream("ctl"))
        os.kill(kafka_broker.process.pid, signal.SIGSTOP)
        try:
            frozen_at, skips = time.monotonic(), []
            while time.monotonic() - frozen_at < FREEZE_S:
                skips.append(sensor_tick(env, second.cursor))
        finally:
            os.kill(kafka_broker.process.pid, signal.SIGCONT)
        resumed_at = time.monotonic()
        rows_during = len(history.stream("ctl"))
        produce_events(servers, 40)
        after = sensor_tick(env, second.cursor)
        sensor_recovery_s = time.monotonic() - resumed_at
        produced = produce(servers, 1500, start_seq=produced)
        caught_up(launcher, servers)
        training_recovery_s = time.monotonic() - resumed_at
        restarts = [r.reason for r in launcher.records if r.reason.startswith("crash-restart")]
    finally:
        launcher.stop()
    decision = decision_of(after)
    skipped = all(isinstance(s, SkipReason) and s.skip_message.startswith("could not read the stream") for s in skips)
    survived = (
        skipped and rows_during == rows_before and decision["workers"] >= before["workers"] and "held" not in decision
    )
    fault_record(
        fault=f"broker frozen (SIGSTOP) {FREEZE_S:.0f} s: sensor",
        injected=len(skips),
        survived=int(survived),
        recovery_s=round(sensor_recovery_s, 1),
    )
    figures = accounting(tmp_path / "training", produced, servers)
    fault_record(
        fault=f"broker frozen (SIGSTOP) {FREEZE_S:.0f} s: training",
        injected=1,
        survived=int(figures["lost"] == 0 and figures["duplicated"] == 0 and not restarts),
        recovery_s=round(training_recovery_s, 1),
        **figures,
    )
    assert skips and skipped, [getattr(s, "skip_message", s) for s in skips]
    assert rows_during == rows_before  # no reading invented while the broker was silent
    assert (
        decision["workers"] >= before["workers"] and "held" not in decision
    )  # no scale-in on missing data; decides again at once
    # Offsets are committed off the training thread: a silent broker stalls no collective, so the group never restarts.
    assert not restarts
    assert figures["lost"] == 0 and figures["duplicated"] == 0, figures


@pytest.fixture
def small_volume(tmp_path):
    """A 40 MB tmpfs for the checkpoints, so that the test can fill it or remount it read-only; skipped where
    mounting is not allowed."""
    mount = tmp_path / "ckpt"
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        prerequisite_missing(
            f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}); needs root in a mount namespace"
        )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(volume: Path) -> Callable[[], None]:
    # Written until the volume refuses, not to a size read beforehand: a checkpoint being written meanwhile
    # takes space between the two, and what its failed write frees again is less than a checkpoint.
    filler = volume / "filler"
    with open(filler, "wb", buffering=0) as out:
        for chunk in (1 << 20, 4096):
            try:
                while True:
                    out.write(b"\0" * chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    return filler.unlink


def _make_read_only(volume: Path) -> Callable[[], None]:
    # A remount refuses writes even to root, as a volume the kernel or the storage driver turned read-only does.
    # It is refused (busy) while a checkpoint is being written: retried until it lands between two writes.
    wait_for(
        lambda: subprocess.run(["mount", "-o", "remount,ro", str(volume)], capture_output=True).returncode == 0,
        10,
        "a read-only remount between two checkpoint writes",
        poll_s=0.02,
    )
    return lambda: subprocess.run(["mount", "-o", "remount,rw", str(volume)], check=True)


@pytest.mark.parametrize(
    "fault, inject, message",
    [
        ("checkpoint volume full", _fill, "No space left on device"),
        ("checkpoint volume turned read-only", _make_read_only, "Read-only file system"),
    ],
)
def test_a_full_or_read_only_checkpoint_volume_keeps_training_the_last_checkpoint_and_its_offsets(
    kafka_broker, tmp_path, small_volume, fault_record, fault, inject, message
):
    from kale_dagster.trainer.checkpoint import list_checkpoints, load_latest

    servers = kafka_broker.bootstrap_servers
    ensure_topic(servers, TOPIC, PARTITIONS)
    launcher, _ = trainer(servers, tmp_path)
    feeder = Feeder(servers)
    try:
        launcher.start(2)
        feeder.start()
        wait_for(lambda: list_checkpoints(small_volume), 30, "a first checkpoint")
        undo = inject(small_volume)
        error = wait_for(lambda: launcher.status().checkpoint_error, 30, "the workers to report the failed checkpoint")
        saved = load_latest(small_volume)  # the previous checkpoint stays whole and loadable
        trained_before = len(trained_samples(tmp_path / "trained"))
        time.sleep(4.0)  # several checkpoint intervals on a full volume
        committed_full = committed_offsets(servers, TOPIC, "trainer", PARTITIONS)
        trained_full = len(trained_samples(tmp_path / "trained"))
        leftovers = [p.name for p in small_volume.iterdir() if p.name.endswith(".tmp")]
        undo()
        freed_at = time.monotonic()
        wait_for(lambda: not launcher.status().checkpoint_error, 30, "a checkpoint once the volume is writable again")
        recovery_s = time.monotonic() - freed_at
        feeder.stop()
        caught_up(launcher, servers)
        restarts = [r for r in launcher.records if r.reason.startswith("crash-restart")]
    finally:
        feeder.stop()
        launcher.stop()
    figures = accounting(tmp_path, feeder.produced, servers)
    latest_offsets = {int(p): o for p, o in saved["offsets"].items()}
    checks = {
        "clear error": message in error and "stays the latest" in error,
        "training went on": trained_full > trained_before,
        "offsets not past the saved checkpoint": all(
            committed_full[p] <= latest_offsets.get(p, 0) for p in committed_full
        ),
        "no partial file": not leftovers,
        "no restart": not restarts,
        "nothing lost or repeated": figures["lost"] == 0 and figures["duplicated"] == 0,
    }
    fault_record(
        fault=fault, injected=1, survived=int(all(checks.values())), recovery_s=round(recovery_s, 1), **figures
    )
    assert all(checks.values()), (checks, error, figures)


def test_a_killed_trainer_service_leaves_no_orphans_and_a_new_one_resumes(kafka_broker, tmp_path, fault_record):
    import sys

    from kale_dagster.launchers.service import LocalTrainerClient
    from kale_dagster.stream.broker import free_loopback_port

    servers = kafka_broker.bootstrap_servers
    ensure_topic(servers, TOPIC, PARTITIONS)
    (tmp_path / "trained").mkdir()

    def serve(port: int) -> tuple[subprocess.Popen, LocalTrainerClient]:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kale_dagster.cli",
                "trainer",
                "serve",
                "--bootstrap-servers",
                servers,
                "--topic",
                TOPIC,
                "--group-id",
                "trainer",
                "--checkpoint-dir",
                str(tmp_path / "ckpt"),
                "--workers",
                "2",
                "--batch-size",
                "64",
                "--emulate-gpu-rate",
                "300",
                "--trained-log",
                str(tmp_path / "trained"),
                "--port",
                str(port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        client = LocalTrainerClient(f"http://127.0.0.1:{port}")

        def up():
            try:
                return client.workers == 2
            except RuntimeError:
                return False

        wait_for(up, 120, "the trainer service and its 2 workers")
        return proc, client

    produced = produce(servers, 1500)
    first, _ = serve(free_loopback_port())
    second = None
    try:
        time.sleep(3.0)
        workers = descendants(first.pid)
        first.kill()  # SIGKILL: no chance to stop its workers
        first.wait()
        killed_at = time.monotonic()
        wait_for(lambda: not any(running(pid) for pid in workers), 60, "the orphaned workers to leave")
        orphans_gone_s = time.monotonic() - killed_at
        produced = produce(servers, 1500, start_seq=produced)
        second, client = serve(free_loopback_port())
        recovery_s = time.monotonic() - killed_at
        ends = end_offsets(servers, TOPIC, PARTITIONS)
        wait_for(
            lambda: committed_offsets(servers, TOPIC, "trainer", PARTITIONS) == ends,
            90,
            "the new service's group to catch up",
        )
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                proc.wait(timeout=120)
    figures = accounting(tmp_path, produced, servers)
    survived = figures["lost"] == 0 and figures["duplicated"] == 0
    fault_record(
        fault="trainer service killed (SIGKILL) while its workers trained; a new one started",
        injected=1,
        survived=int(survived),
        recovery_s=round(recovery_s, 1),
        **figures,
    )
    print(f"orphaned workers left {orphans_gone_s:.1f} s after the service died")
    # Orphaned workers stop as on SIGTERM (checkpoint, commit): nothing lost, nothing repeated.
    assert figures["lost"] == 0 and figures["duplicated"] == 0, figures


def test_a_rescale_run_whose_process_died_is_failed_and_retried_not_waited_for(controlled, fault_record):
    """A daemon or node killed mid-rescale takes the run's process along and leaves the run STARTED in storage;
    left alone it would hold back every later rescale ("one at a time")."""
    from dagster import DagsterEvent, DagsterEventType, DagsterRunStatus

    from kale_dagster.definitions.decision import RescaleConfig

    env = controlled
    instance = env["instance"]
    orphan = instance.create_run_for_job(
        env["defs"].resolve_job_def("ctl_rescale"),
        run_config=RescaleConfig(workers=3).as_run_config("ctl").to_config_dict(),
        tags={"kale/pipeline": "ctl"},
    )
    instance.report_dagster_event(
        DagsterEvent(DagsterEventType.RUN_START.value, job_name="ctl_rescale"),
        orphan.run_id,
        timestamp=time.time() - 3600,
    )  # started an hour ago; its process is gone
    assert instance.get_run_by_id(orphan.run_id).status == DagsterRunStatus.STARTED
    produce_events(env["servers"], 40)
    first = sensor_tick(env)  # the next tick finds it
    noted = decision_of(first).get("stale_rescale_run", "")
    failed = instance.get_run_by_id(orphan.run_id).status == DagsterRunStatus.FAILURE
    time.sleep(0.5)
    produce_events(env["servers"], 40)
    second = sensor_tick(env, first.cursor)
    decision = decision_of(second)
    said = "was in flight for" in noted and "marked failed" in noted
    survived = failed and said and decision["workers"] == 3
    fault_record(fault="rescale run left STARTED by a killed daemon", injected=1, survived=int(survived))
    assert failed and said, noted
    assert decision["workers"] == 3  # the allocation still converges: the failure is retried after its backoff
    assert "failed" in decision["action"] and "retrying in" in decision["action"], decision["action"]


def test_a_10x_arrival_burst_is_met_by_the_emergency_path_within_one_tick(controlled, fault_record):
    """Kale's fallback acts on the latest interval's rate: the windowed rate and the lag would take a rate window
    or half an SLO to show the burst, too late for a restart to keep the lag under the SLO."""
    from dataclasses import replace

    from kale_dagster import ThroughputModel, build_definitions
    from kale_dagster.definitions.decision import RescaleConfig

    # One worker takes 1 sample per pipeline second: the steady ~40 records per ~1 s tick (1.3/s at 30x) keep two busy.
    p = replace(controlled["p"], policy="kale", policy_options={}, throughput_prior=ThroughputModel.linear(1.0))
    env = {**controlled, "p": p, "defs": build_definitions(p)}
    cursor, steady = None, []
    for _ in range(6):
        produce_events(env["servers"], 40)
        result = sensor_tick(env, cursor)
        cursor = result.cursor
        steady.append(decision_of(result))
        time.sleep(0.5)
    produce_events(env["servers"], 400)  # 10x in one interval
    burst_at = time.monotonic()
    result = sensor_tick(env, cursor)
    recovery_s = time.monotonic() - burst_at
    decision = decision_of(result)
    rescales = [RescaleConfig.of(r.run_config).workers for r in result.run_requests if r.job_name == "ctl_rescale"]
    caught = (
        "burst:" in decision["reason"]
        and decision["workers"] > decision["running_workers"]
        and rescales == [decision["workers"]]
    )
    fault_record(
        fault="10x arrival burst in one metrics interval",
        injected=1,
        survived=int(caught),
        recovery_s=round(recovery_s, 1),
    )
    assert all("burst:" not in d["reason"] for d in steady), [d["reason"] for d in steady]  # steady noise is no burst
    assert caught, (decision["reason"], decision["workers"], decision["running_workers"], rescales)
    # The windowed rate, which has not caught up yet, would not have called for it.
    assert decision["latest_arrival_rate"] > 2 * decision["arrival_rate"], decision
