"""End-to-end through Dagster: the running system (broker, producer, torch workers on EMULATED GPUs,
the demo's code location under `dagster dev`: metrics sensor, controller, rescale runs) under Kale, the
default HPA and a tuned HPA on the same compressed trace, against the simulator's prediction.

1. Calibration, as Kale's throughput model is fitted (the paper's section 3.3): the trainer is run
   saturated at 1, 2, 4 and 6 workers (F(w) fitted on what they deliver), and at 40% of the
   emulated cap (the trainer's latency before a sample can be committed); the rescales in between,
   made under that load, give the restart time.  The calibration is recorded in each run's
   throughput history, as profiling runs are in production.
2. The tuned HPA is the best setting of a small sweep in the simulator (target utilization x
   scale-down window x scale-down rate), by the cost Kale minimises (GPU-minutes + 8 x lag-minutes
   + 100 x minutes above the SLO).
3. The simulator predicts each policy's metrics from the calibration alone: per metric, the median of
   several simulated worlds (random restart times and throughput measurements), judged against the
   live medians and beside the live runs' own spread.
4. Live runs: HOURS of the synthetic day from 06:00 (the morning ramp), compressed SPEED times, the
   seven days before them seeded into the metrics history (so the forecast is Prophet's).  Dagster is
   the only controller: its metrics sensor decides at every reading (one tick every 5 wall seconds,
   Dagster's sensor loop) and requests rescale runs.  The first WARMUP_MIN trace minutes are not
   scored, in the simulator neither.  Metrics are the paper's, in trace units, from the metrics
   history the sensor wrote (time lag and workers at each reading, each held until the next).
5. Dagster's own cost: the tick period, the decision-to-rescale latency (from the decision to the
   rescale run's start, and to the new group's first step) and the CPU share of the daemon, the
   webserver, the code server and the runs.

Restarts: besides the GPU cap, the workers EMULATE a large model's restore (RESTORE_TRACE_S), so a
restart takes about the paper's 10 minutes against its 20-minute SLO.

    python bench/end_to_end.py [--speedup 40] [--hours 6] [--policies kale,hpa,hpa-tuned] [--repeats 3]
    # Re-predict, reusing the saved runs (a cut-short bench resumes: the runs missing, or of another tuned
    # HPA, run live)
    python bench/end_to_end.py --calibration artifacts/e2e/calibration.json --runs-from artifacts/e2e/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kale_dagster.control.controller import Controller, ControlSettings
from kale_dagster.definitions.decision import RescaleConfig
from kale_dagster.definitions.resources import KafkaStreamResource
from kale_dagster.demo import GROUP, PIPELINE, TOPIC
from kale_dagster.demo.definitions import DemoLocation
from kale_dagster.demo.run import decisions, start_dagster_dev
from kale_dagster.forecast import make_forecaster
from kale_dagster.launchers import LocalLauncher, TrainerSettings
from kale_dagster.launchers.service import LauncherService
from kale_dagster.model.limits import Limits
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.policies import POLICIES
from kale_dagster.processes import stop_process_group
from kale_dagster.sim.metrics import score_readings
from kale_dagster.sim.simulate import ForecastFeed, SimConfig, simulate
from kale_dagster.sim.trace import synth_trace
from kale_dagster.stream.broker import embedded_broker, free_loopback_port
from kale_dagster.stream.history import MetricsHistory
from kale_dagster.stream.producer import ReplaySettings, ensure_topic, replay_in_background
from kale_dagster.stream.source import KafkaSource

WORKER_RATE = 150.0  # EMULATED samples per wall second per worker
MAX_WORKERS = 6
PARTITIONS = (
    12  # every worker count up to MAX_WORKERS owns partitions (a worker without one trains only forwarded samples)
)
SAMPLES_PER_RECORD = (
    8  # micro-batches, as a high-rate stream ships them: the host's CPU goes to the workers, not to parsing records
)
PEAK_WALL_RATE = 500.0  # the segment's peak needs 5 of the 6 workers the host can feed (calibration)
PRIOR_DAYS = 7
SLO_MIN = 20.0
WARMUP_MIN = 30
TICK_WALL_S = 5.0  # Dagster's sensor daemon evaluates a sensor at most every 5 s
CHECKPOINT_TRACE_S = 120.0  # offsets are committed at checkpoints
METRICS_WALL_S = 2.0  # each worker reports its busy share over windows this long (what utilization reads)
SATURATED_READ_S = 10.0  # calibration: wall seconds of saturated windows read per worker count
#: Wall seconds from a decision to its rescale run's start: the median this bench measured through Dagster
#: (README Results, 70 rescales); the simulator's prediction acts that late too.
DAGSTER_ACT_WALL_S = 8.1
# EMULATION, like the GPU cap: restoring a large model.  With it a restart takes about the paper's
# 10 minutes (1B parameters) against its 20-minute SLO.
RESTORE_TRACE_S = 480.0
# How close the simulator's prediction must be to the measured medians to count as agreeing.
TOLERANCE = 0.25  # relative, on accumulated lag and worker-hours
SLO_TOLERANCE = 0.10  # absolute, on the SLO violation rate
# The tuned HPA's sweep: target utilization x scale-down stabilization window (s) x scale-down policy.
HPA_SWEEP = {
    "target_utilization": (50, 60, 70, 80),
    "window_s": (300, 1800, 3600),
    "scale_down": ((100, 15), (50, 1800)),  # (percent, period s): upstream's default, and a slow one
}
COST = dict(gpu=1.0, lag=8.0, violation=100.0)  # per minute, as Kale's own cost


def days(hours: float) -> pd.DataFrame:
    """PRIOR_DAYS days and the live segment from 06:00, rates per trace second, scaled so the segment's peak is 1."""
    trace = synth_trace(days=PRIOR_DAYS + 1, seed=0, step_s=60, peak_rate=1.0)
    end = PRIOR_DAYS * 1440 + int((6 + hours) * 60)
    part = trace.iloc[:end].reset_index(drop=True)
    rate = part["value"] / 60.0
    live = rate.iloc[PRIOR_DAYS * 1440 + 360 :]
    return pd.DataFrame({"timestamp": pd.to_datetime(part["timestamp"], utc=True), "rate": rate / live.max()})


def segment_start(frame: pd.DataFrame) -> int:
    return PRIOR_DAYS * 1440 + 360


@dataclass(frozen=True)
class Calibration:
    """What profiling the running system measured (wall units): Kale's throughput model and the simulator's inputs."""

    model: ThroughputModel  # F(w) in samples per wall second, fitted on saturated runs (the paper's section 3.3)
    restart_s: float  # median downtime of the profiling rescales
    latency_s: float  # the trainer's latency before a sample can be committed: latency_s + latency_per_worker_s * w
    latency_per_worker_s: float
    points: tuple  # (workers, samples/s, latency s) as measured

    @classmethod
    def from_measurements(cls, points, restart_s: float) -> Calibration:
        ws, rates, latencies = (np.array(x, dtype=float) for x in zip(*points))
        per_worker, fixed = np.polyfit(ws, latencies, 1)
        return cls(
            ThroughputModel.fit(ws, rates, form="async"),
            restart_s,
            max(float(fixed), 0.0),
            max(float(per_worker), 0.0),
            tuple(map(tuple, points)),
        )

    def save(self, path: str) -> None:
        Path(path).write_text(json.dumps({"points": self.points, "restart_s": self.restart_s}, indent=1))

    @classmethod
    def load(cls, path: str) -> Calibration:
        saved = json.loads(Path(path).read_text())
        return cls.from_measurements(saved["points"], saved["restart_s"])


def source(servers: str) -> KafkaSource:
    return KafkaSource(servers, (TOPIC,), GROUP, request_timeout_ms=3000, samples_per_record=SAMPLES_PER_RECORD)


def trainer_settings(servers: str, home: str, speed: float) -> TrainerSettings:
    return TrainerSettings(
        source(servers),
        f"{home}/ckpt",
        batch_size=64,
        emulate_gpu_rate=WORKER_RATE,
        emulate_restore_s=RESTORE_TRACE_S / speed,
        checkpoint_every_s=CHECKPOINT_TRACE_S / speed,
        metrics_every_s=METRICS_WALL_S,
    )


def replay_settings(speed: float = 1.0) -> ReplaySettings:
    return ReplaySettings(topic=TOPIC, speedup=speed, partitions=PARTITIONS, samples_per_record=SAMPLES_PER_RECORD)


def stream_resource(servers: str) -> KafkaStreamResource:
    return KafkaStreamResource.from_source(source(servers))


def _produce(servers: str, rate: float, seconds: float, stop: threading.Event | None = None) -> threading.Thread:
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
    cap), throughput while saturated (arrivals at twice the cap; the median of the metrics windows in
    which no rank waited for data), and the restarts in between."""
    points, restarts = [], []
    with embedded_broker() as broker:
        servers = broker.bootstrap_servers
        ensure_topic(servers, TOPIC, PARTITIONS)
        launcher = LocalLauncher(
            trainer_settings(servers, tempfile.mkdtemp(prefix="kale-cal-"), speed),
            pool_size=MAX_WORKERS,
            max_workers=MAX_WORKERS,
        )
        stream = stream_resource(servers)
        try:
            launcher.wait_warm()
            for w in counts:
                # Restarts under load, as in the runs: the keep-up stream starts first.
                stop = threading.Event()
                keep_up = _produce(servers, 0.4 * WORKER_RATE * w, 120.0, stop)
                record = launcher.rescale(w) if launcher.workers else launcher.start(w)
                if len(launcher.records) > 1 and record is not None:
                    restarts.append(record.downtime_s)
                launcher.wait_warm()
                # Latency once the restart's backlog has drained.
                lags = _readings(
                    lambda: stream.snapshot(fetch_timeout_s=1.0).time_lag_s, 4.0 + RESTORE_TRACE_S / speed, 6.0
                )
                stop.set()
                keep_up.join()
                # Throughput only from windows in which no rank waited for data (as Kale measures F(w) online), over
                # several windows: one window slowed by a checkpoint or the host must not set the profile.
                saturate = _produce(servers, 2.0 * WORKER_RATE * w, 3.0 + SATURATED_READ_S + 1.0)
                statuses = _readings(launcher.status, 3.0, SATURATED_READ_S)
                rates = [s.samples_per_s for s in statuses if s.saturated and s.samples_per_s is not None]
                saturate.join()
                if not rates:
                    raise RuntimeError(
                        f"calibration: {w} workers never reported a saturated window in {SATURATED_READ_S:.0f} s "
                        "(the producer could not outrun them on this host?)"
                    )
                deadline = time.monotonic() + 60
                while (
                    time.monotonic() < deadline
                    and stream.snapshot(fetch_timeout_s=1.0).sample_lag > 0.2 * WORKER_RATE * w
                ):
                    time.sleep(0.5)  # drain before the next count
                # The sawtooth of commits at checkpoints is modelled on its own: half an interval on average.
                points.append(
                    (w, float(np.median(rates)), max(float(np.median(lags)) - CHECKPOINT_TRACE_S / speed / 2, 0.0))
                )
                print(
                    f"calibration: {w} workers: {points[-1][1]:.0f} samples/s saturated, latency {points[-1][2]:.2f} s",
                    flush=True,
                )
        finally:
            launcher.stop()
    return Calibration.from_measurements(points, float(np.median(restarts)))


def in_trace_units(model: ThroughputModel, speed: float) -> ThroughputModel:
    """F(w) in samples per trace second: an async model's rate divides by the speed-up when theta is multiplied
    by it."""
    return ThroughputModel.asynchronous(tuple(t * speed for t in model.theta))


def tick_s(speed: float) -> float:
    """The controller's cadence in trace seconds: one sensor tick."""
    return TICK_WALL_S * speed


def policy_options(name: str, speed: float, tuned: dict | None = None) -> tuple[str, dict]:
    """(registered policy, its options) for a bench policy name; policies act once per tick, live and simulated."""
    sync = {"sync_period_s": tick_s(speed)}
    if name == "kale":
        return "kale", sync
    if name == "hpa":
        return "hpa", sync
    if name == "hpa-tuned":
        return "hpa", {**sync, **(tuned or {})}
    if name == "static-max":  # over-provisioning: the model-quality ceiling (never stale, never restarted)
        return "static", {"workers": MAX_WORKERS}
    raise SystemExit(f"--policies: unknown {name!r}; this bench runs kale, hpa, hpa-tuned and static-max")


def hpa_setting(target: int, window_s: float, scale_down: tuple) -> dict:
    """HPA options with the behavior written as in an HPA manifest."""
    percent, period = scale_down
    return {
        "target_utilization": target,
        "behavior": {
            "scaleDown": {
                "stabilizationWindowSeconds": window_s,
                "policies": [{"type": "Percent", "value": percent, "periodSeconds": period}],
            }
        },
    }


def first_workers(frame: pd.DataFrame, cal: Calibration) -> int:
    """The group the trace starts with, live and simulated: the fewest workers the calibration says keep up."""
    return cal.model.min_workers_for(float(frame["rate"].iloc[segment_start(frame)]) * PEAK_WALL_RATE, MAX_WORKERS)


def limits(cal: Calibration, speed: float) -> Limits:
    """The pipeline's limits, in trace units: the calibrated restart is what it declares."""
    return Limits(max_workers=MAX_WORKERS, slo_minutes=SLO_MIN, restart_minutes=cal.restart_s * speed / 60)


def sim_config(cal: Calibration, speed: float, warmup: int, initial_workers: int, seed: int = 0) -> SimConfig:
    return SimConfig(
        limits=limits(cal, speed),
        warmup_steps=warmup,
        initial_workers=initial_workers,
        seed=seed,
        forecast_every_s=max(60.0, 60.0 * round(tick_s(speed) / 60)),
        refit_every_s=3600.0,
        forecast_horizon_s=7200,
        commit_interval_s=CHECKPOINT_TRACE_S,
        pipeline_latency_s=cal.latency_s * speed,
        pipeline_latency_per_worker_s=cal.latency_per_worker_s * speed,
        metrics_window_s=METRICS_WALL_S * speed,  # the workers report their busy share over windows this long
        act_latency_s=DAGSTER_ACT_WALL_S * speed,
        profile_workers=tuple(int(w) for w, *_ in cal.points),
    )  # live, the calibration is in the throughput history


def run_sim(
    name: str, frame: pd.DataFrame, speed: float, cal: Calibration, tuned: dict | None = None, seed: int = 0
) -> dict:
    """One simulated run of a policy, in trace units, from the calibration alone.

    As live, the policy acts from the segment's start and the forecaster also sees the seeded prior days.
    """
    policy_name, options = policy_options(name, speed, tuned)
    model = in_trace_units(cal.model, speed)
    start = segment_start(frame)
    trace = frame.assign(rate=frame["rate"] * PEAK_WALL_RATE / speed)
    live, prior = trace.iloc[start:], trace.iloc[:start]
    controller = Controller(
        ControlSettings(
            policy=policy_name,
            limits=limits(cal, speed),
            policy_options=options,
        )
    )
    rates, times, config = (
        live["rate"].to_numpy(),
        pd.DatetimeIndex(live["timestamp"]),
        sim_config(cal, speed, WARMUP_MIN, first_workers(frame, cal), seed),
    )
    forecasts = (
        ForecastFeed(
            lambda: make_forecaster("prophet", horizon_s=7200.0), times, rates, config, prior.reset_index(drop=True)
        )
        if POLICIES[policy_name].uses_forecast
        else None
    )
    result = simulate(rates, times, controller, model, config, forecasts=forecasts)
    return result.metrics.to_json()


def predict(name: str, frame: pd.DataFrame, speed: float, cal: Calibration, tuned: dict | None, seeds: int) -> dict:
    """The simulator's prediction: per metric, the median over ``seeds`` simulated worlds (restart times and
    throughput measurements are random in each, as live), as the live figures are medians of runs."""
    runs = [run_sim(name, frame, speed, cal, tuned, seed) for seed in range(seeds)]
    return {key: float(np.median([m[key] for m in runs])) for key in runs[0]}


def cost(m: dict, hours: float) -> float:
    """Kale's own objective over the scored period, in GPU-minute units."""
    minutes = hours * 60 - WARMUP_MIN
    return (
        COST["gpu"] * m["gpu_hours"] * 60
        + COST["lag"] * m["accumulated_lag_minutes"]
        + COST["violation"] * m["slo_violation_rate"] * minutes
    )


def tune_hpa(frame: pd.DataFrame, speed: float, cal: Calibration, hours: float) -> tuple[dict, list]:
    """The HPA setting with the lowest simulated cost, and every setting's figures."""
    rows = []
    for target in HPA_SWEEP["target_utilization"]:
        for window in HPA_SWEEP["window_s"]:
            for down in HPA_SWEEP["scale_down"]:
                setting = hpa_setting(target, window, down)
                m = run_sim("hpa-tuned", frame, speed, cal, setting)
                rows.append((cost(m, hours), setting, m))
    rows.sort(key=lambda r: r[0])
    return rows[0][1], rows


def _graphql(port: int, query: str, variables: dict) -> dict:
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": variables}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["data"]


def _wait_for_dagster(port: int, timeout: float) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"dagster dev did not answer within {timeout:.0f} s")


def start_sensors(port: int) -> None:
    """Turn the pipeline's sensors on, as an operator would in the UI, at the moment the trace starts."""
    for sensor in (f"{PIPELINE}_stream_metrics", f"{PIPELINE}_run_failure"):
        selector = {
            "repositoryLocationName": "kale_dagster.demo.definitions",
            "repositoryName": "__repository__",
            "sensorName": sensor,
        }
        result = _graphql(
            port, "mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) { __typename } }", {"s": selector}
        )
        if result["startSensor"]["__typename"] != "Sensor":
            raise RuntimeError(f"could not start {sensor}: {result}")


def cpu_seconds(pgid: int) -> dict:
    """CPU seconds (own and reaped children) of the dagster dev process group, by role."""
    roles: dict = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) != pgid:
            continue
        ticks = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        # Runs are children of the code server: their CPU counts there once they are reaped.
        role = (
            "daemon"
            if "_daemon" in cmd or "dagster-daemon" in cmd
            else "webserver"
            if "webserver" in cmd
            else "code server and runs"
            if "grpc" in cmd or "code-server" in cmd or "execute" in cmd
            else "dagster dev"
        )
        roles[role] = roles.get(role, 0.0) + ticks / os.sysconf("SC_CLK_TCK")
    return roles


def run_live(
    name: str, frame: pd.DataFrame, speed: float, cal: Calibration, tuned: dict | None, log_dir: str, label: str
) -> dict:
    """One live run through Dagster; its metrics and Dagster's cost."""
    from dagster import DagsterInstance, RunsFilter

    policy_name, options = policy_options(name, speed, tuned)
    start = segment_start(frame)
    pipeline_start = frame["timestamp"].iloc[start].timestamp()
    live = frame.iloc[start:].assign(rate=lambda f: f["rate"] * PEAK_WALL_RATE / speed)  # per trace second
    prior = frame.iloc[:start]
    home = Path(tempfile.mkdtemp(prefix=f"kale-e2e-{name}-"))
    (home / "kale").mkdir()
    port = free_loopback_port()
    with embedded_broker() as broker:
        servers = broker.bootstrap_servers
        ensure_topic(servers, TOPIC, PARTITIONS)
        launcher = LocalLauncher(
            trainer_settings(servers, str(home), speed), pool_size=MAX_WORKERS, max_workers=MAX_WORKERS
        )
        service = LauncherService(launcher, port=0).start()
        history = MetricsHistory(f"sqlite:///{home / 'kale' / 'metrics.db'}")
        stop, dagster = threading.Event(), None
        first = first_workers(frame, cal)
        try:
            launcher.wait_warm()
            # The group is up (its model restored) before the trace starts, as in the simulator: a cold start's
            # backlog would be a fault of the bench, not of the policy.
            launcher.start(first, reason="bench start")
            wall_start = (
                time.time() + 60
            )  # dagster dev is up well before: the trace, the clock and the sensors start together
            location = DemoLocation(
                bootstrap_servers=servers,
                trainer_url=service.url,
                time_scale=speed,
                wall_start=wall_start,
                pipeline_start=pipeline_start,
                worker_rate=WORKER_RATE,
                limits=limits(cal, speed),
                policy=policy_name,
                policy_options=options,
                samples_per_record=SAMPLES_PER_RECORD,
                autostart=False,
            )
            location.save(str(home))
            ts = (prior["timestamp"] - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
            rate = prior["rate"].to_numpy() * PEAK_WALL_RATE / speed
            history.seed_stream(
                PIPELINE,
                pd.DataFrame(
                    {"ts": ts, "arrival_rate": rate, "consumption_rate": rate, "sample_lag": 0, "time_lag_s": 0.0}
                ),
            )
            for w, samples_per_s, _ in cal.points:  # the profiling runs, as recorded throughput (trace units)
                history.append_throughput(
                    PIPELINE, pipeline_start - 86_400 + w, int(w), samples_per_s / speed, emulated=True
                )
            dagster = start_dagster_dev(home, port)
            _wait_for_dagster(port, 55)
            time.sleep(max(wall_start - time.time(), 0.0))
            producer = replay_in_background(
                servers,
                live,
                ReplaySettings(
                    topic=TOPIC, speedup=speed, partitions=PARTITIONS, samples_per_record=SAMPLES_PER_RECORD
                ),
                stop,
            )
            start_sensors(port)
            cpu_before, cpu_wall = cpu_seconds(dagster.pid), time.monotonic()
            while producer.is_alive():
                launcher.supervise_once()
                time.sleep(1.0)
            cpu_after, cpu_wall = cpu_seconds(dagster.pid), time.monotonic() - cpu_wall
            instance = DagsterInstance.from_config(str(home))
            runs = instance.get_run_records(RunsFilter(job_name=f"{PIPELINE}_rescale"))
            decided = len(decisions(instance))
            failed = [r for r in instance.get_run_records(RunsFilter()) if r.dagster_run.status.value == "FAILURE"]
            instance.dispose()
        finally:
            stop.set()
            service.close()
            launcher.stop()
            stop_process_group(dagster, 30)
        rows = history.stream(PIPELINE)
        history.dispose()
    rows = rows[~rows["seeded"].fillna(False).astype(bool)]
    rows.to_csv(f"{log_dir}/{label}-timeline.csv", index=False)
    clock = location.pipeline().clock
    scored_from = pipeline_start + WARMUP_MIN * 60
    scored = rows[rows["ts"] >= scored_from]
    end_min = (clock.at(wall_start + (len(live) * 60) / speed) - scored_from) / 60
    restarts = [r for r in launcher.records if r.from_workers > 0 and clock.at(r.time) >= scored_from]
    metrics = score_readings(
        (scored["ts"] - scored_from) / 60,
        scored["time_lag_s"],
        scored["workers"].ffill().fillna(first),
        end_min,
        SLO_MIN * 60,
        sum(r.downtime_s for r in restarts) * speed / 60,
        len(restarts),
    ).to_json()
    gaps = np.diff(rows["ts"].to_numpy()) / speed
    configs = [(r, RescaleConfig.of(r.dagster_run.run_config)) for r in runs]
    requested = [(r, c.decided_at, c.workers) for r, c in configs if c.decided_at is not None]
    to_start = [r.start_time - at for r, at, _ in requested if r.start_time]
    to_step = []
    for _, at, target in requested:
        done = [rec.time for rec in launcher.records if rec.to_workers == target and rec.time > at]
        if done:
            to_step.append(min(done) - at)
    cost_of = {role: (cpu_after.get(role, 0.0) - cpu_before.get(role, 0.0)) / cpu_wall for role in cpu_after}
    quality = scored["model_metric"].dropna() if "model_metric" in scored else pd.Series(dtype=float)
    return {
        "metrics": metrics,
        # The trainer's progressive-validation AUC over the scored readings: how stale lag made the model.
        "quality": {"auc_median": float(quality.median()) if len(quality) else None, "readings": int(len(quality))},
        "dagster": {
            "tick_wall_s_median": float(np.median(gaps)),
            "tick_wall_s_p95": float(np.percentile(gaps, 95)),
            "decision_to_run_start_s": to_start,
            "decision_to_first_step_s": to_step,
            "cpu_share_of_one_core": cost_of,
            "decisions": decided,
            "failed_runs": len(failed),
        },
    }


def calibration_record(cal: Calibration) -> dict:
    """The calibration as saved (JSON round-trip), to compare with a saved run's."""
    return json.loads(json.dumps({"points": cal.points, "restart_s": cal.restart_s}))


def code_version() -> str:
    """The git tree of the code a run exercises (the library, its sensors and this bench), marked ``+changes``
    when the working copy differs from it."""
    root = Path(__file__).resolve().parents[1]
    paths = ["kale_dagster", "sensors", "bench/end_to_end.py"]
    tree = subprocess.run(
        ["git", "rev-parse", *(f"HEAD:{path}" for path in paths)], cwd=root, capture_output=True, text=True
    ).stdout.split()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *paths], cwd=root, capture_output=True, text=True)
    return "/".join(t[:12] for t in tree) + ("+changes" if dirty.stdout.strip() else "") if tree else "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speedup", type=float, default=40.0)
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--policies", default="kale,hpa,hpa-tuned")
    parser.add_argument("--out", default="artifacts/e2e", help="timelines, the calibration and results.json")
    parser.add_argument("--repeats", type=int, default=3, help="live runs per policy (medians are reported)")
    parser.add_argument(
        "--calibration", help="reuse a saved calibration.json instead of profiling (the same host and settings)"
    )
    parser.add_argument(
        "--sim-seeds", type=int, default=5, help="simulated worlds per policy (the prediction is their median)"
    )
    parser.add_argument(
        "--runs-from",
        help="reuse the live runs of a saved results.json (its calibration: pass --calibration) "
        "and run live only those missing (up to --repeats per policy)",
    )
    parser.add_argument(
        "--error-band",
        metavar="JSON",
        help="write the simulator's measured error for the savings report (kale_dagster/sim/simulator_error.json)",
    )
    args = parser.parse_args()
    names = args.policies.split(",")
    for name in names:
        policy_options(name, args.speedup)
    frame = days(args.hours)
    keys = (
        "accumulated_lag_minutes",
        "slo_violation_rate",
        "downtime_minutes",
        "gpu_hours",
        "rescales",
        "max_lag_minutes",
    )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    cal = Calibration.load(args.calibration) if args.calibration else calibrate(args.speedup)
    cal.save(f"{args.out}/calibration.json")
    print(
        f"calibration: F(w) = w / ({' + '.join(f'{t:.3g}' + x for t, x in zip(cal.model.theta, ('', '/w', '*w')))}) "
        f"(fit MAPE {cal.model.fit_mape:.1f}%); restart median {cal.restart_s:.2f} s wall = "
        f"{cal.restart_s * args.speedup / 60:.1f} trace min "
        f"(with the {RESTORE_TRACE_S / 60:.0f}-min EMULATED restore); latency {cal.latency_s:.2f} s + "
        f"{cal.latency_per_worker_s:.2f} s per worker",
        flush=True,
    )
    tuned, sweep = tune_hpa(frame, args.speedup, cal, args.hours)
    print(
        "tuned HPA (simulated sweep, lowest GPU-min + 8 x lag-min + 100 x violation-min): " + json.dumps(tuned),
        flush=True,
    )
    for c, setting, m in sweep[:5]:
        print(
            f"  cost {c:9,.0f}: {json.dumps(setting)}: lag {m['accumulated_lag_minutes']:,.0f} min, GPU h "
            f"{m['gpu_hours']:.1f}, SLO {m['slo_violation_rate']:.1%}"
        )
    runs: dict = {name: [] for name in names}
    if args.runs_from:  # checked before the prediction's minutes are spent
        saved = json.loads(Path(args.runs_from).read_text())
        if (saved["speedup"], saved["hours"]) != (args.speedup, args.hours):
            raise SystemExit(f"--runs-from {args.runs_from}: its runs had another speed-up or length; run them again")
        # Runs are comparable only under the same calibration and the same code (what the workers and the control
        # plane ran): anything else is another experiment.
        if saved.get("calibration") != calibration_record(cal):
            raise SystemExit(f"--runs-from {args.runs_from}: its runs had another calibration; run them again")
        if saved.get("code_version") != code_version():
            raise SystemExit(
                f"--runs-from {args.runs_from}: its runs ran code {saved.get('code_version')!r}, this is "
                f"{code_version()!r}; run them again"
            )
        # A policy's saved runs count if they ran the setting predicted now (the tuned HPA may have changed).
        same_setting = {name: name != "hpa-tuned" or saved["tuned_hpa"] == tuned for name in names}
        runs = {name: saved["runs"].get(name, [])[: args.repeats] if same_setting[name] else [] for name in names}
        print("reusing saved runs: " + ", ".join(f"{name} {len(r)}" for name, r in runs.items()), flush=True)
    simulated = {name: predict(name, frame, args.speedup, cal, tuned, args.sim_seeds) for name in names}

    def save(**more) -> None:
        # After every live run too: a long bench that is cut short keeps the runs it finished (--runs-from reads them).
        Path(f"{args.out}/results.json").write_text(
            json.dumps(
                {
                    "speedup": args.speedup,
                    "hours": args.hours,
                    "calibration": calibration_record(cal),
                    "code_version": code_version(),
                    "tuned_hpa": tuned,
                    "sim_seeds": args.sim_seeds,
                    "simulated": simulated,
                    "runs": runs,
                    **more,
                },
                indent=1,
                default=str,
            )
        )

    for r in range(args.repeats):
        for name in names:
            if len(runs[name]) > r:
                continue
            result = run_live(name, frame, args.speedup, cal, tuned, args.out, f"{name}-{r + 1}")
            runs[name].append(result)
            save()
            m, d = result["metrics"], result["dagster"]
            starts = d["decision_to_run_start_s"]
            print(
                f"{name} run {r + 1}: "
                + ", ".join(f"{k} {m[k]:.3g}" for k in keys)
                + f"; ticks {d['tick_wall_s_median']:.1f} s (p95 {d['tick_wall_s_p95']:.1f}); decision->run start "
                + f"{statistics.median(starts) if starts else float('nan'):.1f} s; "
                + f"failed runs {d['failed_runs']}",
                flush=True,
            )
    measured = {name: {k: float(np.median([run["metrics"][k] for run in runs[name]])) for k in keys} for name in names}
    print(
        f"\n{'(medians of ' + str(min(len(r) for r in runs.values())) + ')':<22}"
        + "".join(f"{k[:14]:>16}" for k in keys)
    )
    for name in names:
        for label, m in (("measured", measured[name]), ("simulated", simulated[name])):
            print(f"{name + ' ' + label:<22}" + "".join(f"{m[k]:>16.3f}" for k in keys))
    for base in ("hpa", "hpa-tuned"):
        if {"kale", base} <= set(names):
            k, h = measured["kale"], measured[base]
            print(
                f"\nmeasured Kale / {base}: "
                + ", ".join(
                    f"{key} {k[key] / h[key]:.2f}x"
                    for key in ("accumulated_lag_minutes", "downtime_minutes", "gpu_hours")
                    if h[key]
                )
                + f"; SLO violation {k['slo_violation_rate']:.1%} vs {h['slo_violation_rate']:.1%}"
            )
    quality = {
        name: [run["quality"]["auc_median"] for run in runs[name] if (run.get("quality") or {}).get("auc_median")]
        for name in names
    }
    if any(quality.values()):
        print("\nmodel quality under scaling (progressive-validation AUC, median of runs; worker-hours):")
        ceiling = statistics.median(quality["static-max"]) if quality.get("static-max") else None
        for name in names:
            if quality[name]:
                auc = statistics.median(quality[name])
                versus = f", {auc - ceiling:+.4f} vs static-max" if ceiling is not None else ""
                print(f"  {name:<12} AUC {auc:.4f}{versus}; worker-hours {measured[name]['gpu_hours']:.2f}")
    print(
        f"\nsimulator vs measured (tolerance: accumulated lag and worker-hours within {TOLERANCE:.0%}, SLO violation "
        f"within {SLO_TOLERANCE:.0%} points):"
    )
    for name in names:
        m, s = measured[name], simulated[name]
        checks = [(key, s[key] / m[key] - 1) for key in ("accumulated_lag_minutes", "gpu_hours") if m[key]]
        ok = (
            all(abs(err) <= TOLERANCE for _, err in checks)
            and abs(s["slo_violation_rate"] - m["slo_violation_rate"]) <= SLO_TOLERANCE
        )
        # The live runs' own spread around their median: no prediction can be judged more finely than that.
        spread = {
            key: (
                min(run["metrics"][key] for run in runs[name]) / m[key] - 1,
                max(run["metrics"][key] for run in runs[name]) / m[key] - 1,
            )
            for key, _ in checks
        }
        print(
            f"  {name}: "
            + ", ".join(
                f"{key} {err:+.0%} (live runs {spread[key][0]:+.0%}..{spread[key][1]:+.0%})" for key, err in checks
            )
            + f", SLO violation {s['slo_violation_rate']:.1%} vs {m['slo_violation_rate']:.1%}, rescales "
            f"{s['rescales']} vs {m['rescales']:.0f}: " + ("agrees" if ok else "DISAGREES")
        )
    latency = [x for name in names for run in runs[name] for x in run["dagster"]["decision_to_run_start_s"]]
    to_step = [x for name in names for run in runs[name] for x in run["dagster"]["decision_to_first_step_s"]]
    ticks = [run["dagster"]["tick_wall_s_median"] for name in names for run in runs[name]]
    cpu = {
        role: statistics.median(
            run["dagster"]["cpu_share_of_one_core"].get(role, 0.0) for name in names for run in runs[name]
        )
        for role in ("daemon", "webserver", "code server and runs", "dagster dev")
    }
    print(
        f"\nDagster's cost: tick period median {statistics.median(ticks):.1f} s wall "
        f"({statistics.median(ticks) * args.speedup / 60:.1f} trace min); "
        f"decision -> rescale run start median {np.median(latency):.1f} s, p95 {np.percentile(latency, 95):.1f} s "
        f"({np.median(latency) * args.speedup / 60:.1f} trace min; the simulator acted {DAGSTER_ACT_WALL_S:g} s after "
        "a "
        "decision: "
        "set DAGSTER_ACT_WALL_S to the measured median on a new host); decision -> first step median "
        f"{np.median(to_step):.1f} s; "
        + "CPU share of one core: "
        + ", ".join(f"{role} {share:.0%}" for role, share in cpu.items())
    )
    errors = {
        name: {key: simulated[name][key] / measured[name][key] - 1 for key in ("accumulated_lag_minutes", "gpu_hours")}
        for name in names
        if all(measured[name][key] for key in ("accumulated_lag_minutes", "gpu_hours"))
    }
    save(measured_medians=measured, relative_error=errors)
    if args.error_band:
        # The savings report's band (kale_dagster/sim/simulator_error.json): the policies it simulates, Kale and the
        # tuned HPA; static at the maximum is not one of them.
        reported = {name: errors[name] for name in ("kale", "hpa-tuned") if name in errors}
        band = {"bench": "bench/end_to_end.py", "commit": code_version(), "relative_error": reported}
        Path(args.error_band).write_text(json.dumps(band, indent=1) + "\n")
        print(f"simulator error band written to {args.error_band}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
