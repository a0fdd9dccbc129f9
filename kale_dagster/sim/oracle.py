"""The physical limit: the cheapest worker schedule with perfect foresight, under the simulator's model.

Kale minimises GPU-minutes + ``lag_weight`` x lag-minutes +
``violation_weight`` x minutes above the SLO over a forecast; this finds
the schedule that minimises the same cost over the whole trace knowing
every arrival, so a policy's cost over the oracle's says how far from the
limit it is (planning error plus forecast error plus estimation error).

A dynamic program over (decision step, workers).  A step is the plan step
(or the restart time, if longer); changing the count at a step's start
pauses consumption for the restart time, during which the new GPUs are
held.  The backlog is carried exactly as the simulator's fluid FIFO queue
(the time lag of a backlog is read from the cumulative arrivals: the oldest
waiting sample is the one that arrived when the arrivals still to be
consumed began).  A state's label is (cost so far, backlog): at each
(step, workers) only labels no other beats on both are kept, and at most
``max_labels`` of those, evenly spread from the cheapest to the emptiest
queue.  That cap makes the schedule feasible but possibly not optimal, so
its cost is an upper bound on the optimum: ``kale backtest`` reports the
cap, and the bench checks that a larger one changes nothing that matters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kale_dagster.errors import KaleConfigError
from kale_dagster.forecast.base import Forecast
from kale_dagster.model.limits import Limits
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.model.types import Decision, Observation

MINUTE = 60.0
DAY_STEPS = 1440  # minutes: how far the perfect forecast's outlook reaches


@dataclass(frozen=True)
class OracleSchedule:
    workers: np.ndarray  # per minute
    cost: float  # the DP's own account of the objective over the whole trace
    step_minutes: int
    max_labels: int


class _Arrivals:
    """Cumulative arrivals, to read a backlog's time lag at a minute's end."""

    def __init__(self, rates: np.ndarray):
        self.rates = rates
        self.cumulative = np.concatenate([[0.0], np.cumsum(rates * MINUTE)])

    def time_lag(self, minute_end: int, backlog: np.ndarray) -> np.ndarray:
        """Age, at the end of minute ``minute_end - 1``, of the oldest of ``backlog`` waiting samples (FIFO)."""
        position = self.cumulative[minute_end] - backlog
        j = np.clip(np.searchsorted(self.cumulative, position, side="right") - 1, 0, len(self.rates) - 1)
        rate = self.rates[j]
        within = np.where(rate > 0, (position - self.cumulative[j]) / np.where(rate > 0, rate, 1.0), 0.0)
        lag = minute_end * MINUTE - (j * MINUTE + within)
        return np.where(backlog > 1e-9, np.maximum(lag, 0.0), 0.0)


def _prune(cost: np.ndarray, backlog: np.ndarray, max_labels: int) -> np.ndarray:
    """Indices of the labels no other beats on both cost and backlog, at most ``max_labels``, cheapest first."""
    order = np.lexsort((cost, backlog))  # by backlog, then cost
    best = np.minimum.accumulate(cost[order])
    keep = order[np.concatenate([[True], cost[order][1:] < best[:-1] - 1e-9])]
    keep = keep[np.argsort(cost[keep], kind="stable")]
    if len(keep) > max_labels:
        keep = keep[np.unique(np.linspace(0, len(keep) - 1, max_labels).round().astype(int))]
    return keep


def optimal_schedule(
    rates: np.ndarray,
    model: ThroughputModel,
    limits: Limits,
    plan_step_s: float = 600.0,
    lag_weight: float = 8.0,
    violation_weight: float = 100.0,
    max_labels: int = 24,
) -> OracleSchedule:
    """The cheapest schedule for per-minute arrival ``rates`` (samples/s); see the module docstring."""
    rates = np.asarray(rates, dtype=float)
    if len(rates) == 0:
        raise KaleConfigError("rates", "the trace is empty")
    if max_labels < 1:
        raise KaleConfigError("max_labels", f"must be >= 1, got {max_labels}")
    program = _Program(rates, model, limits, plan_step_s, lag_weight, violation_weight, max_labels)
    # The first step starts at any count without a restart; each later one from its predecessor's labels.
    labels, parents = program.first(), []
    for k in range(1, program.steps):
        labels, step_parents = program.stage(k, labels)
        parents.append(step_parents)
    cost, per_step = program.backtrack(labels, parents)
    return OracleSchedule(np.repeat(per_step, program.step)[: len(rates)], cost, program.step, max_labels)


#: One worker count's labels: (costs, backlogs), each undominated by another of the count's.
Labels = tuple[np.ndarray, np.ndarray]


class _Program:
    """The dynamic program's stages: play a step for many labels at once, advance every count's labels one step
    (staying, or restarting into it from any label), and backtrack the cheapest schedule."""

    def __init__(
        self,
        rates: np.ndarray,
        model: ThroughputModel,
        limits: Limits,
        plan_step_s: float,
        lag_weight: float,
        violation_weight: float,
        max_labels: int,
    ):
        self.rates, self.slo_s, self.max_labels = rates, limits.slo_s, max_labels
        self.lag_weight, self.violation_weight = lag_weight, violation_weight
        self.step = max(int(round(plan_step_s / MINUTE)), math.ceil(limits.restart_s / MINUTE), 1)
        self.steps = math.ceil(len(rates) / self.step)
        self.arrivals = _Arrivals(rates)
        self.counts = np.arange(limits.min_workers, limits.max_workers + 1)
        self.capacity = np.asarray(model.predict(self.counts), dtype=float)
        # Share of each minute of a step that consumes after a restart at the step's start.
        self.serving = np.clip((np.arange(1, self.step + 1) * MINUTE - limits.restart_s) / MINUTE, 0.0, 1.0)

    def play(
        self, k: int, backlog: np.ndarray, cap: np.ndarray, restarted: np.ndarray, workers: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Play step ``k`` for labels (backlog, capacity, restarted?): the backlog after it, and its cost."""
        rates, step = self.rates, self.step
        cost = workers * float(min(step, len(rates) - k * step))  # GPU-minutes
        for i in range(step):
            m = k * step + i
            if m >= len(rates):
                break
            share = np.where(restarted, self.serving[i], 1.0)
            backlog = np.maximum(backlog + (rates[m] - cap * share) * MINUTE, 0.0)
            lag = self.arrivals.time_lag(m + 1, backlog)
            cost = cost + self.lag_weight * lag / MINUTE + self.violation_weight * (lag > self.slo_s)
        return backlog, cost

    def first(self) -> list[Labels]:
        """Each count's one label after the first step, started there without a restart."""
        n = len(self.counts)
        b, c = self.play(0, np.zeros(n), self.capacity, np.zeros(n, bool), self.counts)
        return [(c[wi : wi + 1], b[wi : wi + 1]) for wi in range(n)]

    def stage(self, k: int, labels: list[Labels]) -> tuple[list[Labels], list[tuple[np.ndarray, np.ndarray]]]:
        """Every count's labels after step ``k``, and each label's parent (count index, label index)."""
        # A restart can come from any label of any count: only the union's undominated labels matter.
        all_cost = np.concatenate([c for c, _ in labels])
        all_backlog = np.concatenate([b for _, b in labels])
        origin_w = np.concatenate([np.full(len(c), wi) for wi, (c, _) in enumerate(labels)])
        origin_l = np.concatenate([np.arange(len(c)) for c, _ in labels])
        union = _prune(all_cost, all_backlog, self.max_labels)
        # Every count's candidates (its own labels staying, the union's restarting into it) advance in one pass.
        stays = [len(c) for c, _ in labels]
        sizes = np.array(stays) + len(union)
        into = np.repeat(np.arange(len(self.counts)), sizes)
        pw = np.concatenate([np.concatenate([np.full(n, wi), origin_w[union]]) for wi, n in enumerate(stays)])
        pl = np.concatenate([np.concatenate([np.arange(n), origin_l[union]]) for n in stays])
        before = np.concatenate([np.concatenate([c, all_cost[union]]) for c, _ in labels])
        backlog = np.concatenate([np.concatenate([b, all_backlog[union]]) for _, b in labels])
        b, c = self.play(k, backlog, self.capacity[into], pw != into, self.counts[into])
        c = c + before
        new_labels, parents = [], []
        for wi, end in enumerate(np.cumsum(sizes)):
            part = slice(end - sizes[wi], end)
            keep = _prune(c[part], b[part], self.max_labels)
            new_labels.append((c[part][keep], b[part][keep]))
            parents.append((pw[part][keep], pl[part][keep]))
        return new_labels, parents

    def backtrack(
        self, labels: list[Labels], parents: list[list[tuple[np.ndarray, np.ndarray]]]
    ) -> tuple[float, np.ndarray]:
        """The cheapest final label's cost and the worker count of each step that led to it."""
        finals = [(float(c.min()), wi, int(c.argmin())) for wi, (c, _) in enumerate(labels)]
        cost, wi, li = min(finals)
        chosen = [wi]
        for k in range(self.steps - 2, -1, -1):
            pw, pl = parents[k][wi]
            wi, li = int(pw[li]), int(pl[li])
            chosen.append(wi)
        return cost, self.counts[np.array(chosen[::-1])]


@dataclass
class SchedulePolicy:
    """Replays a per-minute schedule in the simulator, so the oracle is scored as every policy is."""

    workers: np.ndarray
    start: float  # epoch seconds of the schedule's first minute
    name: str = "oracle"
    sync_period_s: float = 60.0

    def decide(self, obs: Observation) -> Decision:
        minute = min(max(int((obs.time - self.start) // MINUTE), 0), len(self.workers) - 1)
        return Decision(int(self.workers[minute]), self.name, "the offline optimum's schedule")

    def state(self) -> dict:
        return {}

    def load_state(self, state: dict) -> None:
        pass


class Hindsight:
    """A perfect forecaster for the simulator: the trace's true future rates, with no band.

    Kale run on it shows its planning error alone (the oracle adds what
    foresight of every minute, not just the horizon, would buy).
    """

    name = "hindsight"

    def __init__(self, times: pd.DatetimeIndex, rates: np.ndarray):
        self.starts = np.array([t.timestamp() for t in times])
        self.rates = np.asarray(rates, dtype=float)
        self._last = None

    def fit(self, history: pd.DataFrame) -> Hindsight:
        self._last = pd.Timestamp(history["timestamp"].iloc[-1]).timestamp()
        return self

    def predict(self, steps: int, history: pd.DataFrame | None = None) -> Forecast:
        if history is not None:
            self.fit(history)
        assert self._last is not None, "fit() or a history first"
        start = self._last + MINUTE
        first = int(np.searchsorted(self.starts, start))
        point = self.rates[first : first + steps]
        if len(point) < steps:  # past the trace's end: its last rate holds
            point = np.concatenate([point, np.full(steps - len(point), self.rates[-1])])
        outlook = self.rates[first + steps : first + DAY_STEPS]  # the rest of the true day
        return Forecast(
            start=start, step_s=MINUTE, point=point, lower=point, upper=point, model=self.name, outlook=outlook
        )
