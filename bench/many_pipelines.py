"""CPU per metrics-sensor tick with many pipelines on one Dagster instance.

``--pipelines`` advisory pipelines (their workers declared, the EWMA forecaster), each on its own
``--partitions``-partition topic of the embedded broker, share one Dagster instance and one metrics history,
as one code location would.  Each has ``--days`` of readings seeded in the history and a fitted forecaster
saved, as its refit run leaves them; the same trace's next minutes are then produced, a minute a round (each
record standing for 2,000 samples), and each group commits what was produced a round before, as a trainer
that keeps up does.  Every pipeline's sensor is then ticked for ``--rounds`` rounds, as the
daemon ticks it, and the events of each tick are stored on the instance.  The pipelines' clock is compressed
so that a round is one pipeline minute (the default reading interval), so ticks record their decision in the
event log as often as in production.

For each tick, the process CPU time (``time.process_time``) is measured: the sensor's own work plus storing
its events.  The broker runs in another process and is not counted.  The report gives the median and p90 over
the steady rounds; the first round opens the clients and is reported apart.  It also gives the rounds' wall
time and what 100 pipelines at a 1-minute cadence would take of one core.  Target: at most 50 ms of CPU per
pipeline tick.

    python bench/many_pipelines.py [--pipelines 100] [--rounds 12] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from dagster import DagsterInstance, build_sensor_context
from kafka import KafkaConsumer, KafkaProducer
from kafka.structs import OffsetAndMetadata, TopicPartition

from kale_dagster import KafkaSource, OnlineTrainingPipeline, build_definitions
from kale_dagster.control.clock import PipelineClock
from kale_dagster.forecast import make_forecaster
from kale_dagster.launchers import ObservedGroupLauncherConfig
from kale_dagster.sim.trace import synth_trace
from kale_dagster.stream.broker import embedded_broker
from kale_dagster.stream.history import MetricsHistory
from kale_dagster.stream.producer import ensure_topic

SAMPLES_PER_RECORD = 2000


def seeded(history: MetricsHistory, p: OnlineTrainingPipeline, days: float, now: float, seed: int) -> np.ndarray:
    """``days`` of minute readings before ``now``, and a forecaster fitted on them, as a refit run saves it; the
    samples that arrive in each minute after ``now``, the same trace's next day."""
    trace = synth_trace(days=days + 1, step_s=60, seed=seed)["value"].to_numpy(float)
    seeded_minutes = int(days * 1440)
    rate = trace[:seeded_minutes] / 60.0
    ts = now - days * 86_400 + 60.0 * np.arange(seeded_minutes)
    rows = pd.DataFrame({"ts": ts, "arrival_rate": rate, "consumption_rate": rate, "sample_lag": 0, "time_lag_s": 0.0})
    history.seed_stream(p.name, rows)
    model = make_forecaster(p.forecaster, horizon_s=p.forecast_horizon_s).fit(history.arrival_history(p.name))
    history.save_forecaster(p.name, now, {"model": model, "steps": int(p.forecast_horizon_s // 60)})
    return trace[seeded_minutes:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipelines", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--days", type=float, default=7.0, help="days of readings in each pipeline's history")
    parser.add_argument("--round-wall-s", type=float, default=20.0, help="wall seconds a round (a pipeline minute)")
    parser.add_argument("--profile", action="store_true", help="print where the steady rounds' CPU goes")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="kale-many-"))
    clock = PipelineClock(60.0 / args.round_wall_s, wall_start=time.time())
    with embedded_broker() as broker:
        servers = broker.bootstrap_servers
        history_url = f"sqlite:///{home / 'metrics.db'}"
        pipelines = [
            OnlineTrainingPipeline(
                name=f"stream{i:03d}",
                source=KafkaSource(
                    servers, (f"samples{i:03d}",), f"trainer{i:03d}", samples_per_record=SAMPLES_PER_RECORD
                ),
                launcher=ObservedGroupLauncherConfig(workers=4),
                forecaster="ewma",
                advisory=True,
                history_url=history_url,
                clock=clock,
            )
            for i in range(args.pipelines)
        ]
        started = time.time()
        history = MetricsHistory(history_url)
        arriving = []
        for i, p in enumerate(pipelines):
            ensure_topic(servers, p.source.topics[0], args.partitions)
            arriving.append(seeded(history, p, args.days, clock.now(), seed=i))
        print(f"set up {args.pipelines} pipelines in {time.time() - started:.0f} s")
        sensors = []
        for p in pipelines:
            repo = build_definitions(p).get_repository_def()
            sensor = {s.name: s for s in repo.sensor_defs}[f"{p.name}_stream_metrics"]
            sensors.append(sensor)
        producer = KafkaProducer(bootstrap_servers=servers, linger_ms=5)
        # Each pipeline's trainer keeps up: its group commits what was produced, a round later (their time lag
        # is about a minute), as a trainer that commits at checkpoints does.
        trainers = [
            KafkaConsumer(bootstrap_servers=servers, group_id=p.source.group_id, enable_auto_commit=False)
            for p in pipelines
        ]
        produced: list[dict] = [{} for _ in pipelines]
        instance = DagsterInstance.local_temp(str(home))
        cursors: list[str | None] = [None] * len(sensors)
        cpu: list[list[float]] = []
        walls: list[float] = []
        profiler = cProfile.Profile(time.process_time) if args.profile else None
        try:
            for n in range(args.rounds):
                round_start = time.time()
                for i, (p, samples) in enumerate(zip(pipelines, arriving)):
                    if produced[i]:
                        trainers[i].commit({tp: OffsetAndMetadata(end, "", -1) for tp, end in produced[i].items()})
                    # The trace's next minute, spread over the partitions.
                    for record in range(int(samples[n] // SAMPLES_PER_RECORD)):
                        producer.send(p.source.topics[0], b"x" * 64, partition=record % args.partitions)
                producer.flush()
                for i, p in enumerate(pipelines):
                    tps = [TopicPartition(p.source.topics[0], k) for k in range(args.partitions)]
                    produced[i] = trainers[i].end_offsets(tps)
                costs = []
                for i, sensor in enumerate(sensors):
                    if profiler is not None and n > 0:
                        profiler.enable()
                    before = time.process_time()
                    result = sensor(build_sensor_context(instance=instance, cursor=cursors[i]))
                    cursors[i] = getattr(result, "cursor", cursors[i])
                    for event in getattr(result, "asset_events", None) or []:
                        instance.report_runless_asset_event(event)
                    costs.append(time.process_time() - before)
                    if profiler is not None:
                        profiler.disable()
                cpu.append(costs)
                walls.append(time.time() - round_start)
                print(
                    f"round {n + 1}: {walls[-1]:.1f} s wall, median {np.median(costs) * 1000:.0f} ms CPU a tick",
                    flush=True,
                )
                time.sleep(max(round_start + args.round_wall_s - time.time(), 0.0))
        finally:
            instance.dispose()
            producer.close()
            for trainer in trainers:
                trainer.close()
    steady = np.array(cpu[1:]).ravel() * 1000
    first = np.array(cpu[0]) * 1000
    print(
        f"{args.pipelines} pipelines x {args.partitions} partitions, {args.rounds - 1} steady rounds: "
        f"CPU per pipeline tick median {np.median(steady):.1f} ms, p90 {np.percentile(steady, 90):.1f} ms, "
        f"mean {steady.mean():.1f} ms (first round: median {np.median(first):.0f} ms); target at most 50 ms"
    )
    print(
        f"100 pipelines at a 1-minute cadence: {100 * steady.mean() / 1000 / 60:.2f} of a core; "
        f"a steady round of {args.pipelines} took {np.median(walls[1:]):.1f} s wall (median)"
    )
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
