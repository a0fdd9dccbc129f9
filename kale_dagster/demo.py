"""``kale demo``: a compressed diurnal day on the embedded broker, kept sized by Kale.

Parts, all real except the GPU: the Tansu broker on loopback; a producer
replaying a synthetic day into the ``samples`` topic; a consumer group
whose consumption is capped at workers x per-worker rate (EMULATED GPUs,
labelled as such), pausing for the restart time whenever its worker count
changes; a control loop reading telemetry through ``KafkaStreamResource``,
recording it in the metrics history and asking ``KalePolicy`` for the
allocation; and ``dagster dev`` on 127.0.0.1:3000 with the demo pipeline,
whose sensor and assets read the same broker and history.

One clock: everything runs on wall time, and every duration of the day
(SLO, restart, plan step, hold) is divided by the speed-up, so a 24-hour
day compressed into 15 minutes keeps its proportions.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from .broker import FAST_GROUP_SESSION_TIMEOUT_MS, start_broker
from .forecast import make_forecaster
from .history import MetricsHistory
from .policies import KaleConfig, KalePolicy
from .policy import Observation
from .resources import KafkaStreamResource
from .telemetry import previous_from
from .throughput import ThroughputModel
from .trace import synth_trace

TOPIC, GROUP, PIPELINE = "samples", "demo-trainer", "demo"


@dataclass(frozen=True)
class DemoSettings:
    day_minutes: float = 15.0  # wall minutes for one synthetic day
    peak_rate: float = 800.0  # samples per wall second at the evening peak
    worker_rate: float = 200.0  # EMULATED per-worker capacity, samples per wall second
    max_workers: int = 6
    slo_minutes: float = 20.0  # in trace time
    restart_minutes: float = 10.0  # in trace time
    seed: int = 0
    dagster: bool = True
    port: int = 9092
    ui_port: int = 3000

    @property
    def speedup(self) -> float:
        return 1440.0 / self.day_minutes


class Producer(threading.Thread):
    """Replays the trace's rate (samples per wall second) into the topic."""

    def __init__(self, servers: str, rates: np.ndarray, step_wall_s: float, stop: threading.Event):
        super().__init__(daemon=True, name="producer")
        self.servers, self.rates, self.step, self.stop_event = servers, rates, step_wall_s, stop
        self.sent = 0

    def run(self) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.servers, linger_ms=20)
        start = time.monotonic()
        try:
            while not self.stop_event.is_set():
                elapsed = time.monotonic() - start
                i = int(elapsed / self.step)
                if i >= len(self.rates):
                    break
                due = int(np.sum(self.rates[:i]) * self.step + self.rates[i] * (elapsed - i * self.step))
                for _ in range(max(due - self.sent, 0)):
                    producer.send(TOPIC, value=b"s")
                    self.sent += 1
                time.sleep(0.05)
        finally:
            producer.flush()
            producer.close()


class EmulatedTrainer(threading.Thread):
    """A consumer group consuming at workers x worker_rate (EMULATED GPUs), paused while it restarts."""

    def __init__(self, servers: str, worker_rate: float, workers: int, restart_wall_s: float, stop: threading.Event):
        super().__init__(daemon=True, name="emulated-trainer")
        self.servers, self.worker_rate, self.restart_wall_s, self.stop_event = servers, worker_rate, restart_wall_s, stop
        self.workers = workers
        self.restart_until = 0.0
        self.rescales = 0

    def rescale(self, workers: int) -> None:
        if workers != self.workers:
            self.workers = workers
            self.restart_until = time.monotonic() + self.restart_wall_s
            self.rescales += 1

    @property
    def restarting(self) -> bool:
        return time.monotonic() < self.restart_until

    def run(self) -> None:
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(
            TOPIC, bootstrap_servers=self.servers, group_id=GROUP, enable_auto_commit=False,
            auto_offset_reset="earliest", session_timeout_ms=FAST_GROUP_SESSION_TIMEOUT_MS, heartbeat_interval_ms=1000,
        )
        budget, last = 0.0, time.monotonic()
        try:
            while not self.stop_event.is_set():
                now = time.monotonic()
                if self.restarting:  # paused: nothing consumed, as in a pause-and-restart
                    budget, last = 0.0, now
                    time.sleep(0.05)
                    continue
                budget = min(budget + (now - last) * self.workers * self.worker_rate, self.workers * self.worker_rate)
                last = now
                if budget < 1:
                    time.sleep(0.02)
                    continue
                records = consumer.poll(timeout_ms=100, max_records=int(budget))
                budget -= sum(len(r) for r in records.values())
                if records:
                    consumer.commit()
        finally:
            with contextlib.suppress(Exception):
                consumer.close()


def _start_dagster(settings: DemoSettings, home: Path, servers: str) -> subprocess.Popen:
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        DAGSTER_HOME=str(home),
        KALE_DEMO_BOOTSTRAP=servers,
        KALE_DEMO_SLO_MINUTES=str(settings.slo_minutes / settings.speedup),
        KALE_DEMO_RESTART_MINUTES=str(settings.restart_minutes / settings.speedup),
        KALE_DEMO_WORKER_RATE=str(settings.worker_rate),
    )
    log = open(home / "dagster-dev.log", "wb")
    return subprocess.Popen(
        [sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(settings.ui_port)],
        cwd=Path(__file__).resolve().parents[1], env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True,  # dagster dev ignores SIGINT from a non-interactive shell; stop its group
    )


def _stop_group(proc: Optional[subprocess.Popen], timeout: float = 20.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            continue


def run_demo(settings: DemoSettings, stop: Optional[threading.Event] = None, max_wall_s: Optional[float] = None, out=sys.stdout) -> dict:
    """Run the demo until the day ends, ``stop`` is set, or ``max_wall_s`` passes; returns a summary."""
    stop = stop or threading.Event()
    speed = settings.speedup
    step_wall = 60.0 / speed  # one trace minute in wall seconds
    trace = synth_trace(days=1, seed=settings.seed, step_s=60, peak_rate=settings.peak_rate)
    rates = trace["value"].to_numpy(float) / 60.0
    model = ThroughputModel.linear(settings.worker_rate)
    cfg = KaleConfig(
        min_workers=1, max_workers=settings.max_workers, slo_s=settings.slo_minutes * 60 / speed,
        restart_s=settings.restart_minutes * 60 / speed, plan_step_s=600 / speed, tau_s=600 / speed,
        sync_period_s=60 / speed, projection_tick_s=300 / speed,
    )
    policy = KalePolicy(model, cfg)
    home = Path(".kale/demo-home").resolve()
    (home / "kale").mkdir(parents=True, exist_ok=True)
    # The same file Dagster's default history uses under this DAGSTER_HOME.
    history = MetricsHistory(f"sqlite:///{home / 'kale' / 'metrics.db'}")
    broker = start_broker(port=settings.port)
    dagster_proc = None
    producer = trainer = None
    summary: dict = {}
    try:
        servers = broker.bootstrap_servers
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(bootstrap_servers=servers)
        admin.create_topics([NewTopic(TOPIC, num_partitions=4, replication_factor=1)])
        admin.close()
        workers = model.min_workers_for(rates[0], settings.max_workers)
        producer = Producer(servers, rates, step_wall, stop)
        trainer = EmulatedTrainer(servers, settings.worker_rate, workers, cfg.restart_s, stop)
        producer.start()
        trainer.start()
        if settings.dagster:
            dagster_proc = _start_dagster(settings, home, servers)
            print(f"Dagster UI: http://127.0.0.1:{settings.ui_port}  (pipeline 'demo'; log in {home / 'dagster-dev.log'})", file=out)
        print(f"broker {servers}; one day in {settings.day_minutes:g} min ({speed:.0f}x); workers are EMULATED at {settings.worker_rate:g} samples/s each", file=out)
        stream = KafkaStreamResource(bootstrap_servers=servers, topics=[TOPIC], group_id=GROUP, request_timeout_ms=3000)
        forecaster_name = "ewma"
        previous, started, last_decision = None, time.monotonic(), "none yet"
        lag_samples, worker_samples = [], []
        while not stop.is_set() and producer.is_alive():
            if max_wall_s is not None and time.monotonic() - started > max_wall_s:
                break
            tick_start = time.monotonic()
            try:
                snap = stream.snapshot(previous=previous, fetch_timeout_s=1.0)
            except Exception as exc:  # keep the demo alive through a hiccup
                print(f"\ntelemetry skipped: {exc}", file=out)
                stop.wait(cfg.sync_period_s)
                continue
            previous = previous_from(snap)
            history.append_stream(PIPELINE, snap.time, snap.metadata(), workers=trainer.workers)
            recent = history.arrival_history(PIPELINE, start=snap.time - 3600)
            fc = make_forecaster(forecaster_name, horizon_s=7200 / speed).fit(recent).predict(12) if len(recent) >= 3 else None
            obs = Observation(
                time=snap.time, workers=trainer.workers, arrival_rate=snap.arrival_rate or 0.0,
                consumption_rate=snap.consumption_rate or 0.0, backlog=snap.message_lag, time_lag_s=snap.time_lag_s,
                utilization=1.0 if snap.message_lag > 0 else 0.0, forecast=fc, restarting=trainer.restarting,
            )
            decision = policy.decide(obs)
            if decision.workers != trainer.workers:
                trainer.rescale(decision.workers)
                last_decision = decision.reason[:90]
            trace_clock = (time.monotonic() - started) * speed / 3600
            lag_samples.append(snap.time_lag_s * speed / 60)
            worker_samples.append(trainer.workers)
            status = (
                f"\rday {trace_clock:5.2f} h | arrivals {snap.arrival_rate or 0:6.0f}/s | lag {snap.message_lag:7d} msgs "
                f"{snap.time_lag_s * speed / 60:5.1f} min (trace) | workers {trainer.workers}{' restarting' if trainer.restarting else ''} "
                f"| last decision: {last_decision}"
            )
            print(status[:220].ljust(220), end="", file=out, flush=True)
            stop.wait(max(cfg.sync_period_s - (time.monotonic() - tick_start), 0.05))
        summary = {
            "produced": producer.sent,
            "rescales": trainer.rescales,
            "max_lag_trace_minutes": max(lag_samples, default=0.0),
            "mean_workers": float(np.mean(worker_samples)) if worker_samples else 0.0,
        }
        print(f"\nsummary: {summary}", file=out)
    finally:
        stop.set()
        for thread in (producer, trainer):
            if thread is not None:
                thread.join(timeout=10)
        _stop_group(dagster_proc)
        broker.stop()
        history.dispose()
    return summary
