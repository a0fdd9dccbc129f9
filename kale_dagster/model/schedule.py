"""The cheapest worker schedule over per-minute arrivals: a dynamic program over (decision step, workers).

Two callers share it.  The offline optimum (``sim.oracle``) plans the
whole trace from an empty queue, knowing every arrival.  Kale's planner
(``policies.kale``) plans from now, over its forecast: the workers that
run, the backlog that waits and how old it is, the fitted throughput model
and the measured restart time, and applies the first step (receding
horizon, as model predictive control does); past its horizon it may hold
each count over a tail of the forecast (one last stage without restarts),
so that a restart repaid only after the horizon is weighed.

The objective is Kale's: GPU-minutes + ``lag_weight`` x lag-minutes +
``violation_weight`` x minutes above the SLO.  A step is the plan step (or
the restart time, if longer); changing the count at a step's start pauses
consumption for the restart time, during which the new GPUs are held.  The
backlog is carried exactly as the simulator's fluid FIFO queue (the time
lag of a backlog is read from the cumulative arrivals: the oldest waiting
sample is the one that arrived when the arrivals still to be consumed
began).  A state's label is (cost so far, backlog): at each (step, workers)
only labels no other beats on both are kept, and at most ``max_labels`` of
those, evenly spread from the cheapest to the emptiest queue.  That cap
makes the schedule feasible but possibly not optimal, so its cost is an
upper bound on the optimum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from kale_dagster.model.limits import Limits
from kale_dagster.model.throughput import ThroughputModel

MINUTE = 60.0


@dataclass(frozen=True)
class Objective:
    """Kale's cost: GPU-minutes + ``lag_weight`` x lag-minutes + ``violation_weight`` x minutes above the SLO, over
    steps of ``plan_step_s`` (or the restart time, if longer)."""

    plan_step_s: float = 600.0
    lag_weight: float = 8.0
    violation_weight: float = 100.0


class _Arrivals:
    """Cumulative arrivals, to read a backlog's time lag at a minute's end."""

    def __init__(self, rates: np.ndarray):
        self.cumulative = np.concatenate([[0.0], np.cumsum(rates * MINUTE)])
        # By the minute a position falls in: its start and its rate (inf where none arrived: no share of it waits).
        # One entry past the last minute, for a position at the very end, whose backlog is empty (lag 0 anyway).
        self.start_s = np.arange(len(rates) + 1) * MINUTE
        self.divisor = np.append(np.where(rates > 0, rates, np.inf), np.inf)

    def time_lag(self, minute_end: int | np.ndarray, backlog: np.ndarray) -> np.ndarray:
        """Age, at the end of minute ``minute_end - 1``, of the oldest of ``backlog`` waiting samples (FIFO); with
        minutes, each label's (a row of ``backlog``) at each minute (its columns)."""
        return self.time_lag_from(self.cumulative[minute_end], np.asarray(minute_end) * MINUTE, backlog)

    def time_lag_from(self, arrived: np.ndarray, end_s: np.ndarray, backlog: np.ndarray) -> np.ndarray:
        """:meth:`time_lag` given the arrivals by each minute's end (``arrived``) and that end in seconds."""
        position = arrived - backlog
        j = np.searchsorted(self.cumulative, position, side="right")
        j -= 1
        np.maximum(j, 0, out=j)
        lag = end_s - (self.start_s[j] + (position - self.cumulative[j]) / self.divisor[j])
        np.maximum(lag, 0.0, out=lag)
        lag[backlog <= 1e-9] = 0.0
        return lag


def _cheaper_than_before(ordered: np.ndarray) -> np.ndarray:
    """Of labels' costs ordered by backlog (along the last axis), which beat every label before them: the
    undominated ones (the first, if finite)."""
    before = np.full_like(ordered, np.inf)
    before[..., 1:] = np.minimum.accumulate(ordered, axis=-1)[..., :-1] - 1e-9
    return ordered < before


def _prune(cost: np.ndarray, backlog: np.ndarray, max_labels: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's labels that no other of the row beats on both cost and backlog, at most ``max_labels``, cheapest
    first: their columns, and how many each row keeps (columns past that are padding).  Missing labels are
    ``inf`` in both."""
    rows = np.arange(len(cost))[:, None]
    order = np.lexsort((cost, backlog), axis=-1)  # by backlog, then cost
    ordered = cost[rows, order]
    kept = _cheaper_than_before(ordered)
    order = order[rows, np.argsort(np.where(kept, ordered, np.inf), axis=1, kind="stable")]  # kept, cheapest first
    n = kept.sum(axis=1)
    width = min(int(n.max()), max_labels)
    over = n > max_labels
    if not over.any():
        return order[:, :width], n
    columns = np.arange(width)[None, :].repeat(len(cost), axis=0)
    columns[over] = _spread(n[over] - 1, max_labels)
    return order[rows, columns], np.minimum(n, max_labels)


def _front(cost: np.ndarray, backlog: np.ndarray, max_labels: int) -> np.ndarray:
    """``_prune`` of one row of finite labels: the kept labels' indices, cheapest first."""
    order = np.lexsort((cost, backlog))
    # Each kept label is cheaper than every one with less backlog, so the cheapest come last.
    kept = order[_cheaper_than_before(cost[order])][::-1]
    return kept if len(kept) <= max_labels else kept[_spread(len(kept) - 1, max_labels)]


def _spread(last, max_labels: int) -> np.ndarray:
    """``max_labels`` columns evenly spread from 0 (the cheapest) to ``last`` (the emptiest queue), one row per
    entry of ``last`` when it is an array."""
    return np.linspace(0, last, max_labels, axis=-1).round().astype(int)


class Labels(NamedTuple):
    """Every worker count's labels (a row each), undominated within the row, cheapest first; ``inf`` pads a row
    with fewer labels than the widest."""

    cost: np.ndarray
    backlog: np.ndarray


class _Parents(NamedTuple):
    """Where a stage's labels came from: each new label's column among the stage's candidates (``keep``; None: the
    label itself, a held stage), the candidates being every count's own ``width`` labels staying, then the union's
    labels (count ``union_w``, column ``union_l``) restarting into it."""

    keep: np.ndarray | None
    width: int
    union_w: np.ndarray
    union_l: np.ndarray

    def of(self, wi: int, li: int) -> tuple[int, int]:
        """The parent (count, column) of label ``li`` of count ``wi``."""
        column = li if self.keep is None else int(self.keep[wi, li])
        if column < self.width:
            return wi, column
        return int(self.union_w[column - self.width]), int(self.union_l[column - self.width])


class Program:
    """The dynamic program's stages: play a step for many labels at once, advance every count's labels one step
    (staying, or restarting into it from any label), and backtrack the cheapest schedule.  ``past`` are the
    minutes before the first whose arrivals still wait (for the backlog's time lag only); ``counts`` the worker
    counts considered (default: every count the limits allow)."""

    def __init__(
        self,
        rates: np.ndarray,
        model: ThroughputModel,
        limits: Limits,
        objective: Objective,
        max_labels: int,
        restart_s: float | None = None,
        past: np.ndarray | None = None,
        counts: np.ndarray | None = None,
        hold_from: int | None = None,
    ):
        restart_s = limits.restart_s if restart_s is None else restart_s
        self.rates, self.slo_s, self.max_labels = rates, limits.slo_s, max_labels
        self.lag_weight, self.violation_weight = objective.lag_weight, objective.violation_weight
        self.step = max(int(round(objective.plan_step_s / MINUTE)), math.ceil(restart_s / MINUTE), 1)
        planned = len(rates) if hold_from is None else min(hold_from, len(rates))
        self.steps = math.ceil(planned / self.step)
        # Minutes before the first, whose arrivals are still waiting: only for the backlog's time lag.
        self.past = np.zeros(0) if past is None else np.asarray(past, dtype=float)
        self.arrivals = _Arrivals(np.concatenate([self.past, rates]))
        self.counts = limits.sizes() if counts is None else counts
        self.capacity = np.asarray(model.predict(self.counts), dtype=float)
        # Share of each minute of a step that consumes after a restart at the step's start.
        self.serving = np.clip((np.arange(1, self.step + 1) * MINUTE - restart_s) / MINUTE, 0.0, 1.0)
        bounds = [(k * self.step, min((k + 1) * self.step, planned)) for k in range(self.steps)]
        # Past ``hold_from``, one last stage in which every count holds (no restart) until the rates end.
        self.held = planned < len(rates)
        if self.held:
            bounds.append((planned, len(rates)))
            self.steps += 1
        self.bounds = bounds
        # Each minute's end: the arrivals by then (the past's included) and its time in seconds, for the time lag.
        ends = np.arange(len(self.past) + 1, len(self.past) + len(rates) + 1)
        self.arrived_by_end, self.end_s = self.arrivals.cumulative[ends], ends * MINUTE

    def play(
        self, k: int, backlog: np.ndarray, cap: np.ndarray, restarted: np.ndarray, workers: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Play step ``k`` for labels (backlog, capacity, restarted?): the backlog after it, and its cost."""
        lo, hi = self.bounds[k]
        served = cap[:, None]
        if restarted.any():
            served = served * np.where(restarted[:, None], self.serving[None, : hi - lo], 1.0)
        # The queue of each minute at once (Lindley's recursion b = max(b + x, 0) unrolled): with S the running sum
        # of arrivals less service, the backlog is S less its lowest point so far, or less -backlog before it.
        net = np.cumsum((self.rates[None, lo:hi] - served) * MINUTE, axis=1)
        queue = net - np.minimum(np.minimum.accumulate(net, axis=1), -backlog[:, None])
        lag = self.arrivals.time_lag_from(self.arrived_by_end[lo:hi], self.end_s[lo:hi], queue)
        waiting = self.lag_weight * lag / MINUTE + self.violation_weight * (lag > self.slo_s)
        return queue[:, -1], workers * float(hi - lo) + waiting.sum(axis=1)

    def first(self, backlog: float = 0.0, workers: int | None = None) -> Labels:
        """Each count's one label after the first step from ``backlog``: started there without a restart, or,
        when ``workers`` run now, restarted into any other count."""
        n = len(self.counts)
        restarted = np.zeros(n, bool) if workers is None else self.counts != workers
        b, c = self.play(0, np.full(n, float(backlog)), self.capacity, restarted, self.counts)
        return Labels(c[:, None], b[:, None])

    def hold(self, k: int, labels: Labels) -> tuple[Labels, _Parents]:
        """Every label after step ``k`` with its count held (no restart); each is its own parent."""
        valid = np.isfinite(labels.cost)
        into = np.nonzero(valid)[0]
        b, c = self.play(k, labels.backlog[valid], self.capacity[into], np.zeros(len(into), bool), self.counts[into])
        cost, backlog = np.full(valid.shape, np.inf), np.full(valid.shape, np.inf)
        cost[valid], backlog[valid] = labels.cost[valid] + c, b
        none = np.zeros(0, int)
        return Labels(cost, backlog), _Parents(None, valid.shape[1], none, none)

    def stage(self, k: int, labels: Labels) -> tuple[Labels, _Parents]:
        """Every count's labels after step ``k``, and where each came from."""
        n, width = labels.cost.shape
        valid = np.isfinite(labels.cost)
        from_w, from_l = np.nonzero(valid)
        own_cost, own_backlog = labels.cost[valid], labels.backlog[valid]
        # A restart can come from any label of any count: only the union's undominated labels matter.
        union = _front(own_cost, own_backlog, self.max_labels)
        u, m = len(union), len(from_w)
        # Every count's candidates (its own labels staying, then the union's restarting into it) advance in one
        # pass; a union label played into its own count stays (no restart).
        restarting = union[None, :].repeat(n, axis=0).ravel()  # every union label, once per count
        into = np.concatenate([from_w, np.arange(n).repeat(u)])
        b, c = self.play(
            k,
            np.concatenate([own_backlog, own_backlog[restarting]]),
            self.capacity[into],
            np.concatenate([np.zeros(m, bool), from_w[restarting] != into[m:]]),
            self.counts[into],
        )
        cost, backlog = np.full((n, width + u), np.inf), np.full((n, width + u), np.inf)
        cost[:, :width][valid], backlog[:, :width][valid] = c[:m] + own_cost, b[:m]
        cost[:, width:] = (c[m:] + own_cost[restarting]).reshape(n, u)
        backlog[:, width:] = b[m:].reshape(n, u)
        keep, size = _prune(cost, backlog, self.max_labels)
        rows = np.arange(n)[:, None]
        padding = np.arange(keep.shape[1])[None, :] >= size[:, None]
        new = Labels(np.where(padding, np.inf, cost[rows, keep]), np.where(padding, np.inf, backlog[rows, keep]))
        return new, _Parents(keep, width, from_w[union], from_l[union])

    def backtrack(self, labels: Labels, parents: list[_Parents]) -> tuple[float, np.ndarray]:
        """The cheapest final label's cost and the worker count of each step that led to it."""
        wi, li = np.unravel_index(np.argmin(labels.cost), labels.cost.shape)  # the first of equals, by count
        cost, wi, li = float(labels.cost[wi, li]), int(wi), int(li)
        chosen = [wi]
        for k in range(self.steps - 2, -1, -1):
            wi, li = parents[k].of(wi, li)
            chosen.append(wi)
        return cost, self.counts[np.array(chosen[::-1])]

    def solve(self, backlog: float = 0.0, workers: int | None = None) -> tuple[float, np.ndarray]:
        """The cheapest schedule's cost and the workers of each step, from ``backlog`` and ``workers`` (None: any
        count, started without a restart)."""
        labels, parents = self.first(backlog, workers), []
        for k in range(1, self.steps):
            labels, step_parents = (self.hold if self.held and k == self.steps - 1 else self.stage)(k, labels)
            parents.append(step_parents)
        cost, per_step = self.backtrack(labels, parents)
        return cost, per_step[:-1] if self.held else per_step


def plan_from_now(
    rates: np.ndarray,
    model: ThroughputModel,
    limits: Limits,
    restart_s: float,
    workers: int,
    backlog: float,
    time_lag_s: float,
    objective: Objective = Objective(),
    max_labels: int = 8,
    fewest: int | None = None,
    tail: np.ndarray | None = None,
) -> tuple[np.ndarray, float]:
    """The cheapest schedule from now: ``workers`` running, ``backlog`` waiting for ``time_lag_s``, per-minute
    ``rates`` ahead, no step below ``fewest`` workers (default: the limits' minimum), and past them the per-minute
    rates of ``tail`` with the last step's count held (no restart).  Returns the workers of each step (the tail's
    not included) and the schedule's cost.

    The backlog is taken to have arrived evenly over its time lag (what a reading tells of it).  No count above
    what the peak (the tail's included) needs while the backlog drains within half the SLO, plus two, is weighed."""
    rates = np.asarray(rates, dtype=float)
    minutes = max(math.ceil(time_lag_s / MINUTE), 1) if backlog > 0 else 0
    past = np.full(minutes, backlog / (minutes * MINUTE)) if minutes else None
    held = tail is not None and len(tail) > 0
    ahead = np.concatenate([rates, np.asarray(tail, dtype=float)]) if held else rates
    need = model.min_workers_for(float(ahead.max()) + backlog / max(limits.slo_s / 2, MINUTE), limits.max_workers)
    top = min(max(need + 2, workers), limits.max_workers)
    program = Program(
        ahead,
        model,
        limits,
        objective,
        max_labels,
        restart_s,
        past,
        limits.sizes(fewest, top),
        hold_from=len(rates) if held else None,
    )
    cost, per_step = program.solve(backlog, workers)
    return per_step, cost
