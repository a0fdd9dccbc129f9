"""The offline optimum: the dynamic program against brute force, its replay in the simulator, perfect foresight."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from kale_dagster import KaleConfigError, ThroughputModel
from kale_dagster.model.limits import Limits
from kale_dagster.sim.metrics import objective
from kale_dagster.sim.oracle import Hindsight, SchedulePolicy, optimal_schedule, without_bursts
from kale_dagster.sim.simulate import SimConfig, simulate

LINEAR = ThroughputModel.linear(100.0)


def _times(n):
    return pd.date_range("2026-01-01", periods=n, freq="1min", tz="UTC")


def _cost(rates, workers, restart_s, slo_s=600.0):
    config = SimConfig(
        limits=Limits(restart_minutes=restart_s / 60, slo_minutes=slo_s / 60, max_workers=4),
        restart_jitter=0.0,
    )
    result = simulate(
        rates, _times(len(rates)), SchedulePolicy(np.asarray(workers), _times(1)[0].timestamp()), LINEAR, config
    )
    return objective(result.metrics.to_json(), len(rates))


@pytest.mark.parametrize(
    "case, rates, restart_s, changes",
    [
        (
            "a quiet hour, a burst, quiet again: worth two restarts",
            [30.0] * 10 + [350.0] * 20 + [30.0] * 10,
            60.0,
            True,
        ),
        (
            "the same with 8-minute restarts: cheaper to hold the peak's count",
            [30.0] * 10 + [350.0] * 20 + [30.0] * 10,
            480.0,
            False,
        ),
        ("uneven load, no burst", [120.0] * 10 + [260.0] * 10 + [90.0] * 10 + [200.0] * 10, 60.0, None),
    ],
)
def test_the_dynamic_program_finds_the_brute_force_optimum(case, rates, restart_s, changes):
    rates = np.array(rates)
    limits = Limits(max_workers=4, slo_minutes=10, restart_minutes=restart_s / 60)
    schedule = optimal_schedule(rates, LINEAR, limits, max_labels=1000)
    brute = min(
        (_cost(rates, np.repeat(plan, 10), restart_s), plan) for plan in itertools.product(range(1, 5), repeat=4)
    )
    assert schedule.cost == pytest.approx(brute[0], rel=1e-9)  # the DP's own account is the simulator's
    assert _cost(rates, schedule.workers, restart_s) == pytest.approx(brute[0], rel=1e-9)
    if changes is not None:
        assert (len(set(schedule.workers)) > 1) == changes


def test_bad_settings_name_the_field():
    with pytest.raises(KaleConfigError, match="max_labels"):
        optimal_schedule(np.ones(10), LINEAR, Limits(), max_labels=0)


def test_hindsight_forecasts_the_true_future_from_the_last_known_minute():
    rates = np.arange(10.0)
    times = _times(10)
    history = pd.DataFrame({"timestamp": times[:4], "rate": rates[:4]})
    forecast = Hindsight(times, rates).fit(history).predict(3)
    assert forecast.start == times[4].timestamp() and list(forecast.point) == [4.0, 5.0, 6.0]
    assert list(forecast.upper) == list(forecast.point)
    assert list(
        Hindsight(times, rates).predict(4, history=pd.DataFrame({"timestamp": times[:8], "rate": rates[:8]})).point
    ) == [8.0, 9.0, 9.0, 9.0]


@pytest.mark.parametrize(
    "spike, cap, kept",
    [
        (1.0, 2.0, 10.0),  # no burst: every minute kept
        (1.5, 2.0, 15.0),  # under the cap: kept
        (5.0, 2.0, 20.0),  # a burst: cut to the cap times the hour's median
        (5.0, 1.0, 10.0),  # cap 1: nothing above the hour's median
    ],
)
def test_without_bursts_cuts_what_rises_above_the_cap_times_the_hours_median(spike, cap, kept):
    rates = np.full(180, 10.0)
    rates[90:100] *= spike  # ten minutes: the hour around them has a median of 10
    cut = without_bursts(rates, cap)
    assert cut[95] == pytest.approx(kept)
    assert np.array_equal(cut[:90], rates[:90]) and np.array_equal(cut[100:], rates[100:])


def test_hindsight_without_its_bursts_forecasts_the_rest_of_the_truth():
    rates = np.full(180, 10.0)
    rates[90:100] = 50.0
    times = _times(180)
    history = pd.DataFrame({"timestamp": times[:80], "rate": rates[:80]})
    point = Hindsight(times, rates, burst_cap=2.0).fit(history).predict(30).point
    assert point.max() == pytest.approx(20.0) and point[0] == 10.0
    with pytest.raises(KaleConfigError, match="burst_cap"):
        Hindsight(times, rates, burst_cap=0.5)
