"""Bytes a pipeline adds to Dagster's event log per pipeline-day, measured on a real instance.

An advisory pipeline (its workers declared, so it decides at every reading) on the embedded broker, with the
seven days before seeded into its metrics history, on a pipeline clock compressed so that its readings are
``metrics_interval_seconds`` of pipeline time apart.  Its metrics sensor is ticked ``--readings`` times and one
refit run is executed; the event log's rows are summed (the serialized events, as the storage keeps them) per
event type.  The readings' bytes are scaled from the pipeline time they covered to a day, and the refit's by
1,440 / ``forecast_refit_minutes``.  Target: under 1 MB per pipeline-day.

    python bench/event_log_growth.py [--readings 120]
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
from dagster import DagsterInstance, build_sensor_context
from kafka import KafkaProducer

from kale_dagster import KafkaSource, OnlineTrainingPipeline, build_definitions
from kale_dagster.control.clock import PipelineClock
from kale_dagster.launchers import ObservedGroupLauncherConfig
from kale_dagster.sim.trace import synth_trace
from kale_dagster.stream.broker import embedded_broker
from kale_dagster.stream.history import MetricsHistory


def event_bytes(home: Path) -> Counter:
    """Serialized bytes per event type, each event once: the run shards (``.db`` holds the runless events).  SQLite
    storage also copies every asset event into ``index.db``; Postgres keeps one ``event_logs`` table."""
    sizes: Counter = Counter()
    for db in (home / "history" / "runs").glob("*.db"):
        if db.name == "index.db":
            continue
        with sqlite3.connect(db) as conn:
            try:
                rows = conn.execute("select dagster_event_type, sum(length(event)) from event_logs group by 1")
            except sqlite3.OperationalError:  # not an event-log database
                continue
            for kind, size in rows:
                sizes[kind or "log message"] += size or 0
    return sizes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readings", type=int, default=120)
    parser.add_argument("--tick-wall-s", type=float, default=0.5, help="wall seconds between readings")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="kale-eventlog-"))
    with embedded_broker() as broker:
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
        p = OnlineTrainingPipeline(
            name="clicks",
            source=KafkaSource(broker.bootstrap_servers, ("clicks",), "ranker"),
            launcher=ObservedGroupLauncherConfig(workers=2),
            advisory=True,
            history_url=f"sqlite:///{home / 'metrics.db'}",
            clock=PipelineClock(60.0 / args.tick_wall_s, wall_start=time.time()),  # a reading a pipeline minute
        )
        trace = synth_trace(days=7, step_s=60)
        rate = trace["value"].to_numpy(float) / 60.0
        rows = pd.DataFrame(
            {
                "ts": time.time() - 7 * 86_400 + 60.0 * np.arange(len(trace)),
                "arrival_rate": rate,
                "consumption_rate": rate,
                "sample_lag": 0,
                "time_lag_s": 0.0,
            }
        )
        MetricsHistory(p.history_url).seed_stream(p.name, rows)
        defs = build_definitions(p)
        repo = defs.get_repository_def()
        sensor = {s.name: s for s in repo.sensor_defs}["clicks_stream_metrics"]
        instance = DagsterInstance.local_temp(str(home))
        try:
            cursor, first = None, time.time()
            for n in range(args.readings):
                time.sleep(max(first + n * args.tick_wall_s - time.time(), 0.0))
                for _record in range(20):
                    producer.send("clicks", value=b"x" * 64)
                producer.flush()
                result = sensor(build_sensor_context(instance=instance, cursor=cursor))
                cursor = getattr(result, "cursor", cursor)
                for event in getattr(result, "asset_events", None) or []:
                    instance.report_runless_asset_event(event)
            covered_s = p.clock.duration(time.time() - first)
            readings = event_bytes(home)
            assert defs.resolve_job_def("clicks_refit").execute_in_process(instance=instance).success
            refit = event_bytes(home) - readings
        finally:
            instance.dispose()
            producer.close()
    per_reading = sum(readings.values()) / args.readings
    per_day_readings = sum(readings.values()) * 86_400 / covered_s
    per_day_refits = sum(refit.values()) * 1440 / p.forecast_refit_minutes
    print(
        f"{args.readings} readings over {covered_s / 60:.0f} pipeline minutes: {sum(readings.values()):,} bytes, "
        f"{per_reading:,.0f} per reading"
    )
    for kind, size in readings.most_common():
        print(f"  {kind:32s} {size / args.readings:8,.0f} bytes per reading")
    print(f"one refit run: {sum(refit.values()):,} bytes")
    print(
        f"per pipeline-day (a reading every {p.metrics_interval_seconds:g} s, a decision that changes nothing "
        f"recorded every {p.record_every_minutes:g} min, a refit every {p.forecast_refit_minutes:g} min): "
        f"{(per_day_readings + per_day_refits) / 1e6:.2f} MB ({per_day_readings / 1e6:.2f} MB readings, "
        f"{per_day_refits / 1e6:.2f} MB refits); target under 1 MB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
