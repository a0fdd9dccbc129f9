"""The physical limit: the cheapest worker schedule with perfect foresight, under the simulator's model.

Kale minimises GPU-minutes + ``lag_weight`` x lag-minutes +
``violation_weight`` x minutes above the SLO over a forecast; this finds
the schedule that minimises the same cost over the whole trace knowing
every arrival, so a policy's cost over the oracle's says how far from the
limit it is (planning error plus forecast error plus estimation error).

The program is ``model.schedule``'s, run over the whole trace from an
empty queue.  Its label cap makes the schedule feasible but possibly not
optimal, so its cost is an upper bound on the optimum: ``kale backtest``
reports the cap, and the bench checks that a larger one changes nothing
that matters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kale_dagster.errors import KaleConfigError
from kale_dagster.forecast.base import Forecast
from kale_dagster.model.limits import Limits
from kale_dagster.model.schedule import MINUTE, Objective, Program
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.model.types import Decision, Observation

DAY_STEPS = 1440  # minutes: how far the perfect forecast's outlook reaches
BURST_WINDOW = 61  # minutes: the span around each minute whose median a burst is measured against


@dataclass(frozen=True)
class OracleSchedule:
    workers: np.ndarray  # per minute
    cost: float  # the DP's own account of the objective over the whole trace
    step_minutes: int
    max_labels: int


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
    program = Program(rates, model, limits, Objective(plan_step_s, lag_weight, violation_weight), max_labels)
    cost, per_step = program.solve()  # the first step starts at any count, without a restart
    return OracleSchedule(np.repeat(per_step, program.step)[: len(rates)], cost, program.step, max_labels)


@dataclass
class SchedulePolicy:
    """Replays a per-minute schedule in the simulator, so the oracle is scored as every policy is."""

    workers: np.ndarray
    start: float  # epoch seconds of the schedule's first minute
    name: str = "oracle"
    sync_period_s: float = 60.0

    def decide(self, obs: Observation) -> Decision:
        if obs.restarting:  # a restart drawn longer than planned delays the next step; it never redirects one
            return Decision(obs.workers, self.name, "the offline optimum's schedule, after the restart")
        minute = min(max(int((obs.time - self.start) // MINUTE), 0), len(self.workers) - 1)
        return Decision(int(self.workers[minute]), self.name, "the offline optimum's schedule")

    def state(self) -> dict:
        return {}

    def load_state(self, state: dict) -> None:
        pass


def without_bursts(rates: np.ndarray, cap: float) -> np.ndarray:
    """Per-minute ``rates`` with their bursts cut off: no minute above ``cap`` times the median of the hour around
    it."""
    rates = np.asarray(rates, dtype=float)
    around = pd.Series(rates).rolling(BURST_WINDOW, center=True, min_periods=1).median().to_numpy()
    return np.minimum(rates, cap * around)


class Hindsight:
    """A perfect forecaster for the simulator: the trace's true future rates, with no band.

    Kale run on it shows its planning error alone (the oracle adds what
    foresight of every minute, not just the horizon, would buy).  With
    ``burst_cap`` it foresees everything but the bursts (``without_bursts``):
    Kale run on that shows what the bursts cost a forecast that is perfect
    otherwise, since no forecast of the past sees a burst coming.
    """

    name = "hindsight"

    def __init__(self, times: pd.DatetimeIndex, rates: np.ndarray, burst_cap: float | None = None):
        if burst_cap is not None and burst_cap < 1:
            raise KaleConfigError("burst_cap", f"must be >= 1 (a multiple of the hour's median rate), got {burst_cap}")
        self.starts = np.array([t.timestamp() for t in times])
        self.rates = np.asarray(rates, dtype=float) if burst_cap is None else without_bursts(rates, burst_cap)
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
