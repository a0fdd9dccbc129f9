"""Trainer benchmarks on the embedded broker with real torch processes.

1. Rescale downtime (decision -> first step at the new size), median over
   several rescales: stopped workers reused (the default), warm standbys
   with every stopped worker exiting (the launcher before reuse), and cold
   starts (a fresh Python + torch import per worker, as torchrun does), in
   the same run.
2. Data-path overhead: samples/s of one worker consuming from Kafka and
   training, against training the same model on in-memory batches.
3. Balancing: one hot partition carrying half the traffic, 4 EMULATED GPU
   workers (150 samples/s each): per-worker idle share and total throughput
   with rate-based assignment + forwarding vs round-robin without forwarding.

    python bench/trainer.py [--rescales 6]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pandas as pd
import torch

from kale_dagster.definitions.resources import KafkaStreamResource
from kale_dagster.launchers import LocalLauncher, TrainerSettings
from kale_dagster.launchers.base import RescaleRecord
from kale_dagster.stream.broker import embedded_broker
from kale_dagster.stream.producer import ReplaySettings, replay, replay_in_background
from kale_dagster.stream.samples import GroundTruth
from kale_dagster.stream.source import KafkaSource
from kale_dagster.trainer.ctr import CTRModel, batch_tensors


def _downtime(record: RescaleRecord | None) -> float:
    assert record is not None  # every target differs from the one before
    return record.downtime_s


def _flat(rate: float, minutes: int = 30) -> pd.DataFrame:
    return pd.DataFrame(
        {"timestamp": pd.date_range("2026-01-01", periods=minutes, freq="1min", tz="UTC"), "rate": rate}
    )


def _produce_in_background(servers, topic, rate, hot_share, seconds, partitions=8):
    stop = threading.Event()
    return stop, replay_in_background(
        servers,
        _flat(rate),
        ReplaySettings(topic=topic, partitions=partitions, hot_share=hot_share),
        stop,
        max_wall_s=seconds,
    )


def rescale_downtime(servers: str, rescales: int) -> None:
    stop, producer = _produce_in_background(servers, "rescale", 400, 0.0, 600)
    time.sleep(1)
    settings = TrainerSettings(
        KafkaSource(servers, ("rescale",), "rescale-trainer"),
        tempfile.mkdtemp(),
        batch_size=128,
        emulate_gpu_rate=200,
        checkpoint_every_s=5,
    )
    warm = LocalLauncher(settings, pool_size=3)
    try:
        warm.start(1)
        targets = [2, 1, 3, 2, 1, 3, 2, 1][:rescales]
        downs = []
        phases = []
        for t in targets:
            time.sleep(3)
            record = warm.rescale(t)
            assert record is not None  # every target differs from the one before
            downs.append(record.downtime_s)
            phases.append(record.phases)
    finally:
        warm.stop()
    fresh = LocalLauncher(settings, pool_size=3, reuse_workers=False)  # standbys, but every stopped worker exits
    freshs = []
    try:
        fresh.start(1)
        for t in targets:
            time.sleep(3)
            freshs.append(_downtime(fresh.rescale(t)))
    finally:
        fresh.stop()
    cold = LocalLauncher(settings, pool_size=0, reuse_workers=False)
    colds = []
    try:
        for t in (1, 2, 1):
            time.sleep(2)
            colds.append(_downtime(cold.rescale(t) if cold.workers else cold.start(t)))
    finally:
        cold.stop()
        stop.set()
        producer.join()
    print(
        f"rescale downtime, stopped workers reused: median {statistics.median(downs):.2f} s over {len(downs)} rescales "
        f"({', '.join(f'{d:.2f}' for d in downs)})"
    )
    print("  median phases: " + ", ".join(f"{k} {statistics.median(p[k] for p in phases):.2f} s" for k in phases[0]))
    print(
        f"rescale downtime, standbys, stopped workers exit: median {statistics.median(freshs):.2f} s "
        f"({', '.join(f'{d:.2f}' for d in freshs)})"
    )
    print(
        f"rescale downtime, cold start: median {statistics.median(colds):.2f} s over {len(colds)} "
        f"({', '.join(f'{d:.2f}' for d in colds)}); "
        f"warm/cold {statistics.median(downs) / statistics.median(colds):.2f}x"
    )


def train_only_rate(batch: int = 256, seconds: float = 8.0) -> float:
    model = CTRModel()
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
    rng = np.random.default_rng(0)
    batches = [GroundTruth().sample(batch, rng) for _ in range(64)]
    n, start, i = 0, time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        users, items, dense, labels = batch_tensors(batches[i % 64], torch.device("cpu"))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(users, items, dense), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        n += batch
        i += 1
    return n / (time.perf_counter() - start)


def train_only_in_subprocess() -> float:
    """Train-only rate in a fresh process, as the worker runs: same process conditions on both sides."""
    out = subprocess.run([sys.executable, __file__, "--train-only"], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def consume_and_train(servers: str, topic: str) -> float:
    group = f"{topic}-trainer-{time.monotonic_ns()}"
    settings = TrainerSettings(
        KafkaSource(servers, (topic,), group), tempfile.mkdtemp(), metrics_every_s=2, checkpoint_every_s=30
    )
    launcher = LocalLauncher(settings, pool_size=1)
    rates = []
    try:
        launcher.start(1)
        launcher.wait_warm()
        for _ in range(3):
            time.sleep(2.2)
            rates.append(launcher.status().samples_per_s or 0.0)
    finally:
        launcher.stop()
    # The worker commits on stop: lag left means it never ran out of samples (its rate is its own speed).
    left = KafkaStreamResource(bootstrap_servers=servers, topics=[topic], group_id=group).snapshot()
    if any(p.lag == 0 for p in left.partitions):
        raise RuntimeError(
            f"{topic}: the worker drained a partition, so its rate was not its own speed; fill more samples"
        )
    return statistics.median(rates[1:])


def data_path_overhead(servers: str, rounds: int = 3) -> None:
    """One worker on a filled topic vs the same model on in-memory batches, interleaved round by
    round so that machine noise hits both alike."""
    packings = (1, 16)
    for k in packings:  # ~40 s each: a batching producer sends ~13k records/s here
        replay(
            servers,
            _flat(20_000, minutes=1),
            ReplaySettings(topic=f"fill-{k}", partitions=4, samples_per_record=k),
            max_wall_s=40,
        )
    train, consume = [], {k: [] for k in packings}
    for _ in range(rounds):
        train.append(train_only_in_subprocess())
        for k in packings:
            consume[k].append(consume_and_train(servers, f"fill-{k}"))
    base = statistics.median(train)
    print(f"train-only {base:,.0f} samples/s (median of {rounds}: {', '.join(f'{r:,.0f}' for r in train)})")
    for k, rates in consume.items():
        rate = statistics.median(rates)
        print(
            f"consume+train, {k:>2} sample(s) per Kafka record: {rate:,.0f} samples/s (median of {rounds}: "
            f"{', '.join(f'{r:,.0f}' for r in rates)}), data-path overhead {1 - rate / base:.1%}"
        )


def balancing(servers: str) -> None:
    for balance in ("round-robin", "rates"):
        topic = f"hot-{balance}"
        stop, producer = _produce_in_background(servers, topic, 520, 0.5, 40)
        time.sleep(1)
        settings = TrainerSettings(
            KafkaSource(servers, (topic,), f"{topic}-trainer"),
            tempfile.mkdtemp(),
            batch_size=32,
            emulate_gpu_rate=150,
            metrics_every_s=4,
            checkpoint_every_s=10,
            balance=balance,
        )
        launcher = LocalLauncher(settings, pool_size=4)
        extra = []
        try:
            launcher.start(4)
            time.sleep(8)  # warm-up
            for _ in range(5):
                time.sleep(4.1)
                extra.append(launcher.per_rank_rates())
        finally:
            launcher.stop()
            stop.set()
            producer.join()
        per_rank = {r: statistics.median(s[r] for s in extra if r in s) for r in range(4)}
        idle = {r: max(0.0, 1 - v / 150) for r, v in per_rank.items()}
        print(
            f"{balance:>11}: total {sum(per_rank.values()):6.0f} samples/s, idle share per worker "
            + ", ".join(f"{idle[r]:.0%}" for r in range(4))
            + f" (mean {statistics.mean(idle.values()):.0%})"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rescales", type=int, default=6)
    parser.add_argument("--train-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.train_only:
        print(train_only_rate())
        return 0
    with embedded_broker() as broker:
        rescale_downtime(broker.bootstrap_servers, args.rescales)
        data_path_overhead(broker.bootstrap_servers)
        balancing(broker.bootstrap_servers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
