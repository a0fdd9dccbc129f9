"""End-to-end: the running system (broker, producer, torch workers on EMULATED GPUs, telemetry,
policy, pause-and-restart launcher) under Kale and under HPA, on the same compressed trace,
against the simulator's prediction made before the runs.

1. Calibration, as Kale's throughput model is fitted (the paper's section 3.3): the trainer is
   run saturated at 1, 2, 4 and 6 workers (F(w) fitted on what they deliver), and at 40% of
   the emulated cap (the trainer's latency before a sample can be committed: queueing and a
   synchronous step, which grow with the group on this 2-core host); the rescales in between,
   made under that load, give the restart time.
2. The simulator predicts both policies' metrics from the calibration alone; the bench says
   whether each prediction agrees with the measured medians within TOLERANCE.
3. Live runs: twelve hours of the synthetic day (06:00-18:00, the morning ramp) replayed 120x
   faster (6 wall minutes per policy).  Every duration is divided by the speed-up: the
   policies' windows, the forecaster's horizon and half-life, and the trainer's checkpoint
   interval (offsets are committed at checkpoints; the simulator models that cadence).  The
   loop and both policies act once a trace minute (HPA's sync period is 15 s by default; a
   minute here, in the simulator too).  Workers start (from warm standbys) as the producer
   does, and the first WARMUP_MIN trace minutes are not scored, in the simulator neither.
   Metrics are the paper's, in trace units, from the time lag (record timestamps) read at
   every tick, restarts included (a rescale runs in the background, as a Dagster run does),
   each reading weighted by the time until the next.

Restarts: besides the GPU cap, the workers EMULATE a large model's restore (RESTORE_TRACE_S),
so a restart takes about the paper's 10 minutes against its 20-minute SLO.  This host's own
restart is about a second (2 trace minutes): with restarts that cheap, reacting late costs
little and the comparison would not be the paper's.

    python bench/end_to_end.py [--speedup 120] [--hours 12] [--policies kale,hpa] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from kale_dagster.control.live import LiveController
from kale_dagster.definitions.resources import KafkaStreamResource
from kale_dagster.forecast import make_forecaster
from kale_dagster.stream.source import KafkaSource
from kale_dagster.launchers import LocalLauncher, TrainerSettings
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.policies import HPABehavior, HPAPolicy, HPAScalingPolicy, HPAScalingRules, KaleConfig, KalePolicy
from kale_dagster.sim.metrics import score_readings
from kale_dagster.sim.simulate import SimConfig, simulate
from kale_dagster.sim.trace import synth_trace
from kale_dagster.stream.broker import embedded_broker
from kale_dagster.stream.history import MetricsHistory
from kale_dagster.stream.producer import ReplaySettings, ensure_topic, replay_in_background

TOPIC, GROUP = "samples", "trainer"
WORKER_RATE = 150.0  # EMULATED samples per wall second per worker
MAX_WORKERS = 6
PARTITIONS = 12  # every worker count up to MAX_WORKERS owns partitions (a worker without one trains only forwarded samples)
SAMPLES_PER_RECORD = 8  # micro-batches, as a high-rate stream ships them: the host's CPU goes to the workers, not to parsing records
PEAK_WALL_RATE = 500.0  # the peak needs 5 of the 6 workers the host can feed (calibration)
SLO_MIN = 20.0
WARMUP_MIN = 30
CHECKPOINT_TRACE_S = 120.0  # offsets are committed at checkpoints; 1 wall second at 120x
# EMULATION, like the GPU cap: restoring a large model.  With it a restart takes about the paper's
# 10 minutes (1B parameters) against its 20-minute SLO; this host's own restart is ~1 s (2 trace min).
RESTORE_TRACE_S = 480.0
# How close the simulator's prediction must be to the measured medians to count as agreeing.
TOLERANCE = 0.25  # relative, on accumulated lag and worker-hours
SLO_TOLERANCE = 0.10  # absolute, on the SLO violation rate


def segment(hours: float) -> pd.DataFrame:
    day = synth_trace(days=1, seed=0, step_s=60, peak_rate=1.0)
    part = day.iloc[6 * 60 : int((6 + hours) * 60)].reset_index(drop=True)
    rate = part["value"] / 60.0
    return pd.DataFrame({"timestamp": pd.to_datetime(part["timestamp"], utc=True), "rate": rate / rate.max()})


@dataclass(frozen=True)
class Calibration:
    """What profiling the running system measured (wall units): Kale's throughput model and the simulator's inputs."""

    model: ThroughputModel  # F(w) in samples per wall second, fitted on saturated runs (the paper's section 3.3)
    restart_s: float  # median downtime of the profiling rescales
    latency_s: float  # the trainer's latency before a sample can be committed: latency_s + latency_per_worker_s * w
    latency_per_worker_s: float
    points: tuple  # (workers, samples/s, latency s) as measured

    @classmethod
    def from_measurements(cls, points, restart_s: float) -> "Calibration":
        ws, rates, latencies = (np.array(x, dtype=float) for x in zip(*points))
        per_worker, fixed = np.polyfit(ws, latencies, 1)
        return cls(ThroughputModel.fit(ws, rates, form="async"), restart_s, max(float(fixed), 0.0), max(float(per_worker), 0.0), tuple(map(tuple, points)))

    def save(self, path: str) -> None:
        Path(path).write_text(json.dumps({"points": self.points, "restart_s": self.restart_s}, indent=1))

    @classmethod
    def load(cls, path: str) -> "Calibration":
        saved = json.loads(Path(path).read_text())
        return cls.from_measurements(saved["points"], saved["restart_s"])


def trainer_settings(servers: str, home: str, speed: float) -> TrainerSettings:
    return TrainerSettings(KafkaSource(servers, (TOPIC,), GROUP), f"{home}/ckpt", batch_size=64, emulate_gpu_rate=WORKER_RATE,
                           emulate_restore_s=RESTORE_TRACE_S / speed,
                           checkpoint_every_s=CHECKPOINT_TRACE_S / speed, metrics_every_s=60 / speed)


def replay_settings(speed: float = 1.0) -> ReplaySettings:
    return ReplaySettings(topic=TOPIC, speedup=speed, partitions=PARTITIONS, samples_per_record=SAMPLES_PER_RECORD)


def stream_resource(servers: str) -> KafkaStreamResource:
    return KafkaStreamResource(bootstrap_servers=servers, topics=[TOPIC], group_id=GROUP, request_timeout_ms=3000, samples_per_record=SAMPLES_PER_RECORD)


def _produce(servers: str, rate: float, seconds: float, stop: Optional[threading.Event] = None) -> threading.Thread:
    history = pd.DataFrame({"timestamp": pd.date_range("2026-01-01", periods=2, freq="1min", tz="UTC"), "rate": rate})
    return replay_in_background(servers, history, replay_settings(), stop or threading.Event(), max_wall_s=seconds)


def _readings(read, skip_s: float, seconds: float) -> list:
    time.sleep(skip_s)
    readings, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        readings.append(read())
        time.sleep(0.25)
    return readings


def calibrate(speed: float, counts=(1, 2, 4, MAX_WORKERS)) -> Calibration:
    """Profile the system at each worker count: latency while keeping up (at 40% of the EMULATED
    cap), throughput while saturated (arrivals at twice the cap), and the restarts in between."""
    points, restarts = [], []
    with embedded_broker() as broker:
        servers = broker.bootstrap_servers
        ensure_topic(servers, TOPIC, PARTITIONS)
        launcher = LocalLauncher(trainer_settings(servers, tempfile.mkdtemp(prefix="kale-cal-"), speed), pool_size=MAX_WORKERS, max_workers=MAX_WORKERS)
        stream = stream_resource(servers)
        try:
            launcher.wait_warm()
            for w in counts:
                # Restarts under load, as in the runs: the keep-up stream starts first.
                stop = threading.Event()
                keep_up = _produce(servers, 0.4 * WORKER_RATE * w, 120.0, stop)
                record = launcher.rescale(w) if launcher.workers else launcher.start(w)
                if len(launcher.records) > 1:
                    restarts.append(record.downtime_s)
                launcher.wait_warm()
                # Latency once the restart's backlog has drained.
                lags = _readings(lambda: stream.snapshot(fetch_timeout_s=1.0).time_lag_s, 4.0 + RESTORE_TRACE_S / speed, 6.0)
                stop.set()
                keep_up.join()
                saturate = _produce(servers, 2.0 * WORKER_RATE * w, 8.0)
                rates = _readings(lambda: launcher.throughput()["total"], 3.0, 5.0)
                saturate.join()
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and stream.snapshot(fetch_timeout_s=1.0).sample_lag > 0.2 * WORKER_RATE * w:
                    time.sleep(0.5)  # drain before the next count
                # The sawtooth of commits at checkpoints is modelled on its own: half an interval on average.
                points.append((w, float(np.median(rates)), max(float(np.median(lags)) - CHECKPOINT_TRACE_S / speed / 2, 0.0)))
                print(f"calibration: {w} workers: {points[-1][1]:.0f} samples/s saturated, latency {points[-1][2]:.2f} s", flush=True)
        finally:
            launcher.stop()
    return Calibration.from_measurements(points, float(np.median(restarts)))


def in_trace_units(model: ThroughputModel, speed: float) -> ThroughputModel:
    """F(w) in samples per trace second: an async model's rate divides by the speed-up when theta is multiplied by it."""
    return ThroughputModel.asynchronous(tuple(t * speed for t in model.theta))


def kale(speed: float, model: ThroughputModel, restart_s: float, trace_units: bool = False) -> KalePolicy:
    k = 1.0 if trace_units else speed
    cfg = KaleConfig(min_workers=1, max_workers=MAX_WORKERS, slo_s=SLO_MIN * 60 / k, restart_s=restart_s, plan_step_s=600 / k,
                     tau_s=600 / k, sync_period_s=60 / k, projection_tick_s=300 / k, lag_weight=KaleConfig.lag_weight * k)
    return KalePolicy(in_trace_units(model, speed) if trace_units else model, cfg)


def hpa(speed: float, trace_units: bool = False) -> HPAPolicy:
    k = 1.0 if trace_units else speed
    behavior = HPABehavior(
        # Upstream defaults, in the same trace time live and simulated (no rounding to whole wall seconds).
        scale_up=HPAScalingRules(0, (HPAScalingPolicy("Pods", 4, 15 / k), HPAScalingPolicy("Percent", 100, 15 / k))),
        scale_down=HPAScalingRules(300 / k, (HPAScalingPolicy("Percent", 100, 15 / k),)),
    )
    return HPAPolicy(min_replicas=1, max_replicas=MAX_WORKERS, target_utilization=80, behavior=behavior, sync_period_s=60 / k)


def run_live(name: str, shape: pd.DataFrame, speed: float, cal: Calibration, timeline_csv: str) -> tuple[dict, float]:
    """Measured metrics and median restart (wall s) of one live run."""
    history_in = shape.assign(rate=shape["rate"] * PEAK_WALL_RATE / speed)
    tick_wall = 60.0 / speed  # one trace minute
    with embedded_broker() as broker:
        servers = broker.bootstrap_servers
        home = tempfile.mkdtemp(prefix="kale-e2e-")
        # A standby for every worker: a scale-up by several workers is as warm as one by a single worker.
        launcher = LocalLauncher(trainer_settings(servers, home, speed), pool_size=MAX_WORKERS, max_workers=MAX_WORKERS)
        policy = kale(speed, cal.model, cal.restart_s) if name == "kale" else hpa(speed)
        history = MetricsHistory(f"sqlite:///{home}/m.db")

        def replan(record):
            if name == "kale":
                policy.config = kale(speed, cal.model, record.downtime_s).config

        loop = LiveController(stream_resource(servers),
                              launcher, policy, cal.model, history, "e2e", forecast_horizon_s=7200 / speed, forecast_halflife_s=1800 / speed,
                              on_rescale=replan, learn_capacity=False)  # Kale plans with the profiled model, as the simulator does
        stop = threading.Event()
        times, lags, workers, downs, rows = [], [], [], [], []
        try:
            ensure_topic(servers, TOPIC, PARTITIONS)
            launcher.wait_warm()  # standbys importing torch would slow the first minutes
            producer = replay_in_background(servers, history_in, replay_settings(speed), stop)
            t0 = time.monotonic()
            launcher.start(cal.model.min_workers_for(float(history_in["rate"].iloc[0]) * speed, MAX_WORKERS))
            while producer.is_alive():
                started = time.monotonic()
                tick = loop.tick()
                trace_min = (started - t0) * speed / 60
                rows.append((round(trace_min, 2), round(tick.arrival_rate, 1), round(tick.time_lag_s * speed / 60, 2), tick.sample_lag,
                             tick.workers, tick.restarting, tick.decision.workers, tick.decision.reason[:160]))
                if trace_min >= WARMUP_MIN:
                    if tick.record is not None:
                        downs.append(tick.record.downtime_s)  # a restart that ended since the last tick
                    times.append(trace_min)
                    lags.append(tick.time_lag_s * speed / 60)
                    workers.append(tick.workers)
                time.sleep(max(tick_wall - (time.monotonic() - started), 0.0))
            end_trace_min = (time.monotonic() - t0) * speed / 60
        finally:
            stop.set()
            loop.wait_idle(120)
            loop.close()
            launcher.stop()
            history.dispose()
            pd.DataFrame(rows, columns=["trace_min", "arrival_per_s", "lag_min", "sample_lag", "workers", "restarting", "decided", "reason"]).to_csv(timeline_csv, index=False)
    result = score_readings(times, np.asarray(lags) * 60, workers, end_trace_min, SLO_MIN * 60, sum(downs) * speed / 60, len(downs)).to_json()
    return result, statistics.median(downs) if downs else float("nan")


def run_sim(name: str, shape: pd.DataFrame, speed: float, cal: Calibration) -> dict:
    """The simulator's prediction for the same run, in trace units, from the calibration alone."""
    rates = (shape["rate"] * PEAK_WALL_RATE / speed).to_numpy()
    policy = kale(speed, cal.model, cal.restart_s * speed, trace_units=True) if name == "kale" else hpa(speed, trace_units=True)
    cfg = SimConfig(restart_s=cal.restart_s * speed, slo_s=SLO_MIN * 60, max_workers=MAX_WORKERS, warmup_steps=WARMUP_MIN,
                    forecast_every_s=60, refit_every_s=60, forecast_horizon_s=7200, commit_interval_s=CHECKPOINT_TRACE_S,
                    pipeline_latency_s=cal.latency_s * speed, pipeline_latency_per_worker_s=cal.latency_per_worker_s * speed,
                    metrics_window_s=60)  # the workers report every trace minute, from their first step
    factory = (lambda: make_forecaster("ewma", halflife_s=1800.0)) if name == "kale" else None
    return simulate(rates, pd.DatetimeIndex(shape["timestamp"]), policy, in_trace_units(cal.model, speed), cfg, forecaster_factory=factory).metrics.to_json()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speedup", type=float, default=120.0)
    parser.add_argument("--hours", type=float, default=12.0)
    parser.add_argument("--policies", default="kale,hpa")
    parser.add_argument("--timeline-dir", default="artifacts/e2e", help="per-tick CSV of each live run, and the calibration")
    parser.add_argument("--repeats", type=int, default=1, help="live runs per policy (medians are reported)")
    parser.add_argument("--calibration", help="reuse a saved calibration.json instead of profiling (the same host and settings)")
    args = parser.parse_args()
    shape = segment(args.hours)
    keys = ("accumulated_lag_minutes", "slo_violation_rate", "downtime_minutes", "gpu_hours", "rescales", "max_lag_minutes")
    names = args.policies.split(",")
    unknown = set(names) - {"kale", "hpa"}
    if unknown:
        parser.error(f"--policies: unknown {', '.join(sorted(unknown))}; this bench runs kale and hpa")
    Path(args.timeline_dir).mkdir(parents=True, exist_ok=True)
    cal = Calibration.load(args.calibration) if args.calibration else calibrate(args.speedup)
    cal.save(f"{args.timeline_dir}/calibration.json")
    print(f"calibration: F(w) = w / ({' + '.join(f'{t:.3g}' + x for t, x in zip(cal.model.theta, ('', '/w', '*w')))}) "
          f"(fit MAPE {cal.model.fit_mape:.1f}%); restart median {cal.restart_s:.2f} s; "
          f"latency {cal.latency_s:.2f} s + {cal.latency_per_worker_s:.2f} s per worker", flush=True)
    simulated = {name: run_sim(name, shape, args.speedup, cal) for name in names}
    runs: dict = {name: [] for name in names}
    for r in range(args.repeats):
        for name in names:
            suffix = f"-{r + 1}" if args.repeats > 1 else ""
            result, restart = run_live(name, shape, args.speedup, cal, f"{args.timeline_dir}/{name}{suffix}.csv")
            runs[name].append(result)
            print(f"{name} run {r + 1}: " + ", ".join(f"{k} {result[k]:.3g}" for k in keys) +
                  f"; median restart {restart:.2f} s wall = {restart * args.speedup / 60:.1f} trace min", flush=True)
    measured = {name: {k: float(np.median([run[k] for run in runs[name]])) for k in keys} for name in names}
    print(f"\n{'(medians of ' + str(args.repeats) + ')':<16}" + "".join(f"{k[:14]:>16}" for k in keys))
    for name in names:
        for label, m in (("measured", measured[name]), ("simulated", simulated[name])):
            print(f"{name + ' ' + label:<16}" + "".join(f"{m[k]:>16.3f}" for k in keys))
    if {"kale", "hpa"} <= set(names):
        k, h = measured["kale"], measured["hpa"]
        print("\nmeasured Kale / HPA: " + ", ".join(f"{key} {k[key] / h[key]:.2f}x" for key in ("accumulated_lag_minutes", "downtime_minutes", "gpu_hours") if h[key])
              + f"; SLO violation {k['slo_violation_rate']:.1%} vs {h['slo_violation_rate']:.1%}")
    print(f"\nsimulator vs measured (tolerance: accumulated lag and worker-hours within {TOLERANCE:.0%}, SLO violation within {SLO_TOLERANCE:.0%} points):")
    for name in names:
        m, s = measured[name], simulated[name]
        checks = [(key, s[key] / m[key] - 1) for key in ("accumulated_lag_minutes", "gpu_hours") if m[key]]
        ok = all(abs(err) <= TOLERANCE for _, err in checks) and abs(s["slo_violation_rate"] - m["slo_violation_rate"]) <= SLO_TOLERANCE
        print(f"  {name}: " + ", ".join(f"{key} {err:+.0%}" for key, err in checks)
              + f", SLO violation {s['slo_violation_rate']:.1%} vs {m['slo_violation_rate']:.1%}, rescales {s['rescales']} vs {m['rescales']:.0f}: "
              + ("agrees" if ok else "DISAGREES"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
