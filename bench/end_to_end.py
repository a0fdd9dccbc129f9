"""End-to-end: the running system (broker, producer, torch workers on EMULATED GPUs, telemetry,
policy, pause-and-restart launcher) under Kale and under HPA, on the same compressed trace,
against the simulator's prediction for the same settings.

Twelve hours of the synthetic day (06:00-18:00, the morning ramp) are replayed 120x faster
(6 wall minutes per policy).  Every duration is divided by the speed-up: the policies' windows,
the forecaster's horizon and half-life, and the trainer's checkpoint interval (offsets are
committed at checkpoints, so a 5 s interval would read as 10 trace minutes of lag).  The
restart time is what the launcher measures.  The loop and both policies act once a trace
minute (HPA's sync period is 15 s by default; a minute here, in the simulator too).  Workers
start (from warm standbys) as the producer does, and the first WARMUP_MIN trace minutes (their start-up
backlog) are not scored, in the simulator neither.  Metrics are the paper's,
computed from the time lag measured each trace minute (record timestamps), in trace units.

The simulator runs the same policies on the same trace with the restart time and the
per-worker rate measured in the live run.

    python bench/end_to_end.py [--speedup 120] [--hours 12]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from kale_dagster.broker import embedded_broker
from kale_dagster.history import MetricsHistory
from kale_dagster.launchers import LocalLauncher, TrainerSettings
from kale_dagster.live import LiveController
from kale_dagster.policies import HPABehavior, HPAPolicy, HPAScalingPolicy, HPAScalingRules, KaleConfig, KalePolicy
from kale_dagster.forecast import make_forecaster
from kale_dagster.producer import ReplaySettings, replay
from kale_dagster.resources import KafkaStreamResource
from kale_dagster.simulate import SimConfig, simulate
from kale_dagster.throughput import ThroughputModel
from kale_dagster.trace import synth_trace

WORKER_RATE = 150.0  # EMULATED samples per wall second per worker
MAX_WORKERS = 6
PEAK_WALL_RATE = 600.0
SLO_MIN = 20.0
WARMUP_MIN = 30
CHECKPOINT_TRACE_S = 120.0  # offsets are committed at checkpoints; 1 wall second at 120x


def segment(hours: float) -> pd.DataFrame:
    day = synth_trace(days=1, seed=0, step_s=60, peak_rate=1.0)
    part = day.iloc[6 * 60 : int((6 + hours) * 60)].reset_index(drop=True)
    rate = part["value"] / 60.0
    return pd.DataFrame({"timestamp": pd.to_datetime(part["timestamp"], utc=True), "rate": rate / rate.max()})


def kale(speed: float, restart_s: float, trace_units: bool = False, worker_rate: float = WORKER_RATE) -> KalePolicy:
    k = 1.0 if trace_units else speed
    model = ThroughputModel.linear(worker_rate / (speed if trace_units else 1.0))
    cfg = KaleConfig(min_workers=1, max_workers=MAX_WORKERS, slo_s=SLO_MIN * 60 / k, restart_s=restart_s, plan_step_s=600 / k,
                     tau_s=600 / k, sync_period_s=60 / k, projection_tick_s=300 / k, lag_weight=KaleConfig.lag_weight * k)
    return KalePolicy(model, cfg)


def hpa(speed: float, trace_units: bool = False) -> HPAPolicy:
    k = 1.0 if trace_units else speed
    behavior = HPABehavior(
        scale_up=HPAScalingRules(0, (HPAScalingPolicy("Pods", 4, max(int(15 / k), 1)), HPAScalingPolicy("Percent", 100, max(int(15 / k), 1)))),
        scale_down=HPAScalingRules(int(300 / k), (HPAScalingPolicy("Percent", 100, max(int(15 / k), 1)),)),
    )
    return HPAPolicy(min_replicas=1, max_replicas=MAX_WORKERS, target_utilization=80, behavior=behavior, sync_period_s=60 / k)


def metrics(lags_min, workers, tick_trace_min: float, downtime_trace_min: float, rescales: int) -> dict:
    lags = np.asarray(lags_min)
    return {
        "accumulated_lag_minutes": float(lags.sum() * tick_trace_min),
        "slo_violation_rate": float(np.mean(lags > SLO_MIN)) if len(lags) else 0.0,
        "downtime_minutes": downtime_trace_min,
        "gpu_hours": float(np.sum(workers) * tick_trace_min / 60),
        "rescales": rescales,
        "max_lag_minutes": float(lags.max()) if len(lags) else 0.0,
    }


def run_live(name: str, shape: pd.DataFrame, speed: float, timeline_csv: str) -> tuple[dict, float, float]:
    """Measured metrics, median restart (wall s) and per-worker rate (samples per wall s) of one live run."""
    history_in = shape.assign(rate=shape["rate"] * PEAK_WALL_RATE / speed)
    tick_wall = 60.0 / speed  # one trace minute
    with embedded_broker() as broker:
        servers = broker.bootstrap_servers
        home = tempfile.mkdtemp(prefix="kale-e2e-")
        # A standby for every worker: a scale-up by several workers is as warm as one by a single worker.
        launcher = LocalLauncher(TrainerSettings(servers, "samples", "trainer", f"{home}/ckpt", batch_size=64, emulate_gpu_rate=WORKER_RATE,
                                                 checkpoint_every_s=CHECKPOINT_TRACE_S / speed), pool_size=MAX_WORKERS)
        model = ThroughputModel.linear(WORKER_RATE)
        policy = kale(speed, 3.0) if name == "kale" else hpa(speed)
        history = MetricsHistory(f"sqlite:///{home}/m.db")

        def replan(record):
            if name == "kale":
                policy.config = kale(speed, record.downtime_s).config

        loop = LiveController(KafkaStreamResource(bootstrap_servers=servers, topics=["samples"], group_id="trainer", request_timeout_ms=3000),
                              launcher, policy, model, history, "e2e", forecast_horizon_s=7200 / speed, forecast_halflife_s=1800 / speed,
                              on_rescale=replan)
        stop = threading.Event()
        producer = threading.Thread(target=replay, args=(servers, history_in, ReplaySettings(topic="samples", speedup=speed, partitions=4)),
                                    kwargs=dict(stop=stop), daemon=True)
        lags, workers, downs, rows = [], [], [], []
        try:
            launcher.wait_warm()  # standbys importing torch would slow the first minutes
            producer.start()
            t0 = time.monotonic()
            launcher.start(model.min_workers_for(float(history_in["rate"].iloc[0]) * speed, MAX_WORKERS))
            while producer.is_alive():
                started = time.monotonic()
                tick = loop.tick()
                trace_min = (started - t0) * speed / 60
                scored = trace_min >= WARMUP_MIN
                rows.append((round(trace_min, 2), round(tick.arrival_rate, 1), round(tick.time_lag_s * speed / 60, 2), tick.sample_lag,
                             tick.workers, tick.decision.workers, tick.decision.reason[:160]))
                if tick.record is not None and scored:
                    downs.append(tick.record.downtime_s)
                if scored:
                    lags.append(tick.time_lag_s * speed / 60)
                    workers.append(tick.workers)
                time.sleep(max(tick_wall - (time.monotonic() - started), 0.0))
        finally:
            stop.set()
            launcher.stop()
            history.dispose()
            pd.DataFrame(rows, columns=["trace_min", "arrival_per_s", "lag_min", "sample_lag", "workers", "decided", "reason"]).to_csv(timeline_csv, index=False)
    measured_tick_trace_min = (len(history_in) - WARMUP_MIN) / max(len(lags), 1)  # slow ticks cover more trace time
    result = metrics(lags, workers, measured_tick_trace_min, sum(downs) * speed / 60, len(downs))
    return result, statistics.median(downs) if downs else 3.0, loop.per_worker_rate or WORKER_RATE


def run_sim(name: str, shape: pd.DataFrame, speed: float, restart_wall_s: float, worker_rate: float) -> dict:
    """The simulator on the same trace, in trace units, with what the live run measured."""
    rates = (shape["rate"] * PEAK_WALL_RATE / speed).to_numpy()
    policy = kale(speed, restart_wall_s * speed, trace_units=True, worker_rate=worker_rate) if name == "kale" else hpa(speed, trace_units=True)
    model = ThroughputModel.linear(worker_rate / speed)
    cfg = SimConfig(restart_s=restart_wall_s * speed, slo_s=SLO_MIN * 60, max_workers=MAX_WORKERS, warmup_steps=WARMUP_MIN,
                    forecast_every_s=60, refit_every_s=60, forecast_horizon_s=7200)
    factory = (lambda: make_forecaster("ewma", halflife_s=1800.0)) if name == "kale" else None
    return simulate(rates, pd.DatetimeIndex(shape["timestamp"]), policy, model, cfg, forecaster_factory=factory).metrics.to_json()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speedup", type=float, default=120.0)
    parser.add_argument("--hours", type=float, default=12.0)
    parser.add_argument("--policies", default="kale,hpa")
    parser.add_argument("--timeline-dir", default="artifacts/e2e", help="per-tick CSV of each live run")
    args = parser.parse_args()
    shape = segment(args.hours)
    keys = ("accumulated_lag_minutes", "slo_violation_rate", "downtime_minutes", "gpu_hours", "rescales", "max_lag_minutes")
    measured, simulated = {}, {}
    names = args.policies.split(",")
    for name in names:
        Path(args.timeline_dir).mkdir(parents=True, exist_ok=True)
        measured[name], restart, rate = run_live(name, shape, args.speedup, f"{args.timeline_dir}/{name}.csv")
        simulated[name] = run_sim(name, shape, args.speedup, restart, rate)
        print(f"{name}: median measured restart {restart:.2f} s wall = {restart * args.speedup / 60:.1f} trace min; "
              f"per-worker rate {rate:.0f} samples/s (EMULATED cap {WORKER_RATE:.0f})", flush=True)
    print(f"\n{'':<14}" + "".join(f"{k[:14]:>16}" for k in keys))
    for name in names:
        for label, m in (("measured", measured[name]), ("simulated", simulated[name])):
            print(f"{name + ' ' + label:<14}" + "".join(f"{m[k]:>16.3f}" if isinstance(m[k], float) else f"{m[k]:>16}" for k in keys))
    if len(names) < 2:
        return 0
    k, h = measured["kale"], measured["hpa"]
    print("\nmeasured Kale / HPA: " + ", ".join(f"{key} {k[key] / h[key]:.2f}x" for key in ("accumulated_lag_minutes", "downtime_minutes", "gpu_hours") if h[key]))
    for name in names:
        m, s = measured[name], simulated[name]
        print(f"{name}: simulated/measured " + ", ".join(f"{key} {s[key] / m[key]:.2f}" for key in ("accumulated_lag_minutes", "gpu_hours", "downtime_minutes") if m[key]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
