"""The planner's program from now (``model.schedule.plan_from_now``): brute force from a running group, and the
decisions it makes on the cases that matter (a rise ahead, a short dip, a backlog)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from kale_dagster import ThroughputModel
from kale_dagster.model.limits import Limits
from kale_dagster.model.schedule import Objective, Program, _front, _prune, plan_from_now
from kale_dagster.sim.metrics import objective
from kale_dagster.sim.oracle import SchedulePolicy, optimal_schedule
from kale_dagster.sim.simulate import SimConfig, simulate

LINEAR = ThroughputModel.linear(100.0)


def _simulated_cost(rates, workers, running, limits):
    times = pd.date_range("2026-01-01", periods=len(rates), freq="1min", tz="UTC")
    config = SimConfig(limits=limits, restart_jitter=0.0, initial_workers=running)
    result = simulate(rates, times, SchedulePolicy(np.asarray(workers), times[0].timestamp()), LINEAR, config)
    return objective(result.metrics.to_json(), len(rates))


@pytest.mark.parametrize(
    "case, rates, running",
    [
        ("a burst ahead of 1 running worker", [30.0] * 10 + [350.0] * 20 + [30.0] * 10, 1),
        ("a fall ahead of 4 running workers", [350.0] * 10 + [60.0] * 30, 4),
        ("uneven load from 2 workers", [120.0] * 10 + [260.0] * 10 + [90.0] * 10 + [200.0] * 10, 2),
    ],
)
def test_the_plan_from_a_running_group_is_the_brute_force_optimum(case, rates, running):
    """Every 4-step schedule from ``running`` workers, a restart charged wherever the count changes (the first
    step included), played in the simulator: the program's plan costs what the cheapest of them costs."""
    rates = np.array(rates)
    limits = Limits(max_workers=4, slo_minutes=10, restart_minutes=2)
    plan, cost = plan_from_now(rates, LINEAR, limits, limits.restart_s, running, 0.0, 0.0, max_labels=1000)
    brute = min(
        (_simulated_cost(rates, np.repeat(p, 10), running, limits), p) for p in itertools.product(range(1, 5), repeat=4)
    )
    assert cost == pytest.approx(brute[0], rel=1e-9), (plan, brute)
    assert _simulated_cost(rates, np.repeat(plan, 10), running, limits) == pytest.approx(cost, rel=1e-9)


def test_from_the_optimum_s_own_start_the_plan_is_the_optimum_s():
    rates = np.array([120.0] * 30 + [400.0] * 60 + [150.0] * 30)
    limits = Limits(max_workers=6, slo_minutes=10, restart_minutes=5)
    oracle = optimal_schedule(rates, LINEAR, limits, max_labels=50)
    first = int(oracle.workers[0])
    plan, cost = plan_from_now(rates, LINEAR, limits, limits.restart_s, first, 0.0, 0.0, max_labels=50)
    assert cost == pytest.approx(oracle.cost) and np.array_equal(np.repeat(plan, 10)[: len(rates)], oracle.workers)


LIMITS = Limits(max_workers=16, slo_minutes=20, restart_minutes=10)


@pytest.mark.parametrize(
    "case, rates, running, backlog, lag_s, first_steps",
    [
        ("flat traffic the group covers: keep it", [350.0] * 360, 4, 0.0, 0.0, (4, 4)),
        # 10-minute restarts: the last step that is ready before the rise.
        ("a rise in 30 minutes: restart in time for it", [350.0] * 30 + [950.0] * 330, 4, 0.0, 0.0, (4, 10)),
        ("a 20-minute dip: a restart costs more than it saves", [350.0] * 20 + [550.0] * 340, 6, 0.0, 0.0, (6, 6)),
        # 2 workers would cover 150/s, but not drain the restart's 10 minutes of arrivals soon enough.
        ("a lasting fall: drop the idle workers", [150.0] * 360, 8, 0.0, 0.0, (3, 3)),
        ("a backlog 15 minutes old: more workers to drain it", [350.0] * 360, 4, 300_000.0, 900.0, (11, 11)),
    ],
)
def test_plan_decisions(case, rates, running, backlog, lag_s, first_steps):
    plan, _ = plan_from_now(np.array(rates), LINEAR, LIMITS, LIMITS.restart_s, running, backlog, lag_s)
    assert tuple(plan[:2]) == first_steps, (case, plan)


@pytest.mark.parametrize(
    "case, rates, tail, running, first, last",
    [
        # Dropping the idle worker costs a restart's lag (about 570 GPU-minutes) and saves one worker-minute a minute.
        ("a fall that repays a restart after 9 h, 6 h planned", [30.0] * 360, [], 2, 2, 2),
        ("the same fall held over 12 more hours: drop the worker", [30.0] * 360, [30.0] * 720, 2, 1, 1),
        # Nothing restarts in the tail: a rise there is met by the plan's last steps (6 workers cover 600/s).
        ("a rise past the horizon, unseen", [150.0] * 60, [], 2, 2, 2),
        ("a rise past the horizon, held over", [150.0] * 60, [600.0] * 120, 2, 2, 6),
    ],
)
def test_past_the_horizon_the_plan_holds_its_last_count(case, rates, tail, running, first, last):
    plan, _ = plan_from_now(np.array(rates), LINEAR, LIMITS, LIMITS.restart_s, running, 0.0, 0.0, tail=np.array(tail))
    assert len(plan) == len(rates) // 10 and (plan[0], plan[-1]) == (first, last), (case, plan)


def test_the_held_tail_costs_what_holding_the_last_count_costs():
    """The plan's cost with a tail is the simulated cost of its steps, then its last count over the tail."""
    rates, tail = np.array([120.0] * 30 + [300.0] * 30), np.array([300.0] * 25 + [80.0] * 40)
    limits = Limits(max_workers=6, slo_minutes=10, restart_minutes=4)
    plan, cost = plan_from_now(rates, LINEAR, limits, limits.restart_s, 2, 0.0, 0.0, max_labels=1000, tail=tail)
    workers = np.concatenate([np.repeat(plan, 10), np.full(len(tail), plan[-1])])
    assert _simulated_cost(np.concatenate([rates, tail]), workers, 2, limits) == pytest.approx(cost, rel=1e-9)


def test_a_decision_at_32_workers_and_a_6_hour_horizon_weighs_every_count():
    limits = Limits(max_workers=32, slo_minutes=20, restart_minutes=10)
    rates = np.full(360, float(LINEAR.predict(30)))
    plan, _ = plan_from_now(rates, LINEAR, limits, limits.restart_s, 30, 0.0, 0.0, Objective())
    assert plan[0] == 30 and len(plan) == 36


def test_a_step_plays_the_queue_minute_by_minute():
    """A step's queue, computed for all its minutes at once, is the queue of the minute-by-minute recursion
    b = max(b + arrivals - service, 0), and its cost charges each minute's lag and SLO as the recursion finds them,
    for labels that restart or not, start empty or waiting, and keep up or not."""
    rng = np.random.default_rng(3)
    limits = Limits(min_workers=1, max_workers=6, slo_minutes=4, restart_minutes=3)
    rates = rng.uniform(0.0, 500.0, 40)
    program = Program(rates, LINEAR, limits, Objective(plan_step_s=600.0), max_labels=8, past=np.full(5, 200.0))
    labels = 50
    backlog, cap = rng.uniform(0.0, 60_000.0, labels) * (rng.random(labels) < 0.7), rng.uniform(0.0, 600.0, labels)
    restarted, workers = rng.random(labels) < 0.5, rng.integers(1, 7, labels)
    for k in range(program.steps):
        after, cost = program.play(k, backlog, cap, restarted, workers)
        queue, expected = backlog.copy(), workers * float(min(program.step, len(rates) - k * program.step))
        for i, m in enumerate(range(k * program.step, min((k + 1) * program.step, len(rates)))):
            share = np.where(restarted, program.serving[i], 1.0)
            queue = np.maximum(queue + (rates[m] - cap * share) * 60.0, 0.0)
            lag = program.arrivals.time_lag(len(program.past) + m + 1, queue)
            expected = expected + 8.0 * lag / 60.0 + 100.0 * (lag > limits.slo_s)
        np.testing.assert_allclose(after, queue, rtol=1e-9, atol=1e-6)
        np.testing.assert_allclose(cost, expected, rtol=1e-9)
        backlog = after


@pytest.mark.parametrize("max_labels", [1, 3, 8, 100])
def test_pruning_keeps_the_undominated_labels_cheapest_first_and_spreads_a_cap(max_labels):
    """Each row keeps the labels no other beats on both cost and backlog, cheapest first; past the cap, an even
    spread from the cheapest to the emptiest queue.  One row of finite labels prunes the same alone (_front)."""
    rng = np.random.default_rng(7)
    cost, backlog = rng.uniform(0, 100, (30, 12)), rng.uniform(0, 100, (30, 12))
    cost[rng.random(cost.shape) < 0.2] = np.inf  # padding
    backlog[np.isinf(cost)] = np.inf
    keep, size = _prune(cost, backlog, max_labels)
    for row in range(len(cost)):
        c, b = cost[row], backlog[row]
        front = [i for i in range(len(c)) if np.isfinite(c[i]) and not ((c <= c[i]) & (b <= b[i])).sum() > 1]
        front.sort(key=lambda i: c[i])
        if len(front) > max_labels:
            front = [front[j] for j in np.linspace(0, len(front) - 1, max_labels).round().astype(int)]
        assert list(keep[row, : size[row]]) == front
        finite = np.flatnonzero(np.isfinite(c))
        assert list(finite[_front(c[finite], b[finite], max_labels)]) == front
