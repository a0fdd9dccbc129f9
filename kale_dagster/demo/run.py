"""``kale demo``: a compressed diurnal day on the embedded broker, kept sized by Kale.

Parts, all real except the GPU: the Tansu broker on loopback; the trace
producer replaying a synthetic day of CTR samples into the ``samples``
topic; the torch trainer under the local launcher (DDP workers with warm
standbys, pause-and-restart rescales), each worker's throughput capped to
EMULATE one GPU, labelled as such; a control loop reading telemetry
through ``KafkaStreamResource``, recording it and the workers' measured
throughput in the metrics history, and asking ``KalePolicy`` for the
allocation; and ``dagster dev`` on 127.0.0.1:3000 with the demo pipeline,
whose sensor and assets read the same broker and history.

One clock: everything runs on wall time, and every duration of the day
(SLO, plan step, hold) is divided by the speed-up, so a 24-hour day
compressed into 15 minutes keeps its proportions.  The restart time is not
simulated: it is the launcher's measured rescale downtime.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from kale_dagster.control.live import LiveController
from kale_dagster.definitions.resources import KafkaStreamResource
from kale_dagster.demo import GROUP, PIPELINE, TOPIC
from kale_dagster.launchers.local import LocalLauncher, TrainerSettings
from kale_dagster.launchers.service import LauncherService
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.policies import KaleConfig, KalePolicy
from kale_dagster.processes import stop_process_group
from kale_dagster.sim.trace import synth_trace
from kale_dagster.stream.broker import start_broker
from kale_dagster.stream.history import MetricsHistory
from kale_dagster.stream.producer import ReplaySettings, ensure_topic, replay_in_background
from kale_dagster.stream.source import KafkaSource


@dataclass(frozen=True)
class DemoSettings:
    day_minutes: float = 15.0  # wall minutes for one synthetic day
    peak_rate: float = 800.0  # samples per wall second at the evening peak
    worker_rate: float = 200.0  # EMULATED per-worker capacity, samples per wall second
    max_workers: int = 5
    slo_minutes: float = 20.0  # in trace time
    expected_restart_s: float = 3.0  # wall seconds; replaced by the measured downtime after each rescale
    seed: int = 0
    dagster: bool = True
    port: int = 9092
    ui_port: int = 3000

    @property
    def speedup(self) -> float:
        return 1440.0 / self.day_minutes


def write_dagster_yaml(home: Path) -> None:
    """A local instance for the demo: no onboarding pop-up, no usage telemetry (loopback only)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text("nux:\n  enabled: false\ntelemetry:\n  enabled: false\n")


def _start_dagster(settings: DemoSettings, home: Path, servers: str, trainer_url: str) -> subprocess.Popen:
    write_dagster_yaml(home)
    env = dict(os.environ)
    env.update(
        DAGSTER_HOME=str(home),
        KALE_DEMO_BOOTSTRAP=servers,
        KALE_DEMO_SLO_MINUTES=str(settings.slo_minutes / settings.speedup),
        KALE_DEMO_RESTART_MINUTES=str(settings.expected_restart_s / 60),
        KALE_DEMO_WORKER_RATE=str(settings.worker_rate),
        KALE_DEMO_TRAINER_URL=trainer_url,
    )
    log = open(home / "dagster-dev.log", "wb")
    return subprocess.Popen(
        [sys.executable, "-m", "dagster", "dev", "-m", "kale_dagster.demo.definitions", "-h", "127.0.0.1", "-p", str(settings.ui_port)],
        cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True,  # dagster dev ignores SIGINT from a non-interactive shell; stop its group
    )


def run_demo(settings: DemoSettings, stop: Optional[threading.Event] = None, max_wall_s: Optional[float] = None, out=sys.stdout) -> dict:
    """Run the demo until the day ends, ``stop`` is set, or ``max_wall_s`` passes; returns a summary."""
    stop = stop or threading.Event()
    speed = settings.speedup
    trace = synth_trace(days=1, seed=settings.seed, step_s=60, peak_rate=settings.peak_rate / speed)
    history_in = pd.DataFrame({"timestamp": pd.to_datetime(trace["timestamp"], utc=True), "rate": trace["value"] / 60.0})
    model = ThroughputModel.linear(settings.worker_rate)

    def kale_config(restart_s: float) -> KaleConfig:
        return KaleConfig(
            min_workers=1, max_workers=settings.max_workers, slo_s=settings.slo_minutes * 60 / speed,
            restart_s=restart_s, plan_step_s=600 / speed, tau_s=600 / speed,
            sync_period_s=60 / speed, projection_tick_s=300 / speed, lag_weight=KaleConfig.lag_weight * speed,
        )

    policy = KalePolicy(model, kale_config(settings.expected_restart_s))
    home = Path(".kale/demo-home").resolve()
    (home / "kale").mkdir(parents=True, exist_ok=True)
    # The same file Dagster's default history uses under this DAGSTER_HOME.
    history = MetricsHistory(f"sqlite:///{home / 'kale' / 'metrics.db'}")
    broker = start_broker(port=settings.port)
    dagster_proc = launcher = producer = service = loop = None
    summary: dict = {}
    try:
        servers = broker.bootstrap_servers
        source = KafkaSource(servers, (TOPIC,), GROUP, request_timeout_ms=3000)
        # Offsets are committed at checkpoints: one a trace minute, or lag would read up to the interval x speed-up.
        trainer = TrainerSettings(source, str(home / "checkpoints"), batch_size=64, emulate_gpu_rate=settings.worker_rate,
                                  checkpoint_every_s=max(60 / speed, 0.5))
        # A standby for every worker the policy may add; stopped workers rejoin the pool.
        launcher = LocalLauncher(trainer, pool_size=settings.max_workers, max_workers=settings.max_workers)
        service = LauncherService(launcher, port=0).start()  # Dagster's rescale runs reach the same workers
        first = model.min_workers_for(float(history_in["rate"].iloc[0]) * speed, settings.max_workers)
        if settings.dagster:
            dagster_proc = _start_dagster(settings, home, servers, service.url)
            print(f"Dagster UI: http://127.0.0.1:{settings.ui_port}  (pipeline 'demo'; log in {home / 'dagster-dev.log'})", file=out)
        print(f"broker {servers}; one day in {settings.day_minutes:g} min ({speed:.0f}x); starting {first} trainer workers, "
              f"each EMULATING one GPU at {settings.worker_rate:g} samples/s", file=out, flush=True)
        # Standbys importing torch would slow the first trace hour into a backlog: the day starts when they are warm.
        launcher.wait_warm()
        # Two partitions per worker at most: a worker that owns none trains only forwarded samples.
        partitions = 2 * settings.max_workers
        ensure_topic(servers, TOPIC, partitions=partitions)  # before the workers look for its partitions
        replay_settings = ReplaySettings(topic=TOPIC, speedup=speed, partitions=partitions, hot_share=0.4, seed=settings.seed)
        producer = replay_in_background(servers, history_in, replay_settings, stop)
        launcher.start(first)
        stream = KafkaStreamResource.from_source(source)

        def replan(record) -> None:
            policy.config = kale_config(record.downtime_s)  # plan with the measured restart cost

        loop = LiveController(stream, launcher, policy, model, history, PIPELINE, forecast_horizon_s=7200 / speed,
                              forecast_halflife_s=1800 / speed, on_rescale=replan)
        started, last_decision = time.monotonic(), "none yet"
        lag_samples, worker_samples = [], []
        while not stop.is_set() and producer.is_alive():
            if max_wall_s is not None and time.monotonic() - started > max_wall_s:
                break
            tick_start = time.monotonic()
            try:
                tick = loop.tick()
            except Exception as exc:  # keep the demo alive through a hiccup
                print(f"\ntelemetry skipped: {exc}", file=out)
                stop.wait(policy.sync_period_s)
                continue
            if tick.record is not None:
                last_decision = f"{tick.record.from_workers}->{tick.record.to_workers} in {tick.record.downtime_s:.1f} s: {tick.record.reason[:60]}"
            lag_samples.append(tick.time_lag_s * speed / 60)
            worker_samples.append(tick.workers)
            rate = launcher.throughput()["total"]
            status = (
                f"\rday {(time.monotonic() - started) * speed / 3600:5.2f} h | arrivals {tick.arrival_rate:5.0f}/s | "
                f"lag {tick.time_lag_s * speed / 60:5.1f} min (trace) | workers {tick.workers} training {rate:4.0f}/s (emulated GPUs) "
                f"| last: {last_decision}"
            )
            print(status[:200].ljust(200), end="", file=out, flush=True)
            stop.wait(max(policy.sync_period_s - (time.monotonic() - tick_start), 0.05))
        summary = {
            "rescales": len(launcher.records) - 1,
            "median_downtime_s": float(np.median([r.downtime_s for r in launcher.records[1:]])) if len(launcher.records) > 1 else 0.0,
            "max_lag_trace_minutes": max(lag_samples, default=0.0),
            "mean_workers": float(np.mean(worker_samples)) if worker_samples else 0.0,
        }
        print(f"\nsummary: {summary}", file=out)
    finally:
        stop.set()
        if service is not None:
            service.close()
        if loop is not None:
            with contextlib.suppress(Exception):  # a failed last rescale is already reported
                loop.wait_idle(120)
            loop.close()
        if launcher is not None:
            launcher.stop()
        if producer is not None:
            producer.join(timeout=10)
        stop_process_group(dagster_proc, 20.0)
        broker.stop()
        history.dispose()
    return summary
