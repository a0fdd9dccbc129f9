"""Replay an arrival trace into Kafka as CTR samples, at the trace's (compressed) rate."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kale_dagster.rules import check, setting
from kale_dagster.stream.samples import GroundTruth, encode, partition_weights


@dataclass(frozen=True)
class ReplaySettings:
    topic: str = "samples"
    speedup: float = setting(1.0, gt=0, description="trace seconds per wall second")
    rate_scale: float = setting(1.0, gt=0, description="multiplies the trace's rates (samples per trace second)")
    partitions: int = setting(8, ge=1, le=10_000, description="the topic's partitions")
    hot_share: float = setting(0.0, ge=0, lt=1, description="share of traffic on partition 0; 0: even")
    seed: int = 0
    samples_per_record: int = setting(
        1, ge=1, le=100_000, description=">1 packs micro-batches: far fewer records for a consumer to parse"
    )

    def __post_init__(self):
        check(self)


def ensure_topic(servers: str, topic: str, partitions: int, timeout_s: float = 30.0) -> None:
    """Create ``topic`` unless it exists; a broker that does not answer within ``timeout_s`` is a KafkaError."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    wait_ms = max(int(timeout_s * 1000), 100)
    bounded: dict[str, Any] = {"bootstrap_timeout_ms": wait_ms, "request_timeout_ms": wait_ms}  # kafka-python 3
    admin = KafkaAdminClient(bootstrap_servers=servers, **bounded)
    try:
        if topic not in admin.list_topics():
            admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()


def wall_rates(history: pd.DataFrame, settings: ReplaySettings) -> tuple[np.ndarray, float]:
    """Samples per wall second for each trace interval, and the interval's wall length."""
    step = (history["timestamp"].iloc[1] - history["timestamp"].iloc[0]).total_seconds() if len(history) > 1 else 60.0
    rates = history["rate"].fillna(0.0).to_numpy(float) * settings.rate_scale * settings.speedup
    return rates, step / settings.speedup


def replay(
    servers: str,
    history: pd.DataFrame,
    settings: ReplaySettings,
    stop: threading.Event | None = None,
    max_wall_s: float | None = None,
    batch_size: int = 16384,
) -> int:
    """Produce the trace; returns the number of samples sent.  Sequence numbers start at 0.

    ``max_wall_s`` bounds the whole run, reaching the broker included: a broker that does not answer is a
    KafkaError within it (or within 30 s without it), not a wait of kafka-python's own."""
    from kafka import KafkaProducer

    stop = stop or threading.Event()
    reach_s = min(30.0, max_wall_s) if max_wall_s is not None else 30.0
    ensure_topic(servers, settings.topic, settings.partitions, timeout_s=reach_s)
    rates, step_wall = wall_rates(history, settings)
    weights = partition_weights(settings.partitions, settings.hot_share)
    rng = np.random.default_rng(settings.seed)
    truth = GroundTruth()
    wait_ms = max(int(reach_s * 1000), 100)
    bounded: dict[str, Any] = {"bootstrap_timeout_ms": wait_ms, "max_block_ms": wait_ms}  # kafka-python 3
    producer = KafkaProducer(bootstrap_servers=servers, linger_ms=10, batch_size=batch_size, **bounded)
    cumulative = np.concatenate([[0.0], np.cumsum(rates * step_wall)])
    k = settings.samples_per_record
    sent = 0
    start = time.monotonic()
    try:
        while not stop.is_set():
            elapsed = time.monotonic() - start
            if max_wall_s is not None and elapsed >= max_wall_s:
                break
            i = int(elapsed // step_wall)
            if i >= len(rates):
                break
            due = int(cumulative[i] + rates[i] * (elapsed - i * step_wall))
            # Whole records only: a packed record waits until all its samples are due.
            n = (due - sent) // k * k
            if n > 0:
                records = truth.sample(n, rng, start_seq=sent)
                values = encode(records, k)
                parts = rng.choice(settings.partitions, size=len(values), p=weights)
                for value, part, user in zip(values, parts, records["user"][::k]):
                    producer.send(settings.topic, value=value, key=int(user).to_bytes(4, "little"), partition=int(part))
                sent += n
            time.sleep(0.01)
    finally:
        producer.flush()
        producer.close()
    return sent


def replay_in_background(
    servers: str,
    history: pd.DataFrame,
    settings: ReplaySettings,
    stop: threading.Event,
    max_wall_s: float | None = None,
) -> threading.Thread:
    """:func:`replay` in a started daemon thread; set ``stop`` to end it early."""
    thread = threading.Thread(
        target=replay,
        args=(servers, history, settings),
        kwargs=dict(stop=stop, max_wall_s=max_wall_s),
        daemon=True,
        name="producer",
    )
    thread.start()
    return thread
