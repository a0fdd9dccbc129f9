"""The savings report on a group Kale did not start, against the script that resized it, and its line in the UI.

A group of kafka-python consumers ("their trainer", ``advisory_observation``'s) on the embedded broker trains
at a known pace while a producer writes ``--rate`` records/s for ``--burst-s`` (more than the group takes: it
falls behind, which is when its throughput shows) and ``--low-rate`` for as long (it idles), in turn.  The group
runs 2 consumers, then 3, then 1, ``--phase-s`` wall seconds each, on a clock compressed ``--time-scale``
times, after a day of arrivals seeded as ``kale history backfill`` writes them.  An advisory pipeline watches it with an
``ObservedGroupLauncherConfig``, its metrics sensor ticked every ``--tick-s`` as the daemon would.  Then
``<pipeline>/savings`` is materialized into a Dagster instance, and its figures are compared with the script's
own account of what ran: worker-hours (the consumers running, over time), restarts (the changes), and the
accumulated lag (the age of the oldest untrained record, from the producer's and the consumers' counts).
With ``--screenshot PNG`` the Dagster webserver serves that instance and headless Chromium takes the asset's
page, its first metadata line the report's summary.

    python bench/savings_report.py [--phase-s 60] [--screenshot docs/ui/savings.png]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
from advisory_observation import GROUP, PARTITIONS, TOPIC, Counted, consume, produce
from dagster import DagsterInstance, build_sensor_context, materialize

from kale_dagster import KafkaSource, Limits, ObservedGroupLauncherConfig, OnlineTrainingPipeline, build_definitions
from kale_dagster.control.clock import PipelineClock
from kale_dagster.definitions.savings import savings_asset
from kale_dagster.stream.broker import embedded_broker, free_loopback_port
from kale_dagster.stream.producer import ensure_topic

LOCATION = """
from kale_dagster import KafkaSource, Limits, ObservedGroupLauncherConfig, OnlineTrainingPipeline, build_definitions

defs = build_definitions(
    OnlineTrainingPipeline(
        name="theirs",
        source=KafkaSource({servers!r}, ({topic!r},), {group!r}),
        limits=Limits(min_workers=1, max_workers=4, slo_minutes=60),
        launcher=ObservedGroupLauncherConfig(),
        history_url={history!r},
        forecaster="ewma",
        report_days=1,
    )
)
"""


def pipeline(servers: str, history: str, clock: PipelineClock) -> OnlineTrainingPipeline:
    return OnlineTrainingPipeline(
        name="theirs",
        source=KafkaSource(servers, (TOPIC,), GROUP, request_timeout_ms=3000),
        limits=Limits(min_workers=1, max_workers=4, slo_minutes=60),
        launcher=ObservedGroupLauncherConfig(),  # advisory: the default
        clock=clock,
        history_url=history,
        forecaster="ewma",
        metrics_interval_seconds=60,
        report_days=1,
    )


def true_lag_minutes(produced: Counted, trained: Counted, start: float, end: float, clock: PipelineClock) -> float:
    """Accumulated lag (lag-minutes, pipeline time) by the counts: at each instant, the age of the oldest record
    not yet trained (records are trained in about the order they were written, over balanced partitions)."""
    grid = np.linspace(clock.wall_at(start), clock.wall_at(end), 2000)
    done = np.interp(grid, trained.times, trained.totals)
    written_at = np.interp(done, produced.totals, produced.times)  # when the oldest untrained record was written
    lag_s = np.clip(grid - written_at, 0.0, None) * clock.time_scale
    return float(np.trapezoid(lag_s / 60.0, (grid - grid[0]) * clock.time_scale / 60.0))


def screenshot(home: Path, location: str, out: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("--screenshot needs Debian's chromium (bash .ci/install installs it)")
    port = free_loopback_port()
    (home / "location.py").write_text(location)
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    server = subprocess.Popen(
        [sys.executable, "-m", "dagster_webserver", "-f", str(home / "location.py"), "-h", "127.0.0.1"]
        + ["-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2)
                break
            except OSError:
                time.sleep(1)
        out.parent.mkdir(parents=True, exist_ok=True)
        profile = tempfile.mkdtemp(prefix="kale-chromium-")
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                f"--user-data-dir={profile}",
                "--virtual-time-budget=20000",
                "--window-size=1600,1000",
                f"--screenshot={out}",
                f"http://127.0.0.1:{port}/assets/theirs/savings",
            ],
            timeout=120,
            capture_output=True,
        )
        shutil.rmtree(profile, ignore_errors=True)
    finally:
        os.killpg(server.pid, 15)
        server.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=260.0, help="records/s produced in a burst")
    parser.add_argument("--low-rate", type=float, default=20.0, help="records/s produced between bursts")
    parser.add_argument("--burst-s", type=float, default=15.0, help="wall seconds of each burst and each lull")
    parser.add_argument("--per-consumer", type=float, default=80.0, help="records/s one consumer trains")
    parser.add_argument("--phase-s", type=float, default=60.0, help="wall seconds at each group size (2, 3, 1)")
    parser.add_argument("--tick-s", type=float, default=1.0, help="wall seconds between readings")
    parser.add_argument("--time-scale", type=float, default=600.0, help="pipeline seconds per wall second")
    parser.add_argument(
        "--session-timeout-ms", type=int, default=6000, help="the consumers' (a member joins half of it late)"
    )
    parser.add_argument("--screenshot", metavar="PNG", help="the savings asset's page in the UI, to this file")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="kale-savings-"))
    (home / "dagster.yaml").write_text("nux:\n  enabled: false\ntelemetry:\n  enabled: false\n")  # no welcome modal
    history = f"sqlite:///{home / 'metrics.db'}"
    produced, trained = Counted(), Counted()
    clock = PipelineClock(args.time_scale, wall_start=time.time())
    with embedded_broker() as broker:
        servers = broker.bootstrap_servers
        ensure_topic(servers, TOPIC, PARTITIONS)
        p = pipeline(servers, history, clock)
        seeded = clock.now() - 86_400 + np.arange(0, 86_400, 60.0)
        mean_rate = clock.rate((args.rate + args.low_rate) / 2)
        p.history().seed_stream("theirs", pd.DataFrame({"ts": seeded, "arrival_rate": mean_rate}))
        sensor = {s.name: s for s in build_definitions(p).get_repository_def().sensor_defs}["theirs_stream_metrics"]
        instance = DagsterInstance.local_temp(str(home))
        stop_producer = threading.Event()
        members: list[tuple[threading.Thread, threading.Event]] = []
        changes: list[tuple[float, int]] = []  # (pipeline time, consumers running from then on)

        def resize(n: int) -> None:
            leaving = []
            while len(members) < n:
                stop = threading.Event()
                thread = threading.Thread(
                    target=consume,
                    args=(servers, args.per_consumer, stop, trained, args.session_timeout_ms),
                    daemon=True,
                )
                thread.start()
                members.append((thread, stop))
            while len(members) > n:
                leaving.append(members.pop())
            for _, stop in leaving:  # together: one rebalance
                stop.set()
            changes.append((clock.now(), n))
            for thread, _ in leaving:
                thread.join()

        def traffic() -> None:
            while not stop_producer.is_set():
                for rate in (args.rate, args.low_rate):
                    segment = threading.Event()
                    thread = threading.Thread(target=produce, args=(servers, rate, segment, produced), daemon=True)
                    thread.start()
                    stop_producer.wait(args.burst_s)
                    segment.set()
                    thread.join()

        threading.Thread(target=traffic, daemon=True).start()
        cursor = None
        try:
            for size in (2, 3, 1):
                resize(size)
                phase_end = time.time() + args.phase_s
                while time.time() < phase_end:
                    time.sleep(args.tick_s)
                    result = sensor(build_sensor_context(instance=instance, cursor=cursor))
                    cursor = getattr(result, "cursor", cursor)
            last = float(p.history().stream("theirs")["ts"].max())
            result = materialize([savings_asset(p)], instance=instance)
        finally:
            resize(0)
            stop_producer.set()
        shown = result.asset_materializations_for_node("theirs__savings")[0].metadata["summary"].value
        location = LOCATION.format(servers=servers, topic=TOPIC, group=GROUP, history=history)
    from kale_dagster.definitions.savings import pipeline_savings

    report = pipeline_savings(p, end=last)[0]  # to the last reading: the script's account ends there too
    start, end = report.start, report.end
    bounds = [min(max(t, start), end) for t, _ in changes] + [end]
    truth = {
        "gpu_hours": sum(n * (b - a) for (_, n), a, b in zip(changes, bounds, bounds[1:])) / 3600,
        "rescales": sum(1 for (_, a), (_, b) in zip(changes[:3], changes[1:3]) if a != b),
        "accumulated_lag_minutes": true_lag_minutes(produced, trained, start, end, clock),
    }
    print(f"span {report.hours:.1f} pipeline h ({report.inputs.readings} readings), sizes 2, 3, 1")
    for key, true in truth.items():
        ran = report.ran[key]
        print(f"  ran {key:24s} {ran:12,.2f}   script {true:12,.2f}   ({ran / true - 1:+.2%})")
    print(json.dumps(report.to_json(), indent=1, default=str))
    print(f"UI summary line: {shown}")
    if args.screenshot:
        screenshot(home, location, Path(args.screenshot))
        print(f"screenshot: {args.screenshot}")
    instance.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
