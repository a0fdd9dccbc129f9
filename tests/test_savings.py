"""The savings report: what ran, measured from the history; what Kale and the tuned baselines would have run,
simulated with the simulator's band; refusals that say what is missing.  End to end: a group Kale did not start,
resized by a script (2, then 3, then 1 consumers), against the script's own account of what ran."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pandas as pd
import pytest

from kale_dagster import KafkaSource, Limits, ObservedGroupLauncherConfig, OnlineTrainingPipeline
from kale_dagster.control.clock import PipelineClock
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.sim.savings import (
    ReportRefused,
    SavingsReport,
    SimulatorError,
    measured_restart_s,
    savings_report,
    scored_span,
    what_ran,
)
from support import wait_for

END = 1_780_000_000.0
BAND = SimulatorError(gpu_hours=0.04, accumulated_lag_minutes=0.14, measured="test")


def readings(ts, workers, lag_s=0.0, restarting=False, rate=100.0) -> pd.DataFrame:
    ts = np.asarray(ts, dtype=float)
    frame = pd.DataFrame({"ts": ts, "timestamp": pd.to_datetime(ts, unit="s", utc=True)})
    frame["arrival_rate"] = rate
    frame["workers"] = workers
    frame["time_lag_s"] = lag_s
    frame["restarting"] = restarting
    return frame


def test_what_ran_holds_each_reading_until_the_next_and_counts_changes_as_restarts():
    ts = END - 3600 + np.arange(0, 3600, 60.0)  # an hour, a reading a minute
    workers = np.r_[np.full(20, 2), np.full(20, 3), np.full(20, 1)]
    lag = np.r_[np.zeros(30), np.full(30, 600.0)]  # 10 min of lag for the last half hour
    ran = what_ran(readings(ts, workers, lag, restarting=np.isin(np.arange(60), [20, 40])), END - 3600, END, 300)
    assert ran["gpu_hours"] == pytest.approx((20 * 2 + 20 * 3 + 20 * 1) / 60)
    assert ran["rescales"] == 2
    assert ran["downtime_minutes"] == pytest.approx(2.0)
    assert ran["accumulated_lag_minutes"] == pytest.approx(30 * 10.0)
    assert ran["minutes_over_slo"] == pytest.approx(30.0)


def test_a_gap_in_the_readings_holds_nothing():
    """The sensor stopped for an hour: its last reading does not count as an hour of workers."""
    ts = np.r_[END - 7200 + np.arange(0, 1800, 60.0), END - 1800 + np.arange(0, 1800, 60.0)]
    ran = what_ran(readings(ts, 4), END - 7200, END, 300)
    assert ran["gpu_hours"] == pytest.approx(4 * (59 + 5) / 60)  # 59 minutes read, the gap's reading holds 5


@pytest.mark.parametrize(
    "flags, declared, expected, says",
    [
        ([0] * 10, 300.0, 300.0, "declared 5.0 min"),
        ([0, 1, 1, 0, 0, 1, 1, 1, 0, 0], 300.0, 150.0, "median of 2 restarts"),  # 120 s and 180 s
        ([0, 0, 0, 0, 0, 0, 0, 0, 1, 1], 300.0, 300.0, "has not ended"),
    ],
)
def test_the_restart_time_is_measured_from_the_restarts_recorded(flags, declared, expected, says):
    stream = readings(END + 60.0 * np.arange(10), 2, restarting=np.asarray(flags, dtype=bool))
    restart, source = measured_restart_s(stream, declared)
    assert restart == expected and says in source


@pytest.mark.parametrize(
    "history_h, window_start_h, ok, says",
    [
        (48, 24, True, ""),  # a day before the window warms the forecaster
        (8, 24, True, ""),  # history inside the window: its first half warms
        (4, 24, False, "not enough history: 4.0 h"),
    ],
)
def test_too_short_a_history_is_refused_naming_what_is_missing(history_h, window_start_h, ok, says):
    stream = readings(END - history_h * 3600 + np.arange(0, history_h * 3600, 60.0), 2)
    if ok:
        start, warmup = scored_span(stream, END - window_start_h * 3600, END)
        assert start >= END - window_start_h * 3600 and warmup > 0
    else:
        with pytest.raises(ReportRefused, match=says):
            scored_span(stream, END - window_start_h * 3600, END)


def test_an_observed_group_without_measured_throughput_is_refused():
    stream = readings(END - 3 * 86400 + np.arange(0, 3 * 86400, 60.0), 2)
    throughput = pd.DataFrame({"workers": [2, 2], "samples_per_s": [200.0, 205.0]})
    with pytest.raises(ReportRefused, match=r"measured at 1 worker count\(s\) \(2\), and F\(w\) needs 3"):
        savings_report(
            "p", stream, throughput, Limits(), days=1, end=END, prior=ThroughputModel.linear(100), forecaster="ewma"
        )


def _report(ran_gpu: float, kale_gpu: float, ran_over: float = 0.0, kale_over: float = 0.0) -> SavingsReport:
    ran = {"minutes_over_slo": ran_over, "gpu_hours": ran_gpu}
    kale = {"minutes_over_slo": kale_over, "gpu_hours": kale_gpu}
    return SavingsReport("p", END - 86400, END, ran, kale, {}, BAND, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "ran, kale, over, says",
    [
        (100.0, 69.0, (0, 0), "used 31% fewer GPU-hours (28%-34%), 0 min over the SLO against 0 that ran (24 h"),
        (100.0, 98.0, (0, 0), "about the GPU-hours that ran (within the simulator's 4%)"),  # inside the band: no claim
        (100.0, 120.0, (30, 0), "20% more GPU-hours (15%-25%), 0 min over the SLO against 30 that ran (24 h"),
        (
            100.0,
            50.0,
            (886, 1440),
            "50% fewer GPU-hours (48%-52%), but 1,440 min over the SLO against 886 that "
            "ran: not a saving at the same service",
        ),  # fmt: skip
        (100.0, 69.0, (100, 105), "31% fewer GPU-hours (28%-34%), 105 min over the SLO against 100 that ran (24"),
    ],
)
def test_a_saving_inside_the_simulators_error_or_bought_with_lag_is_not_claimed(ran, kale, over, says):
    assert says in _report(ran, kale, *over).summary()


def test_the_shipped_band_is_the_largest_error_measured():
    band = SimulatorError.shipped()
    assert band.gpu_hours == pytest.approx(0.04) and band.accumulated_lag_minutes == pytest.approx(0.14)
    assert "bench/end_to_end.py" in band.measured


def _consume(consumer, stop: threading.Event, per_s: float) -> None:
    """A trainer slower than the arrivals: at most ``per_s`` records a second, so the group falls behind and its
    consumption is its throughput.  Stopped, it leaves the group (close)."""
    while not stop.is_set():
        batch = consumer.poll(100, max_records=5)
        taken = sum(len(records) for records in batch.values())
        if taken:
            time.sleep(taken / per_s)
    consumer.close()


@pytest.mark.integration
def test_the_report_on_a_group_resized_by_a_script_matches_what_ran(kafka_broker, tmp_path):
    """2, then 3, then 1 consumers of a group Kale did not start, observed by an advisory pipeline's metrics
    sensor: the report's worker-hours within 2% of the script's own account, its restarts the two changes, and a
    report (F(w) fitted on the three sizes) in the asset and on the command line."""
    from dagster import build_sensor_context, instance_for_test, materialize
    from kafka import KafkaConsumer, KafkaProducer

    from kale_dagster import build_definitions
    from kale_dagster.definitions.savings import pipeline_savings, savings_asset
    from kale_dagster.stream.producer import ensure_topic

    servers = kafka_broker.bootstrap_servers
    ensure_topic(servers, "clicks", 6)
    clock = PipelineClock(600.0, wall_start=time.time())  # a wall second is 10 pipeline minutes
    p = OnlineTrainingPipeline(
        name="theirs",
        source=KafkaSource(servers, ("clicks",), "their-trainer", request_timeout_ms=3000),
        limits=Limits(min_workers=1, max_workers=4, slo_minutes=60),
        advisory=True,
        launcher=ObservedGroupLauncherConfig(),
        clock=clock,
        history_url=f"sqlite:///{tmp_path / 'm.db'}",
        forecaster="ewma",
        metrics_interval_seconds=60,
        report_days=1,
        report_baselines=(),  # their sweeps are the unit tests'; here what ran is
    )
    history = p.history()
    # Six hours of arrivals before the group, as `kale history backfill` writes them: the forecaster's warm-up.
    seeded = clock.now() - 6 * 3600 + np.arange(0, 6 * 3600, 60.0)
    history.seed_stream("theirs", pd.DataFrame({"ts": seeded, "arrival_rate": clock.rate(240.0)}))
    producing = threading.Event()

    def produce():
        producer = KafkaProducer(bootstrap_servers=servers, linger_ms=5)
        i = 0
        while not producing.is_set():
            for _ in range(12):
                producer.send("clicks", b"x" * 29, partition=i % 6)
                i += 1
            time.sleep(0.05)  # 240 a second, above what three consumers take
        producer.close()

    running: list[tuple[threading.Thread, threading.Event]] = []

    def start_consumer():
        consumer = KafkaConsumer(
            "clicks",
            bootstrap_servers=servers,
            group_id="their-trainer",
            session_timeout_ms=1000,  # the embedded broker's JoinGroup waits half of it
            heartbeat_interval_ms=300,
            auto_commit_interval_ms=200,
        )
        stop = threading.Event()
        thread = threading.Thread(target=_consume, args=(consumer, stop, 60.0), daemon=True)
        thread.start()
        running.append((thread, stop))

    def stop_consumers(n):
        for _, stop in running[-n:]:  # together: one rebalance
            stop.set()

    sensor = {s.name: s for s in build_definitions(p).get_repository_def().sensor_defs}["theirs_stream_metrics"]
    changes: list[tuple[float, int]] = []  # the script's account: (pipeline time, consumers from then on)
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        for _ in range(2):
            start_consumer()
        from kale_dagster.stream.group import describe_group

        def members(n):
            view = describe_group(p.source.client_config(), "their-trainer", ("clicks",))
            return view is not None and view.state == "Stable" and view.members == n

        wait_for(lambda: members(2), 30, "the group formed with 2 members", poll_s=0.2)
        with instance_for_test() as instance:
            cursor = None
            plan = [(0.0, 2, None), (22.0, 3, start_consumer), (44.0, 1, lambda: stop_consumers(2))]
            begun, first, last = time.time(), None, 0.0
            while time.time() - begun < 66.0:
                elapsed = time.time() - begun
                if plan and elapsed >= plan[0][0]:
                    _, n, act = plan.pop(0)
                    if act:
                        act()
                    changes.append((clock.now(), n))
                result = sensor(build_sensor_context(instance=instance, cursor=cursor))
                cursor = getattr(result, "cursor", cursor)
                recorded = history.stream("theirs", start=clock.now() - 3600)
                last = float(recorded.loc[recorded["workers"].notna(), "ts"].max())
                first = first or last
                time.sleep(0.2)
            result = materialize([savings_asset(p)], instance=instance)
            materialization = result.asset_materializations_for_node("theirs__savings")[0]
            in_ui = result.output_for_node("theirs__savings")
        # The asset's span ends at its run; the script's account, at the last reading: the same report to there.
        report = pipeline_savings(p, end=last)[0].to_json()
        start, end = report["start"], report["end"]
        bounds = [min(max(t, start), end) for t, _ in changes] + [end]
        truth_gpu_h = sum(n * (b - a) for (_, n), a, b in zip(changes, bounds, bounds[1:])) / 3600
        assert report["ran"]["gpu_hours"] == pytest.approx(truth_gpu_h, rel=0.02), (report["ran"], truth_gpu_h)
        assert report["ran"]["rescales"] == 2, report["ran"]
        assert start == pytest.approx(first)
        assert "fitted on" in report["inputs"]["model"] and report["baselines"] == {}
        summary = materialization.metadata["summary"].value
        assert summary == in_ui["summary"] and summary.startswith("Kale would have used ")
        print(json.dumps({"truth_gpu_h": truth_gpu_h, "report": report}, indent=1))
    finally:
        producing.set()
        for thread, stop in running:
            stop.set()
            thread.join()
        producer.join()
        history.dispose()


LOCATION = """
from kale_dagster import KafkaSource, Limits, ObservedGroupLauncherConfig, OnlineTrainingPipeline, build_definitions

defs = build_definitions(
    OnlineTrainingPipeline(
        name="theirs",
        source=KafkaSource("127.0.0.1:9", ("clicks",), "their-trainer"),
        limits=Limits(min_workers=1, max_workers=6),
        launcher=ObservedGroupLauncherConfig(),
        history_url={url!r},
        forecaster="ewma",
        report_baselines=("keda",),
    )
)
"""


def _recorded_history(url: str, throughput: bool) -> pd.DataFrame:
    """A day and six hours of readings a minute, the last six hours with the workers that ran, written as the
    metrics sensor writes them; and the throughput measured at three sizes."""
    from kale_dagster.stream.history import STREAM_METRICS, WORKER_THROUGHPUT, MetricsHistory

    now = time.time()
    ts = now - 30 * 3600 + np.arange(0, 30 * 3600, 60.0)
    rate = 400 + 150 * np.sin(2 * np.pi * ts / 86400)
    hourly = np.where((ts // 3600) % 2 == 0, 5, 3)  # resized every hour: the restarts do not hang on the hour of day
    frame = readings(ts, np.where(ts >= now - 6 * 3600, hourly, np.nan), 30.0, rate=rate)
    history = MetricsHistory(url)
    rows = [
        {
            "pipeline": "theirs",
            "ts": r.ts,
            "arrival_rate": r.arrival_rate,
            "time_lag_s": r.time_lag_s,
            "workers": None if np.isnan(r.workers) else int(r.workers),
        }
        for r in frame.itertuples()
    ]
    with history.engine.begin() as conn:
        conn.execute(STREAM_METRICS.insert(), rows)
        if throughput:
            conn.execute(
                WORKER_THROUGHPUT.insert(),
                [
                    {"pipeline": "theirs", "ts": now - 3600 * i, "workers": w, "samples_per_s": f, "emulated": False}
                    for i, (w, f) in enumerate(((1, 110.0), (3, 320.0), (5, 520.0)))
                ],
            )
    history.dispose()
    return frame


@pytest.mark.slow
@pytest.mark.parametrize("throughput", [True, False])
def test_kale_report_prints_the_report_or_what_is_missing(tmp_path, capsys, throughput):
    from kale_dagster.cli import main

    url = f"sqlite:///{tmp_path / 'm.db'}"
    frame = _recorded_history(url, throughput)
    (tmp_path / "location.py").write_text(LOCATION.format(url=url))
    code = main(["report", "--pipeline", "theirs", "-f", str(tmp_path / "location.py"), "--json"])
    out, err = capsys.readouterr()
    if not throughput:
        assert code == 2 and not out
        assert err.strip().splitlines() == [
            "kale report: error: no savings report for 'theirs': no throughput model: the workers' throughput was "
            "measured at no worker count, and F(w) needs 3: profile the trainer at more sizes (`kale trainer profile "
            "--workers 1,2,4`), or let the group run at more sizes (its throughput is measured while it falls behind "
            "its arrivals)"
        ]
        return
    assert code == 0, err
    report = json.loads(out)
    ran = what_ran(frame, report["start"], report["end"], 20 * 60)
    assert report["ran"] == pytest.approx(ran) and report["ran"]["rescales"] > 0
    assert report["start"] == pytest.approx(frame.loc[frame["workers"].notna(), "ts"].iloc[0])
    assert set(report["baselines"]) == {"keda"} and report["baselines"]["keda"]["setting"]
    assert report["kale"]["gpu_hours"] > 0 and report["summary"].startswith("Kale would have used")
    inputs = report["inputs"]
    assert inputs["restart"].startswith("declared") and "fitted on 3 measurements" in inputs["model"]


def _seen(backlog: float, arrival: float, consumed: float, restarting: bool = False):
    from kale_dagster.model.types import Observation

    return Observation(0.0, 2, arrival, consumed, backlog, 60.0, 1.0, restarting=restarting)


@pytest.mark.parametrize(
    "case, obs, rate",
    [
        ("behind all window: its capacity", _seen(backlog=20_000, arrival=100, consumed=60), 60),
        ("keeping up", _seen(backlog=50, arrival=100, consumed=99), None),
        ("draining a backlog (it may have run dry)", _seen(backlog=500, arrival=50, consumed=90), None),
        ("a burst that began inside the window", _seen(backlog=12_000, arrival=100, consumed=60), None),
        ("caught up", _seen(backlog=0, arrival=100, consumed=60), None),
        ("rebalancing", _seen(backlog=5000, arrival=100, consumed=60, restarting=True), None),
        ("consumed nothing (stalled, not a capacity)", _seen(backlog=5000, arrival=100, consumed=0), None),
    ],
)
def test_a_group_that_reports_nothing_shows_its_throughput_only_while_behind_all_window(case, obs, rate):
    """Over a 300 s window: a backlog that grew by (arrival - consumed) x 300 and began above a tenth of what the
    group consumed over it."""
    from kale_dagster.definitions.control import falling_behind_rate

    assert falling_behind_rate(obs, 300.0) == rate, case
