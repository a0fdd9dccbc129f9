"""``kale demo``: a compressed diurnal day on the embedded broker, kept sized by Kale through Dagster.

Parts, all real except the GPU: the Tansu broker on loopback; the trace
producer replaying a synthetic day of CTR samples (08:00 to 08:00) into the ``samples``
topic; the torch trainer under the local launcher (data-parallel workers with warm
standbys, pause-and-restart rescales), each worker's throughput capped to
EMULATE one GPU, and its restore slowed to EMULATE a large model's, both
labelled as such; the local trainer service that Dagster's rescale runs
call; and ``dagster dev`` on 127.0.0.1:3000 with the demo's code location.

Dagster is the only controller: its metrics sensor reads the stream, the
Kale policy decides at every reading (a ``gpu_allocation`` materialization
each time), and its rescale runs restart the workers.  This process only
prints what Dagster decided and what runs.

One clock: the pipeline runs on pipeline time (``control.clock``),
``time_scale`` = 1440 / ``day_minutes`` pipeline seconds per wall second,
so the SLO, the plan step, the restart and the forecaster's daily
seasonality mean what they say in a day compressed into minutes.  The
metrics history is seeded with the days before the live one (marked
``seeded``), so the forecast is Prophet's from the first refit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kale_dagster.control.clock import PipelineClock
from kale_dagster.demo import GROUP, PIPELINE, TOPIC
from kale_dagster.demo.definitions import DemoLocation
from kale_dagster.launchers.local import LocalLauncher
from kale_dagster.launchers.service import LauncherService
from kale_dagster.model.limits import Limits
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.processes import stop_process_group
from kale_dagster.sim.trace import START as SYNTH_START
from kale_dagster.sim.trace import synth_trace
from kale_dagster.stream.broker import start_broker
from kale_dagster.stream.history import MetricsHistory
from kale_dagster.stream.producer import ReplaySettings, ensure_topic, replay_in_background
from kale_dagster.stream.source import KafkaSource
from kale_dagster.trainer.settings import TrainerSettings


@dataclass(frozen=True)
class DemoSettings:
    day_minutes: float = 30.0  # wall minutes for one synthetic day
    prior_days: int = 7  # days of history seeded before the live day
    start_hour: float = 8.0  # the live day runs from 08:00 to 08:00: it opens on the morning rise, not a quiet night
    peak_rate: float = 600.0  # samples per wall second at the evening peak: 3-4 workers, what this 2-core host can feed
    worker_rate: float = 200.0  # EMULATED per-worker capacity, samples per wall second
    restore_minutes: float = 8.0  # EMULATED restore of a large model at every restart, pipeline minutes
    max_workers: int = 5  # the demo's limits; the declared restart time is the restore plus a startup
    slo_minutes: float = 20.0  # pipeline time
    seed: int = 0
    port: int = 9092
    ui_port: int = 3000
    home: str = ".kale/demo-home"

    @property
    def time_scale(self) -> float:
        return 1440.0 / self.day_minutes


def write_dagster_yaml(home: Path) -> None:
    """A local instance for the demo: no onboarding pop-up, no usage telemetry (loopback only), and
    runs launched as soon as they are requested (no queue: a rescale should not wait for a dequeue loop)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(
        "nux:\n  enabled: false\ntelemetry:\n  enabled: false\n"
        "run_coordinator:\n  module: dagster.core.run_coordinator\n  class: DefaultRunCoordinator\n"
    )


def start_dagster_dev(home: Path, ui_port: int, log_name: str = "dagster-dev.log") -> subprocess.Popen:
    """``dagster dev`` on the demo's code location, in its own process group (it ignores SIGINT here)."""
    write_dagster_yaml(home)
    log = open(home / log_name, "wb")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dagster",
            "dev",
            "-m",
            "kale_dagster.demo.definitions",
            "-h",
            "127.0.0.1",
            "-p",
            str(ui_port),
        ],
        cwd=home,
        env=dict(os.environ, DAGSTER_HOME=str(home)),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def seed_history(history: MetricsHistory, trace: pd.DataFrame, pipeline_start: float) -> int:
    """Write the trace's rows before ``pipeline_start`` as recorded (and ``seeded``) stream metrics."""
    ts = (pd.to_datetime(trace["timestamp"], utc=True) - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
    rate = trace["value"].to_numpy(float) / 60.0
    rows = pd.DataFrame({"ts": ts, "arrival_rate": rate, "consumption_rate": rate, "sample_lag": 0, "time_lag_s": 0.0})
    return history.seed_stream(PIPELINE, rows[rows["ts"] < pipeline_start])


def decisions(instance) -> list:
    """Every gpu_allocation materialization (each decision, hold or change), oldest first."""
    from dagster import AssetKey

    records, cursor = [], None
    while True:
        page = instance.fetch_materializations(
            AssetKey([PIPELINE, "gpu_allocation"]), limit=10_000, cursor=cursor, ascending=True
        )
        records += page.records
        if not page.has_more:
            return records
        cursor = page.cursor


def latest_decision(instance) -> dict:
    from dagster import AssetKey

    event = instance.get_latest_materialization_event(AssetKey([PIPELINE, "gpu_allocation"]))
    if event is None or event.asset_materialization is None:
        return {}
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def run_demo(
    settings: DemoSettings, stop: threading.Event | None = None, max_wall_s: float | None = None, out=sys.stdout
) -> dict:
    """Run the demo until the day ends, ``stop`` is set, or ``max_wall_s`` passes; returns a summary.

    The phases, in order: the trace (prior days and the live day), a fresh home, the broker and the trainer
    service with warm standbys, Dagster with the seeded history, the producer and the first group, then the
    status line until the day ends, and the summary."""
    stop = stop or threading.Event()
    day = DemoDay.synth(settings)
    home = Path(settings.home).resolve()
    shutil.rmtree(home, ignore_errors=True)  # every demo starts from an empty instance and history
    (home / "kale").mkdir(parents=True)
    demo = _RunningDemo(settings, home, out)
    try:
        demo.start_trainer(day)
        demo.start_dagster(day)
        demo.start_stream(day, stop)
        lags = demo.watch(stop, max_wall_s)
        return demo.summary(lags)
    finally:
        stop.set()
        demo.close()


@dataclass(frozen=True)
class DemoDay:
    """The synthetic trace in pipeline time (samples per pipeline second): the prior days and the live day."""

    trace: pd.DataFrame  # every day, as the trace generator writes it (arrivals per minute)
    live: pd.DataFrame  # the live day as a rate history (timestamp, rate)
    start: float  # the live day's first second, epoch

    @classmethod
    def synth(cls, settings: DemoSettings) -> DemoDay:
        k = settings.time_scale
        first_ts = pd.Timestamp(SYNTH_START) + pd.Timedelta(hours=settings.start_hour)
        trace = synth_trace(
            days=settings.prior_days + 1,
            seed=settings.seed,
            step_s=60,
            peak_rate=settings.peak_rate / k,
            start=str(first_ts),
        )
        live = trace.iloc[-1440:]
        rates = pd.DataFrame(
            {"timestamp": pd.to_datetime(live["timestamp"], utc=True), "rate": live["value"].to_numpy(float) / 60.0}
        )
        return cls(trace, rates, pd.Timestamp(trace["timestamp"].iloc[-1440], tz="UTC").timestamp())


class _RunningDemo:
    """The demo's processes and clients, started phase by phase and closed together."""

    def __init__(self, settings: DemoSettings, home: Path, out):
        self.settings, self.home, self.out = settings, home, out
        self.history = MetricsHistory(f"sqlite:///{home / 'kale' / 'metrics.db'}")  # the pipeline's default there
        self.broker = start_broker(port=settings.port)
        self.servers = self.broker.bootstrap_servers
        # Two partitions per worker at most: a worker that owns none trains only forwarded samples.
        self.partitions = 2 * settings.max_workers
        self.launcher: LocalLauncher | None = None
        self.service: LauncherService | None = None
        self.dagster: subprocess.Popen | None = None
        self.producer: threading.Thread | None = None
        self.instance = None
        self.clock: PipelineClock | None = None
        self.first_workers = 1

    def start_trainer(self, day: DemoDay) -> None:
        """The trainer service with a warm standby for every worker the policy may add (stopped workers rejoin
        the pool), and the topic, created before the workers look for its partitions."""
        s, k = self.settings, self.settings.time_scale
        source = KafkaSource(self.servers, (TOPIC,), GROUP, request_timeout_ms=3000)
        # Offsets are committed at checkpoints: one a pipeline minute, or lag would read up to the interval x time
        # scale.
        trainer = TrainerSettings(
            source,
            str(self.home / "checkpoints"),
            batch_size=64,
            emulate_gpu_rate=s.worker_rate,
            emulate_restore_s=s.restore_minutes * 60 / k,
            checkpoint_every_s=max(60 / k, 0.5),
            metrics_every_s=2.0,
        )
        self.launcher = LocalLauncher(trainer, pool_size=s.max_workers, max_workers=s.max_workers)
        self.service = LauncherService(self.launcher, port=0).start()
        prior = ThroughputModel.linear(s.worker_rate)
        self.first_workers = prior.min_workers_for(float(day.live["rate"].iloc[0]) * k, s.max_workers)
        print(
            f"broker {self.servers}; one day in {s.day_minutes:g} min (time scale {k:g}x: one wall second is {k:g} "
            f"pipeline seconds); {self.first_workers} trainer workers to start, each EMULATING one GPU at "
            f"{s.worker_rate:g} samples/s and a {s.restore_minutes:g}-minute model restore",
            file=self.out,
            flush=True,
        )
        # Standbys importing torch would slow the first hour into a backlog: the day starts when they are warm.
        self.launcher.wait_warm()
        ensure_topic(self.servers, TOPIC, partitions=self.partitions)

    def start_dagster(self, day: DemoDay) -> None:
        """The demo's code location settings, the prior days seeded into the history, and ``dagster dev``."""
        s = self.settings
        assert self.service is not None  # start_trainer first
        location = DemoLocation(
            bootstrap_servers=self.servers,
            trainer_url=self.service.url,
            time_scale=s.time_scale,
            wall_start=time.time(),
            pipeline_start=day.start,
            worker_rate=s.worker_rate,
            limits=Limits(
                max_workers=s.max_workers, slo_minutes=s.slo_minutes, restart_minutes=s.restore_minutes + 2.0
            ),
        )
        location.save(str(self.home))
        self.clock = location.pipeline().clock
        seeded = seed_history(self.history, day.trace, day.start)
        self.dagster = start_dagster_dev(self.home, s.ui_port)
        print(
            f"Dagster UI: http://127.0.0.1:{s.ui_port}  (pipeline 'demo'; {seeded} rows of {s.prior_days} prior days "
            f"seeded; log in {self.home / 'dagster-dev.log'})",
            file=self.out,
            flush=True,
        )

    def start_stream(self, day: DemoDay, stop: threading.Event) -> None:
        """The live day's producer, and the first group of workers."""
        s = self.settings
        assert self.launcher is not None  # start_trainer first
        replay = ReplaySettings(
            topic=TOPIC, speedup=s.time_scale, partitions=self.partitions, hot_share=0.4, seed=s.seed
        )
        self.producer = replay_in_background(self.servers, day.live, replay, stop)
        self.launcher.start(self.first_workers, reason="demo start")
        from dagster import DagsterInstance

        self.instance = DagsterInstance.from_config(str(self.home))

    def watch(self, stop: threading.Event, max_wall_s: float | None) -> list[float]:
        """The status line, once a second, until the day ends; returns the lag (pipeline minutes) it showed."""
        launcher, clock, producer, k = self.launcher, self.clock, self.producer, self.settings.time_scale
        assert launcher is not None and clock is not None and producer is not None  # started
        started, lags = time.monotonic(), []
        while not stop.is_set() and producer.is_alive():
            if max_wall_s is not None and time.monotonic() - started > max_wall_s:
                break
            launcher.supervise_once()  # a crashed worker restarts the group at the same size (not a sizing decision)
            status = launcher.status()
            latest = self.history.stream(PIPELINE, start=clock.now() - 3600)
            lag_min = float(latest["time_lag_s"].iloc[-1]) / 60 if not latest.empty else 0.0
            lags.append(lag_min)
            decision = latest_decision(self.instance)
            decided = f"{decision.get('workers')} ({str(decision.get('reason', ''))[:70]})" if decision else "none yet"
            line = (
                f"\rday {pd.Timestamp(clock.now(), unit='s'):%H:%M} ({k:g}x) | lag {lag_min:5.1f} min | workers "
                f"{status.workers}{' restarting' if status.rescaling else ''} | training "
                f"{status.samples_per_s or 0.0:5.0f}/s (emulated GPUs) | Dagster decided: {decided}"
            )
            print(line[:220].ljust(220), end="", file=self.out, flush=True)
            stop.wait(1.0)
        return lags

    def summary(self, lags: list[float]) -> dict:
        from dagster import DagsterRunStatus, RunsFilter

        assert self.launcher is not None and self.instance is not None  # started
        restarts = [r.downtime_s for r in self.launcher.records[1:]]
        summary = {
            "rescales": len(restarts),
            "median_downtime_s": float(np.median(restarts)) if restarts else 0.0,
            "max_lag_pipeline_minutes": max(lags, default=0.0),
            "decisions": len(decisions(self.instance)),
            "failed_runs": len(self.instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.FAILURE]))),
        }
        print(f"\nsummary: {summary}", file=self.out)
        return summary

    def close(self) -> None:
        if self.service is not None:
            self.service.close()
        if self.launcher is not None:
            self.launcher.stop()
        if self.producer is not None:
            self.producer.join(timeout=10)
        stop_process_group(self.dagster, 20.0)
        if self.instance is not None:
            self.instance.dispose()
        self.broker.stop()
        self.history.dispose()
