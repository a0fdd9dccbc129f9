"""What several test modules share: waiting on a running system, and stand-ins behind the real interfaces."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kale_dagster.launchers.base import LauncherStatus, RescaleRecord

#: The bucket the ``s3_server`` fixture creates.
S3_BUCKET = "checkpoints"


def descendants(pid: int) -> set[int]:
    """PIDs of all live descendants of ``pid``, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Field 4 is the parent PID; the command name in field 2 may hold spaces.
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


class StandInWorkers:
    """Behind the real trainer service: a group whose busy share the test sets, and that can fail a rescale."""

    def __init__(self, workers=2):
        self.workers, self.busy, self.fail, self.records = workers, 1.0, False, []
        self.restarting = False  # a restart to ``workers`` under way, which ``retarget`` can redirect
        self.saturated = False  # whether the group never waited for data (its rate is then its capacity)
        self.auc: float | None = None  # the trainer's progressive-validation metric, once it reports one

    def rescale(self, m, reason="rescale"):
        if self.fail:
            raise RuntimeError("the standbys did not come up")
        if m == self.workers:
            return None
        record = RescaleRecord(time=time.time(), from_workers=self.workers, to_workers=m, downtime_s=0.5, reason=reason)
        self.workers = m
        self.records.append(record)
        return record

    def retarget(self, m, reason="retarget"):
        if not self.restarting or m <= self.workers:
            return False
        self.workers = m
        return True

    def status(self):
        if self.restarting:
            return LauncherStatus(workers=self.workers, rescaling=True)
        rate = 100.0 * self.workers * self.busy
        return LauncherStatus(
            workers=self.workers,
            measures=True,
            reported=self.workers,
            busy_share=self.busy,
            samples_per_s=rate,
            saturated=self.saturated,
            downtimes_s=tuple(r.downtime_s for r in self.records),
            metric_name="auc" if self.auc is not None else "",
            metric=self.auc,
        )


def local_trainer_pipeline(tmp_path: Path, trainer_url: str):
    """A pipeline named ``demo`` whose rescale runs drive the local trainer service at ``trainer_url``; nothing
    reaches its broker address."""
    from kale_dagster import KafkaSource, OnlineTrainingPipeline
    from kale_dagster.launchers.service import LocalLauncherConfig

    return OnlineTrainingPipeline(
        name="demo",
        source=KafkaSource("127.0.0.1:9092", ("samples",), "g"),
        history_url=f"sqlite:///{tmp_path / 'm.db'}",
        launcher=LocalLauncherConfig(trainer_url),
        advisory=False,
    )


def wait_for(predicate: Callable, timeout: float, what: str, log: Path | None = None, poll_s: float = 1.0):
    """The predicate's first truthy value within ``timeout`` seconds; on timeout, fails saying what, with the log's
    tail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    tail = f"; log:\n{log.read_text()[-4000:]}" if log is not None and log.exists() else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{tail}")


def trained_samples(log_dir: Path) -> np.ndarray:
    """(partition, offset, index in the record) of every sample the workers trained, from their accounting logs,
    each rank's in training order."""
    chunks = [np.frombuffer(p.read_bytes(), dtype=np.int64).reshape(-1, 3) for p in sorted(log_dir.glob("*.bin"))]
    return np.concatenate(chunks) if chunks else np.empty((0, 3), dtype=np.int64)


def trained_seqs(log_dir: Path, servers: str, topic: str) -> np.ndarray:
    """The producer's sequence number of every CTR sample the workers trained (in the order of
    ``trained_samples``), read back from the topic: what was trained, by content, not only by position."""
    from kafka import KafkaConsumer, TopicPartition

    from kale_dagster.stream.samples import decode

    trained = trained_samples(log_dir)
    consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        seqs: dict[tuple[int, int], np.ndarray] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            polled = consumer.poll(timeout_ms=200, max_records=10_000)
            for tp, records in polled.items():
                for r in records:
                    samples, _ = decode([r.value])
                    seqs[(tp.partition, r.offset)] = samples["seq"].astype(np.int64)
            if not polled and all(
                (hw := consumer.highwater(tp)) is not None and consumer.position(tp) >= hw for tp in tps
            ):
                break
    finally:
        consumer.close()
    return np.array([seqs[(int(p), int(o))][i] for p, o, i in trained], dtype=np.int64)


def committed_offsets(servers, topic, group, partitions):
    """The group's committed offset per partition (0 where none)."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=servers, group_id=group, enable_auto_commit=False)
    try:
        return {p: c.committed(TopicPartition(topic, p)) or 0 for p in range(partitions)}
    finally:
        c.close()


def end_offsets(servers, topic, partitions):
    """Each partition's end offset."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=servers)
    try:
        # end offsets through a fetch high watermark (exact on the embedded broker too)
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        for tp in tps:
            c.seek_to_beginning(tp)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(c.highwater(tp) is None for tp in tps):
            c.poll(timeout_ms=100)
        return {tp.partition: c.highwater(tp) for tp in tps}
    finally:
        c.close()


def sensor_tick(env, cursor=None):
    """One evaluation of the ``controlled`` pipeline's metrics sensor: a SensorResult or a SkipReason."""
    from dagster import build_sensor_context

    sensor = {s.name: s for s in env["defs"].get_repository_def().sensor_defs}["ctl_stream_metrics"]
    return sensor(build_sensor_context(instance=env["instance"], cursor=cursor))


def decision_of(result) -> dict:
    """The gpu_allocation metadata a sensor result carries, as plain values."""
    from dagster import AssetMaterialization

    event = next(
        e
        for e in result.asset_events
        if isinstance(e, AssetMaterialization) and e.asset_key.path == ["ctl", "gpu_allocation"]
    )
    return {k: v.value for k, v in event.metadata.items()}


def produce_events(servers, n):
    """``n`` 29-byte records into the ``controlled`` pipeline's topic, over its two partitions."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=servers)
    for i in range(n):
        producer.send("events", value=b"x" * 29, partition=i % 2)
    producer.close()


def prerequisite_missing(message: str) -> None:
    """A test that cannot run here: skipped on a developer's machine, failed under CI (CI set), where .ci/install
    was to provide it, so that a green CI never hides a test that did not run."""
    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"{message} (under CI a missing prerequisite fails the test)")
    pytest.skip(message)
