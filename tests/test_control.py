"""The one controller: its step (table-driven), and the metrics sensor running it in a real Dagster instance.

The sensor tests use the real embedded broker, a real Dagster instance and
the real trainer service over loopback; only the workers behind the
service are a stand-in (the real ones are exercised in test_trainer.py and
test_demo.py), so that their busy share can be set.
"""

from __future__ import annotations

import os
import threading
import time

import pandas as pd
import pytest
from dagster import MetadataValue

from kale_dagster.control.clock import PipelineClock
from kale_dagster.control.controller import (
    OUTCOMES,
    ControlInput,
    Controller,
    ControlSettings,
    StreamReading,
    recent_forecast_error,
    recent_forecast_ratio,
    restart_estimate,
)
from kale_dagster.control.tick import ControlCursor, reading_from
from kale_dagster.definitions.decision import RescaleConfig
from kale_dagster.errors import KaleConfigError
from kale_dagster.launchers.base import LauncherStatus
from kale_dagster.model.limits import Limits
from kale_dagster.model.throughput import ThroughputModel
from support import decision_of, produce_events, sensor_tick

MODEL = ThroughputModel.linear(100.0)
READING = StreamReading(time=1_800_000_000.0, arrival_rate=150.0, consumption_rate=150.0, backlog=0.0, time_lag_s=5.0)


def _controller(**kw):
    settings = dict(policy="static", limits=Limits(max_workers=8), policy_options={"workers": 3})
    settings.update(kw)
    return Controller(ControlSettings(**settings))


def _step(controller, reading, status, model=MODEL, **inputs):
    return controller.step(ControlInput(reading, status, model, **inputs))


IN_FLIGHT = {"rescale_in_flight": True}
# (case, controller settings, launcher status or None, reading changes, the caller's other inputs (a rescale run in
# flight, a launcher that retargets), expected workers, expected rescale, hold reason)
STEP_ROWS = [
    ("acts when the decision differs from what runs", {}, LauncherStatus(workers=2), {}, {}, 3, 3, ""),
    ("nothing to do at the decided size", {}, LauncherStatus(workers=3), {}, {}, 3, None, ""),
    ("holds without a launcher, at what it last knew", {}, None, {}, {}, 2, None, "the launcher did not answer"),
    (
        "holds without a rate (first reading, telemetry gap)",
        {},
        LauncherStatus(workers=2),
        {"arrival_rate": None},
        {},
        2,
        None,
        "no arrival rate",
    ),
    ("one rescale at a time: a run in flight", {}, LauncherStatus(workers=2), {}, IN_FLIGHT, 3, None, ""),
    (
        "one rescale at a time: the launcher is restarting",
        {},
        LauncherStatus(workers=2, rescaling=True),
        {},
        {},
        3,
        None,
        "",
    ),
    (
        "a restart the launcher can redirect: a larger group is a retarget",
        {},
        LauncherStatus(workers=2, rescaling=True),
        {},
        {"retargetable": True},
        3,
        3,
        "",
    ),
    (
        "a retarget never scales in",
        {"policy_options": {"workers": 1}},
        LauncherStatus(workers=2, rescaling=True),
        {},
        {"retargetable": True},
        1,
        None,
        "",
    ),
    (
        "a rescale run under way whose launcher can redirect it takes a retarget too",
        {},
        LauncherStatus(workers=2),
        {},
        {"rescale_in_flight": True, "retargetable": True},
        3,
        3,
        "",
    ),
    ("a group still starting gives no action", {}, LauncherStatus(workers=2, measures=True), {}, {}, 3, None, ""),
    (
        "a group that reported can be acted on",
        {},
        LauncherStatus(workers=2, measures=True, reported=2, busy_share=0.9, samples_per_s=180.0),
        {},
        {},
        3,
        3,
        "",
    ),
    ("advisory pipelines decide and never act", {"advisory": True}, LauncherStatus(workers=2), {}, {}, 3, None, ""),
    (
        "a run in flight whose restart has not begun: its target is the allocation",
        {"policy_options": {"workers": 5}},
        LauncherStatus(workers=2),
        {},
        {"rescale_in_flight": True, "rescale_target": 4, "retargetable": True},
        5,
        5,
        "",
    ),
    (
        "its target, not what still runs, is what a retarget must exceed",
        {},
        LauncherStatus(workers=2),
        {},
        {"rescale_in_flight": True, "rescale_target": 4, "retargetable": True},
        3,
        None,
        "",
    ),
]

SHORT = "asked for 16 workers, the cluster placed 10"
STEP_ROWS += [
    (
        "a capacity the launcher found caps the decision: no asking again",
        {"policy_options": {"workers": 6}},
        LauncherStatus(workers=4, capacity=4, capacity_note=SHORT),
        {},
        {},
        4,
        None,
        "",
    ),
    (
        "up to the capacity found, a group may grow",
        {"policy_options": {"workers": 6}},
        LauncherStatus(workers=2, capacity=4, capacity_note=SHORT),
        {},
        {},
        4,
        4,
        "",
    ),
    (
        "a decision between pods is rounded up to whole pods",
        {"limits": Limits(min_workers=0, max_workers=8, workers_per_pod=4)},
        LauncherStatus(workers=4),
        {},
        {},
        4,
        None,
        "",
    ),
]


@pytest.mark.parametrize(
    "case, settings, status, reading, inputs, workers, rescale, held", STEP_ROWS, ids=[r[0] for r in STEP_ROWS]
)
def test_step(case, settings, status, reading, inputs, workers, rescale, held):
    from dataclasses import replace

    controller = _controller(**settings)
    step = _step(controller, replace(READING, **reading), status, launcher_error="refused", last_workers=2, **inputs)
    assert (step.decision.workers, step.rescale_to) == (workers, rescale)
    restarting = status is not None and (status.rescaling or inputs.get("rescale_in_flight", False))
    assert step.retarget == (rescale is not None and restarting)
    assert held in step.held
    if held:
        assert (
            step.decision.policy == "static/hold"
            and step.observation is None
            and step.decision.reason.startswith(f"hold at {workers}")
        )


def test_restart_time_is_the_median_of_measured_restarts_in_pipeline_seconds():
    assert restart_estimate([], 600.0) == (600.0, "declared (no restart measured yet)")
    status = LauncherStatus(workers=2, downtimes_s=(2.0, 4.0, 100.0))
    step = _step(_controller(policy="kale", policy_options={}), READING, status, time_scale=10.0)
    assert step.restart_s == pytest.approx(40.0) and "median of the last 3" in step.restart_source


def test_a_failed_group_is_restarted_at_the_size_the_policy_wants():
    controller = _controller(policy="static", policy_options={"workers": 4})
    failed = LauncherStatus(workers=4, failed="pod kale-ctr-w4-1-0 failed: OOMKilled")
    step = _step(controller, READING, failed, MODEL)
    assert (
        step.rescale_to == 4
        and "the running group failed (pod kale-ctr-w4-1-0 failed: OOMKilled)" in step.decision.reason
    )
    assert (
        _step(controller, READING, LauncherStatus(workers=4), MODEL).rescale_to is None
    )  # healthy at 4: nothing to do
    assert _step(controller, READING, failed, MODEL, rescale_in_flight=True).rescale_to is None  # one restart at a time
    advisory = _controller(policy="static", policy_options={"workers": 4}, advisory=True)
    assert _step(advisory, READING, failed, MODEL).rescale_to is None


def test_hpa_state_survives_a_rebuilt_policy():
    """Each step rebuilds the policy; its recommendations come back from the state the last step returned."""
    controller = _controller(policy="hpa", policy_options={"sync_period_s": 15.0})
    busy = LauncherStatus(workers=4, measures=True, reported=4, busy_share=1.0, samples_per_s=400.0)
    idle = LauncherStatus(
        workers=5, measures=True, reported=5, busy_share=0.1, samples_per_s=50.0
    )  # the rescale to 5 applied
    first = _step(controller, READING, busy, MODEL)  # recommends 5; rate-limited up
    assert first.decision.workers == 5 and first.policy_state["recommendations"]
    later = StreamReading(**{**READING.__dict__, "time": READING.time + 60})
    held = _step(controller, later, idle, MODEL, policy_state=first.policy_state)
    assert (held.decision.workers, held.rescale_to) == (
        5,
        None,
    )  # the 5 of a minute ago holds scale-down (300 s window)
    past_window = StreamReading(**{**READING.__dict__, "time": READING.time + 301})
    dropped = _step(controller, past_window, idle, MODEL, policy_state=held.policy_state)
    assert dropped.decision.workers == 1  # the window since the 5 was recommended has passed
    fresh = _step(controller, past_window, idle, MODEL, policy_state={})
    assert (
        fresh.decision.workers == 5
    )  # a controller without the state starts a window of its own (recordInitialRecommendation)


def test_a_policy_that_plans_with_estimates_is_rebuilt_when_they_change_and_keeps_its_memory():
    kale = _controller(policy="kale_stabilizer", policy_options={})
    at_declared = _step(kale, READING, LauncherStatus(workers=2), MODEL)
    first = kale.policy_in_use
    first.last_change_time = 123.0  # what the stabilizer planner remembers
    _step(kale, READING, LauncherStatus(workers=2), MODEL)
    assert kale.policy_in_use is first  # nothing new learned: the same object decides
    _step(kale, READING, LauncherStatus(workers=2, downtimes_s=(300.0,)), ThroughputModel.linear(120.0))
    rebuilt = kale.policy_in_use
    assert rebuilt is not first and rebuilt.model == ThroughputModel.linear(120.0) and rebuilt.sizing.restart_s == 300.0
    assert rebuilt.last_change_time == 123.0 and at_declared.restart_s == 600.0


def test_a_baseline_keeps_the_settings_it_was_configured_with():
    """KEDA's lagThreshold, derived once from the model, does not move when the controller refits the model."""
    keda = _controller(policy="keda", policy_options={}, partitions=12)
    _step(keda, READING, LauncherStatus(workers=2), MODEL)
    threshold = keda.policy_in_use.metadata.lag_threshold
    _step(keda, READING, LauncherStatus(workers=2), ThroughputModel.linear(300.0))
    assert keda.policy_in_use.metadata.lag_threshold == threshold == 6000  # 60 s of one worker at 100/s


def test_recent_forecast_error_needs_half_the_window():
    times = [0.0, 600.0, 1200.0, 1800.0]
    assert recent_forecast_error(times[:2], [100, 100], [110, 90], now=1800, window_s=3600) is None
    error = recent_forecast_error(times, [100, 100, 100, 100], [100, 100, float("nan"), 300], now=1800, window_s=3600)
    assert error == pytest.approx((0 + 0 + 1.0) / 3)


@pytest.mark.parametrize(
    "predicted, actual, ratio",
    [
        ([100, 100, 100, 100], [150, 150, 150, 150], 1.5),  # forecast low: above 1
        ([100, 200, 100, 200], [150, 150, 150, 150], 1.0),  # the totals are compared, not each pair
        ([100, 100, 100, 100], [100, 100, float("nan"), 40], 0.8),  # unmeasured pairs left out; high: below 1
        ([0, 0, 0, 0], [10, 10, 10, 10], None),  # nothing predicted: no ratio
    ],
)
def test_recent_forecast_ratio_compares_what_arrived_with_what_was_predicted(predicted, actual, ratio):
    times = [0.0, 600.0, 1200.0, 1800.0]
    got = recent_forecast_ratio(times, predicted, actual, now=1800, window_s=3600)
    assert got == (pytest.approx(ratio) if ratio is not None else None)
    assert recent_forecast_ratio(times[:2], predicted[:2], actual[:2], now=1800, window_s=3600) is None


def test_each_prediction_is_scored_against_the_first_reading_at_or_after_it():
    """The sensor's control scores its one-step predictions on the arrival history it re-anchors the forecast on
    (no read of its own): each against the first reading at or after the predicted instant, for the error over
    its window and the ratio over its own."""
    import numpy as np

    from kale_dagster import KafkaSource, OnlineTrainingPipeline
    from kale_dagster.definitions.control import PipelineControl

    control = PipelineControl(
        OnlineTrainingPipeline(name="fe", source=KafkaSource("127.0.0.1:9092", ("t",), "g")), None, "fe_refit"
    )
    t0 = 1_800_000_000.0
    arrivals = pd.DataFrame(
        {
            "timestamp": pd.to_datetime(t0 + 60.0 * np.arange(120) + 5, unit="s", utc=True),
            "rate": 100.0 + np.arange(120),
        }
    )
    predicted = tuple((t0 + 60.0 * k, 100.0) for k in range(0, 120, 10))  # each reading lands 5 s after its minute
    settings, now = control.controller.settings, t0 + 7200
    assert settings.ratio_window_s > settings.error_window_s
    error, ratio = control._forecast_scores(arrivals, ControlCursor(predicted), now)
    times, actual = [t for t, _ in predicted], [100.0 + k for k in range(0, 120, 10)]
    expected_error = recent_forecast_error(times, [100.0] * 12, actual, now, settings.error_window_s)
    expected_ratio = recent_forecast_ratio(times, [100.0] * 12, actual, now, settings.ratio_window_s)
    assert error is not None and error == pytest.approx(expected_error)
    assert ratio is not None and ratio == pytest.approx(expected_ratio) == pytest.approx(1.55)  # the last 2 h
    assert control._forecast_scores(arrivals.iloc[:0], ControlCursor(predicted), now) == (None, None)


# --- the metrics sensor running the controller --------------------------------------------------


@pytest.mark.integration
def test_sensor_decides_at_every_reading_and_hpa_windows_hold_across_ticks(controlled):
    from dagster import AssetKey

    env = controlled
    produce_events(env["servers"], 40)
    first = sensor_tick(env)
    assert decision_of(first)["held"].startswith("no arrival rate")  # one reading: no rate yet, no decision on it
    refit = [r for r in first.run_requests if r.job_name == "ctl_refit"]
    assert len(refit) == 1  # no forecast yet: a refit is requested at once

    time.sleep(0.5)
    produce_events(env["servers"], 40)
    second = sensor_tick(env, first.cursor)
    decision = decision_of(second)
    assert (
        decision["workers"] == 3 and decision["running_workers"] == 2 and decision["action"] == "rescale to 3 requested"
    )
    rescale = next(r for r in second.run_requests if r.job_name == "ctl_rescale")
    requested = RescaleConfig.of(rescale.run_config)
    assert requested.workers == 3 and requested.decided_at is not None and requested.decided_at <= time.time()
    # The run applies the target it was requested with.
    env["instance"].report_runless_asset_event(second.asset_events[-1])
    assert (
        env["defs"]
        .resolve_job_def("ctl_rescale")
        .execute_in_process(instance=env["instance"], run_config=rescale.run_config, tags=rescale.tags)
        .success
    )
    assert env["workers"].workers == 3

    # HPA now recommends 1, but its 300-s scale-down window (10 s wall at 30x: longer than a loaded host takes
    # between these ticks) remembers the 3.
    env["workers"].busy = 0.2
    third = sensor_tick(env, second.cursor)
    env["instance"].report_runless_asset_event(third.asset_events[-1])
    assert (decision_of(third)["workers"], decision_of(third)["action"]) == (3, "none")
    time.sleep(10.5)  # 315 pipeline seconds at 30x: the window has passed
    fourth = sensor_tick(env, third.cursor)
    assert decision_of(fourth)["workers"] == 1 and "ctl_rescale" in [r.job_name for r in fourth.run_requests]
    # lag_within_slo is evaluated at every reading, by the sensor itself.
    from dagster import AssetCheckEvaluation

    for result in (first, second, third, fourth):
        (check,) = [e for e in result.asset_events if isinstance(e, AssetCheckEvaluation)]
        assert check.check_name == "lag_within_slo" and check.passed
        assert check.metadata["slo_s"].value == 20 * 60 and check.metadata["time_lag_s"].value >= 0
    records = env["instance"].fetch_materializations(AssetKey(["ctl", "gpu_allocation"]), limit=10).records
    assert len(records) == 2  # every decision is an event (the test reported two of them to the instance)


@pytest.mark.integration
def test_throughput_is_recorded_only_while_the_group_never_waited_for_data(controlled):
    # A backlog is no sign of saturation: nothing consumes this topic (offsets are committed at checkpoints in
    # production, so a backlog stays while the workers idle); only the workers can say they never waited.
    env = controlled
    history = env["p"].history()
    produce_events(env["servers"], 40)
    cursor = sensor_tick(env).cursor
    for saturated in (False, True):
        env["workers"].saturated = saturated
        time.sleep(0.5)
        produce_events(env["servers"], 40)
        result = sensor_tick(env, cursor)
        cursor = result.cursor
        assert decision_of(result)["backlog"] > 0
        recorded = history.throughput("ctl")
        assert len(recorded) == int(saturated)
    # Recorded in pipeline units: the stand-ins' 100 samples/s per worker, at 30x.
    assert recorded.iloc[-1]["samples_per_s"] == pytest.approx(2 * 100.0 / 30.0)
    history.dispose()


@pytest.mark.integration
def test_the_trainers_metric_is_recorded_beside_lag_at_every_reading(controlled):
    env = controlled
    history = env["p"].history()
    cursor = None
    for auc in (None, 0.61, 0.74):
        env["workers"].auc = auc
        produce_events(env["servers"], 20)
        result = sensor_tick(env, cursor)
        cursor = result.cursor
        stream = next(e for e in result.asset_events if e.asset_key.path == ["ctl", "stream_metrics"])
        assert stream.metadata.get("model_auc", None) == (None if auc is None else MetadataValue.float(auc))
        assert decision_of(result).get("model_auc") == auc
        time.sleep(0.3)
    rows = history.stream("ctl")
    assert rows["model_metric"].tolist()[:1] == [None] or pd.isna(rows["model_metric"].iloc[0])
    assert rows["model_metric"].tolist()[-2:] == [0.61, 0.74] and set(rows["model_metric_name"].dropna()) == {"auc"}
    history.dispose()


@pytest.mark.integration
def test_a_failed_rescale_is_retried_later_and_the_decision_says_so(controlled):
    env = controlled
    produce_events(env["servers"], 40)
    first = sensor_tick(env)
    time.sleep(0.5)
    second = sensor_tick(env, first.cursor)
    env["instance"].report_runless_asset_event(second.asset_events[-1])
    rescale = next(r for r in second.run_requests if r.job_name == "ctl_rescale")
    env["workers"].fail = True
    failed = (
        env["defs"]
        .resolve_job_def("ctl_rescale")
        .execute_in_process(instance=env["instance"], run_config=rescale.run_config, raise_on_error=False)
    )
    assert not failed.success
    third = sensor_tick(env, second.cursor)
    decision = decision_of(third)
    assert decision["workers"] == 3 and "ctl_rescale" not in [r.job_name for r in third.run_requests]
    assert "the last 1 rescale run(s) failed" in decision["action"] and "retrying in" in decision["action"]

    env["service"].close()  # the trainer service is gone: hold, and say where it was looked for
    fourth = sensor_tick(env, third.cursor)
    assert decision_of(fourth)["held"].startswith(
        f"the launcher did not answer (the local trainer service at {env['service'].url}"
    )
    assert not [r for r in fourth.run_requests if r.job_name == "ctl_rescale"]


@pytest.mark.integration
@pytest.mark.parametrize(
    "controlled",
    [{"policy": "static", "policy_options": {"workers": 3}, "advisory": True, "record_every_minutes": 20}],
    indirect=True,
)
def test_a_changed_decision_is_recorded_at_once_and_an_unchanged_one_waits_for_its_cadence(controlled):
    env = controlled
    produce_events(env["servers"], 40)
    first = sensor_tick(env)  # no rate yet: a hold at the 2 that run, recorded as the first decision
    time.sleep(0.5)
    second = sensor_tick(env, first.cursor)  # 3 advised: a change, recorded though 20 minutes have not passed
    time.sleep(0.5)
    third = sensor_tick(env, second.cursor)  # 3 advised again: nothing changed, nothing recorded
    assert decision_of(first)["held"] and decision_of(second)["action"] == "advisory: nothing applied"
    assert decision_of(second)["workers"] == 3 and not third.asset_events
    assert third.cursor is not None and "recorded_at" in third.cursor


def test_clock_converts_between_wall_and_pipeline_time():
    clock = PipelineClock(48.0, wall_start=1000.0, pipeline_start=5000.0)
    assert clock.at(1010.0) == 5480.0 and clock.wall_at(5480.0) == 1010.0
    assert clock.duration(2.0) == 96.0 and clock.rate(96.0) == 2.0 and clock.wall_duration(600.0) == 12.5
    assert PipelineClock().at(123.0) == 123.0


@pytest.mark.parametrize(
    "settings, field",
    [
        (dict(time_scale=1000.0, wall_start=0.0), None),  # the fastest allowed
        (dict(time_scale=1.0), None),  # wall time needs no start
        (dict(time_scale=1000.5, wall_start=0.0), "time_scale"),
        (dict(time_scale=0.5, wall_start=0.0), "time_scale"),
        (dict(time_scale=2.0), "wall_start"),  # compressed time needs the wall time it started at
    ],
)
def test_a_clock_is_wall_time_or_compressed_from_a_start(settings, field):
    if field is None:
        PipelineClock(**settings)
        return
    with pytest.raises(KaleConfigError) as err:
        PipelineClock(**settings)
    assert err.value.field == field


def test_threading_lock_is_not_held_by_status():
    """status() answers while a rescale is in progress (a sensor tick must not wait for a restart)."""
    from kale_dagster.launchers.base import GroupLauncher

    class Slow(GroupLauncher):
        def __init__(self):
            super().__init__()
            self.n, self.release, self.replacing = 1, threading.Event(), threading.Event()

        @property
        def workers(self):
            return self.n

        def _running_at(self, n):
            return n == self.n

        def _replace_group(self, n):
            self.replacing.set()
            self.release.wait(10)
            self.n = n
            return {}

        def stop(self):
            pass

    slow = Slow()
    thread = threading.Thread(target=slow.rescale, args=(4,))
    thread.start()
    assert slow.replacing.wait(10)
    # status() answers while the rescale is held (a status that waited for it would wait for the release).
    answered: list = []
    asking = threading.Thread(target=lambda: answered.append(slow.status()))
    asking.start()
    asking.join(timeout=5)
    assert answered and not slow.release.is_set(), "status() waited for the rescale"
    status = answered[0]
    assert status.rescaling and status.workers == 4
    slow.release.set()
    thread.join()
    assert not slow.status().rescaling and slow.status().downtimes_s


@pytest.mark.parametrize(
    "stored, expected",
    [
        ({"predictions": [[1.0, 2.0]], "recorded_at": 5.0}, ControlCursor(((1.0, 2.0),), recorded_at=5.0)),
        ({}, ControlCursor()),
        (None, ControlCursor()),
        ({"predictions": [[1.0, "x"]]}, ControlCursor()),
        ({"predictions": [[1.0, float("nan")]]}, ControlCursor()),
        ({"predictions": [[1.0, 2.0, 3.0]]}, ControlCursor()),
        ({"recorded_at": True}, ControlCursor()),
        ({"plotted_at": 5.0}, ControlCursor()),  # an older version's: read as fresh
        ({"predictions": [], "other": 1}, ControlCursor()),
        (
            {"policy_state": {"window": [1, 2]}, "running_workers": 3, "recorded_at": 7.0, "recorded": "3|3"},
            ControlCursor((), {"window": [1, 2]}, 3, 7.0, "3|3"),
        ),
        ({"policy_state": [1]}, ControlCursor()),
        ({"running_workers": -1}, ControlCursor()),
        ({"running_workers": True}, ControlCursor()),
        ({"recorded_at": float("inf")}, ControlCursor()),
        (
            {"decisions": {"keep": 4, "held": 1}, "rescales": {"scale_up": 1}},
            ControlCursor(decisions={"keep": 4, "held": 1}, rescales={"scale_up": 1}),
        ),
        ({"decisions": {"keep": -1}}, ControlCursor()),
        ({"rescales": {"keep": 1.5}}, ControlCursor()),
        ({"decisions": [1]}, ControlCursor()),
    ],
)
def test_the_control_cursor_checks_its_own_shape(stored, expected):
    cursor = ControlCursor.from_dict(stored)
    assert cursor == expected and cursor.policy_state == expected.policy_state
    assert (cursor.decisions, cursor.rescales) == (expected.decisions, expected.rescales)
    assert ControlCursor.from_dict(cursor.to_dict()) == cursor  # what is written reads back as written


def test_one_function_reads_the_controller_s_reading_from_history():
    import pandas as pd

    rows = pd.DataFrame(
        {
            "ts": [0.0, 60.0, 120.0, 400.0],
            "arrival_rate": [None, 100.0, 200.0, 300.0],
            "consumption_rate": [None, 50.0, None, 150.0],
            "sample_lag": [0, 10, 20, 30],
            "time_lag_s": [0.0, 1.0, 2.0, 3.0],
        }
    )
    reading = reading_from(rows, rate_window_s=300.0)
    # The window is (100, 400]: the last two rates; the latest interval's is the last row's.
    assert (reading.time, reading.arrival_rate, reading.consumption_rate) == (400.0, 250.0, 150.0)
    assert (reading.latest_arrival_rate, reading.backlog, reading.time_lag_s) == (300.0, 30.0, 3.0)
    first = reading_from(rows.iloc[:1], rate_window_s=300.0)  # a first snapshot measured no rate: none is made up
    assert first.arrival_rate is None and first.consumption_rate is None and first.latest_arrival_rate is None


@pytest.mark.integration
def test_kale_status_reads_where_each_pipeline_stands_from_the_instance_alone(controlled, tmp_path):
    import json
    import subprocess
    import sys

    from kale_dagster.definitions.status import format_status, read_status

    env = controlled
    env["workers"].auc = 0.7
    cursor = None
    for _ in range(2):
        produce_events(env["servers"], 40)
        result = sensor_tick(env, cursor)
        cursor = result.cursor
        for event in result.asset_events:  # stored, as the daemon stores a sensor's events
            env["instance"].report_runless_asset_event(event)
        time.sleep(0.3)
    store_sensor_cursor(env["instance"], "ctl_stream_metrics", cursor)  # as the daemon keeps it
    (status,) = read_status(env["instance"])
    assert (status.name, status.running_workers, status.min_workers, status.max_workers) == ("ctl", 2, 1, 8)
    assert sum(status.decisions.values()) == 2 and set(status.decisions) <= set(OUTCOMES), status.decisions
    assert status.desired_workers is not None and status.slo_minutes == 20 and status.backlog is not None
    assert status.decided_age_s is not None and 0 <= status.decided_age_s < 30
    assert status.reason and status.policy == "hpa" and status.extras["model_auc"] == 0.7
    assert not status.sensor_running and status.failed_runs_last_hour == 0  # the test ticks the sensor by hand
    text = format_status([status])
    assert all(len(line) <= 80 for line in text.splitlines()) and "SENSOR STOPPED" in text
    # The command, on the same instance (its directory is DAGSTER_HOME): the time an operator waits.
    home = env["instance"].root_directory
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "kale_dagster.cli", "status", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DAGSTER_HOME": home},
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["schema_version"] == 1
    (printed,) = printed["pipelines"]
    assert printed["name"] == "ctl" and printed["running_workers"] == 2
    print(f"kale status answered in {took:.2f} s")

    # The same state as Prometheus metrics: the collector, then the endpoint an operator scrapes.
    import platform

    from dagster import DagsterInstance
    from dagster import __version__ as dagster_version
    from prometheus_client import CollectorRegistry, generate_latest

    from kale_dagster.definitions.prometheus import PipelineCollector

    registry = CollectorRegistry()
    registry.register(PipelineCollector(lambda: DagsterInstance.from_config(home)))
    text = generate_latest(registry).decode()
    # Fresh at every reading: the latest tick's figures, from the cursor the daemon stores at every tick.
    latest = json.loads(cursor)["control"]["latest"]
    assert status.read_at == latest["at"] and status.time_lag_s == latest["time_lag_s"]
    assert 0 <= time.time() - latest["at"] < 30
    for line in (
        'kale_workers_running{pipeline="ctl"} 2.0',
        'kale_workers_max{pipeline="ctl"} 8.0',
        'kale_slo_time_lag_seconds{pipeline="ctl"} 1200.0',
        'kale_model_auc{pipeline="ctl"} 0.7',
        f'kale_build_info{{dagster="{dagster_version}",python="{platform.python_version()}",version="0.1.0"}} 1.0',
        'kale_sensor_running{pipeline="ctl"} 0.0',
        'kale_restart_seconds{pipeline="ctl"}',
        *(f'kale_decisions_total{{outcome="{o}",pipeline="ctl"}} {float(n)}' for o, n in status.decisions.items()),
        'kale_rescales_requested_total{outcome="scale_down",pipeline="ctl"}',
    ):
        assert line in text, text
    (read_at,) = [
        float(x.split()[-1]) for x in text.splitlines() if x.startswith("kale_last_reading_timestamp_seconds{")
    ]
    assert read_at == pytest.approx(latest["at"])
    server = subprocess.Popen(
        [sys.executable, "-m", "kale_dagster.cli", "metrics", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "DAGSTER_HOME": home},
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split()[-1]
        import urllib.request

        with urllib.request.urlopen(url, timeout=30) as answer:
            assert 'kale_workers_running{pipeline="ctl"} 2.0' in answer.read().decode()
    finally:
        server.terminate()
        server.wait(10)


def store_sensor_cursor(instance, sensor: str, cursor: str | None) -> None:
    """Keep a sensor's cursor in the instance, as the daemon does after a tick (the test ticks by hand)."""
    from dagster._core.remote_origin import (
        InProcessCodeLocationOrigin,
        RemoteInstigatorOrigin,
        RemoteRepositoryOrigin,
    )
    from dagster._core.scheduler.instigation import (
        InstigatorState,
        InstigatorStatus,
        InstigatorType,
        SensorInstigatorData,
    )
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    location = InProcessCodeLocationOrigin(LoadableTargetOrigin(python_file=__file__))
    origin = RemoteInstigatorOrigin(RemoteRepositoryOrigin(location, "__repository__"), sensor)
    instance.add_instigator_state(
        InstigatorState(origin, InstigatorType.SENSOR, InstigatorStatus.STOPPED, SensorInstigatorData(cursor=cursor))
    )


@pytest.mark.parametrize("command", [["status"], ["metrics", "serve", "--port", "0"]])
def test_kale_status_and_metrics_without_an_instance_are_one_line(command):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    done = subprocess.run(
        [sys.executable, "-m", "kale_dagster.cli", *command], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "no Dagster instance" in done.stderr and "set DAGSTER_HOME" in done.stderr


@pytest.mark.parametrize(
    "running, decided, rescale_to, held, outcome",
    [
        (3, 3, None, "", "keep"),
        (3, 5, 5, "", "scale_up"),
        (3, 5, None, "", "scale_up"),  # advisory: what it would have done
        (3, 2, 2, "", "scale_down"),
        (3, 3, 3, "", "recover"),  # a failed group restarted at its size
        (3, 3, None, "no arrival rate yet", "held"),
    ],
)
def test_a_step_s_outcome_is_one_bounded_label(running, decided, rescale_to, held, outcome):
    from kale_dagster.control.controller import ControlStep
    from kale_dagster.model.types import Decision, Observation

    obs = None if held else Observation(0.0, running, 10.0, 10.0, 0.0, 0.0, 0.5)
    step = ControlStep(Decision(decided, "kale", "why"), obs, 60.0, "declared", rescale_to=rescale_to, held=held)
    assert step.outcome == outcome and outcome in OUTCOMES
