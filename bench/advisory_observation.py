"""How well advisory mode observes a consumer group it did not start: workers and rates against the truth.

A group of kafka-python consumers ("their trainer") on the embedded broker trains at a known pace (each
consumer processes at most ``--per-consumer`` records/s and commits after every batch), while a producer
writes ``--rate`` records/s.  The group runs 2 consumers, then 3, then 2 again.  An advisory pipeline,
pointed at the group with no launcher and no declared worker count, has its metrics sensor ticked every
``--tick-s`` seconds, as the daemon would.  Each reading's arrival and consumption rates are compared with
the producer's and the consumers' own counts over the same interval, and each decision's observed worker
count with the consumers running then (readings within ``--settle-s`` of a membership change are left out:
the group is rebalancing).  Prints the median and 90th-percentile relative errors, the worker count's
agreement, and the decisions recorded per hour.

    python bench/advisory_observation.py [--phase-s 60] [--tick-s 5]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
from dagster import AssetMaterialization, DagsterInstance, build_sensor_context
from kafka import KafkaConsumer, KafkaProducer

from kale_dagster import KafkaSource, Limits, OnlineTrainingPipeline, ThroughputModel, build_definitions
from kale_dagster.launchers import ObservedGroupLauncherConfig
from kale_dagster.stream.broker import embedded_broker
from kale_dagster.stream.producer import ensure_topic

TOPIC, GROUP, PARTITIONS = "samples", "their-trainer", 6


class Counted:
    """A cumulative count with the wall time of each step, read back at any instant by interpolation."""

    def __init__(self):
        self.lock = threading.Lock()
        self.times, self.totals = [time.time()], [0]

    def add(self, n: int) -> None:
        with self.lock:
            self.times.append(time.time())
            self.totals.append(self.totals[-1] + n)

    def rate(self, start: float, end: float) -> float:
        with self.lock:
            at = np.interp([start, end], self.times, self.totals)
        return float(at[1] - at[0]) / (end - start)


def produce(servers: str, rate: float, stop: threading.Event, produced: Counted) -> None:
    producer = KafkaProducer(bootstrap_servers=servers, linger_ms=5)
    batch, sent, start = max(int(rate / 20), 1), 0, time.time()
    while not stop.is_set():
        for i in range(batch):
            producer.send(TOPIC, b"x" * 32, partition=(sent + i) % PARTITIONS)
        producer.flush()
        sent += batch
        produced.add(batch)
        time.sleep(max(start + sent / rate - time.time(), 0.0))
    producer.close()


def consume(
    servers: str, per_s: float, stop: threading.Event, trained: Counted, session_timeout_ms: int = 6000
) -> None:
    """One member of their group: a pace of ``per_s`` records/s, offsets committed after each batch.  The embedded
    broker's JoinGroup waits half of ``session_timeout_ms``: a member joins that long after it starts."""
    consumer = KafkaConsumer(
        TOPIC,
        bootstrap_servers=servers,
        group_id=GROUP,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=min(1000, session_timeout_ms // 3),
        max_poll_records=max(int(per_s / 10), 1),
    )
    try:
        while not stop.is_set():
            records = sum(len(batch) for batch in consumer.poll(200).values())
            if records:
                time.sleep(records / per_s)  # the training step
                consumer.commit()
                trained.add(records)
    finally:
        consumer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=300.0, help="records/s produced")
    parser.add_argument("--per-consumer", type=float, default=120.0, help="records/s one consumer trains")
    parser.add_argument("--phase-s", type=float, default=60.0, help="seconds at each group size (2, 3, 2)")
    parser.add_argument("--tick-s", type=float, default=5.0, help="seconds between readings")
    parser.add_argument("--settle-s", type=float, default=10.0, help="readings this soon after a change are left out")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="kale-advisory-"))
    produced, trained = Counted(), Counted()
    with embedded_broker() as broker:
        servers = broker.bootstrap_servers
        ensure_topic(servers, TOPIC, PARTITIONS)
        p = OnlineTrainingPipeline(
            name="theirs",
            source=KafkaSource(servers, (TOPIC,), GROUP, request_timeout_ms=3000),
            limits=Limits(min_workers=1, max_workers=8),
            throughput_prior=ThroughputModel.linear(args.per_consumer),
            advisory=True,
            launcher=ObservedGroupLauncherConfig(),  # workers from the group's members
            history_url=f"sqlite:///{home / 'metrics.db'}",
            forecaster="ewma",
            record_every_minutes=0,  # every decision an event, to read each observed worker count
        )
        repo = build_definitions(p).get_repository_def()
        sensor = {s.name: s for s in repo.sensor_defs}["theirs_stream_metrics"]
        instance = DagsterInstance.local_temp(str(home))
        stop_producer = threading.Event()
        members: list[tuple[threading.Thread, threading.Event]] = []
        changes: list[tuple[float, int]] = []  # (wall time, consumers running from then on)

        def resize(n: int) -> None:
            while len(members) < n:
                stop = threading.Event()
                thread = threading.Thread(target=consume, args=(servers, args.per_consumer, stop, trained), daemon=True)
                thread.start()
                members.append((thread, stop))
            while len(members) > n:
                thread, stop = members.pop()
                stop.set()
                thread.join()
            changes.append((time.time(), n))

        threading.Thread(target=produce, args=(servers, args.rate, stop_producer, produced), daemon=True).start()
        observed: list[tuple[float, int | None]] = []
        cursor = None
        try:
            for size in (2, 3, 2):
                resize(size)
                phase_end = time.time() + args.phase_s
                while time.time() < phase_end:
                    time.sleep(args.tick_s)
                    result = sensor(build_sensor_context(instance=instance, cursor=cursor))
                    cursor = getattr(result, "cursor", cursor)
                    for event in getattr(result, "asset_events", None) or []:
                        if isinstance(event, AssetMaterialization) and event.asset_key.path[-1] == "gpu_allocation":
                            observed.append((time.time(), event.metadata["running_workers"].value))  # type: ignore[arg-type]
        finally:
            resize(0)
            stop_producer.set()
            instance.dispose()
        stream = p.history().stream("theirs")
    settled = [(t, n) for t, n in observed if all(not (0 <= t - changed < args.settle_s) for changed, _ in changes)]
    truth = [next(n for changed, n in reversed(changes) if changed <= t) for t, _ in settled]
    agree = sum(1 for (_, n), true in zip(settled, truth) if n == true)
    ts = stream["ts"].to_numpy(float)
    errors = {"arrival_rate": [], "consumption_rate": []}
    for i in range(1, len(stream)):
        start, end = ts[i - 1], ts[i]
        for column, counted in (("arrival_rate", produced), ("consumption_rate", trained)):
            measured, true = stream[column].iloc[i], counted.rate(start, end)
            if pd.notna(measured) and true > 0:  # a reading with a rate (not the first)
                errors[column].append(abs(float(measured) - true) / true)
    covered_h = (ts[-1] - ts[0]) / 3600
    decided = int(stream["decided_workers"].notna().sum())
    print(f"{len(stream)} readings every {args.tick_s:g} s over {covered_h * 60:.1f} min; group sizes 2, 3, 2")
    for column, errs in errors.items():
        e = np.array(errs)
        print(
            f"  {column:17s} relative error: median {np.median(e):.1%}, p90 {np.quantile(e, 0.9):.1%}, "
            f"max {e.max():.1%} ({len(e)} intervals)"
        )
    print(
        f"  workers observed from members: {agree} of {len(settled)} settled readings exact "
        f"({len(observed) - len(settled)} within {args.settle_s:g} s of a change left out)"
    )
    print(f"  decisions recorded: {decided} ({decided / covered_h:.0f} per hour at this reading interval)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
