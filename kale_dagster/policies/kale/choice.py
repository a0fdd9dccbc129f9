"""The stabilizer planner's restart-cost test: which candidate level costs least, a restart included.

Every candidate, and keeping the current level, is played over the expected traffic through the FIFO backlog model
with the restart's downtime (``kale_dagster.model.projection``); the candidate whose cost (GPU-minutes + weighted lag
and SLO minutes) most undercuts keeping wins.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from kale_dagster.model.backlog import FifoBacklog
from kale_dagster.model.projection import Option, Projection, project_options
from kale_dagster.model.schedule import Objective
from kale_dagster.model.types import Observation
from kale_dagster.policies.registry import Sizing


class Judged(NamedTuple):
    """A candidate level, the span it is judged over, and the level a restart back up is charged at (or None)."""

    workers: int
    span: np.ndarray
    again: int | None


class Choice(NamedTuple):
    """The candidate levels and the rates to judge them over.

    With an ``outlook`` (the forecast past the horizon) a scale-in to a level the whole horizon's plan is content
    with (``horizon_need``, backlog drain included) is judged for as long as the outlook says that level will do:
    a scale-in of one worker repays a restart only after hours, longer than the horizon.  A lower level that the
    outlook says will not last is also charged the restart back up, unless keeping would need that restart too.
    """

    candidates: set[int]
    rates: np.ndarray
    outlook: np.ndarray | None = None
    horizon_need: int | None = None

    def choose(self, obs: Observation, sizing: Sizing, objective: Objective, tick_s: float) -> tuple[int, str]:
        """The candidate whose projected cost most undercuts keeping the current level, and why; at zero workers
        (activated: records wait) the cheapest candidate, since zero is no longer an option.  Priced by
        ``objective``, projected in steps of ``tick_s``."""
        current, restart = obs.workers, sizing.restart_s
        levels = {sizing.limits.whole_pods(w) for w in self.candidates}  # what runs: whole pods
        judged = [self._judge(w, current, sizing) for w in sorted(levels - {current})]
        projected = self._project(obs, sizing, objective.plan_step_s, tick_s, judged)

        def cost(p: Projection) -> float:
            return (
                p.gpu_minutes
                + objective.lag_weight * p.accumulated_lag_min
                + objective.violation_weight * p.violation_min
            )

        best, best_delta, best_note = current, math.inf if current == 0 else 0.0, ""
        for w, span, again in judged:
            p, kept = projected[(len(span), w, restart)], projected[(len(span), current, 0.0)]
            delta = cost(p) - cost(kept)
            if again is not None:  # what one restart costs over the span at that level
                delta += cost(projected[(len(span), again, restart)]) - cost(projected[(len(span), again, 0.0)])
            if delta < best_delta:
                best, best_delta = w, delta
                best_note = (
                    f"{w} workers cost least over {len(span) * objective.plan_step_s / 3600:.1f} h including a "
                    f"{restart / 60:.1f} min restart{' and one back up' if again is not None else ''}: "
                    f"{p.gpu_minutes:.0f} GPU-min and {p.accumulated_lag_min:.0f} lag-min (max {p.max_lag_s / 60:.1f} "
                    f"min) vs {kept.gpu_minutes:.0f} GPU-min and {kept.accumulated_lag_min:.0f} lag-min at {current}"
                )
        if best == current:
            k = projected[(len(self.rates), current, 0.0)]
            return (
                current,
                f"keeping {current} costs least (lag {k.accumulated_lag_min:.0f} lag-min over the horizon, max "
                f"{k.max_lag_s / 60:.1f} min)",
            )
        return best, best_note

    def _judge(self, workers: int, current: int, sizing: Sizing) -> Judged:
        """The span ``workers`` is judged over, and the level of a restart back up to charge it (or None)."""
        if workers == 0:  # zero holds for the span; anything arriving needs a worker again
            return Judged(0, self.rates, 1 if np.any(self.rates > 0) else None)
        outlook, need = self.outlook, self.horizon_need
        if workers < current and outlook is not None and len(outlook) and need is not None and workers >= need:
            span, back_up = _lasting(workers, current, self.rates, outlook, sizing)
            return Judged(workers, span, workers if back_up else None)
        return Judged(workers, self.rates, None)

    def _project(
        self, obs: Observation, sizing: Sizing, step_s: float, tick_s: float, judged: list[Judged]
    ) -> dict[tuple[int, int, float], Projection]:
        """One projection per span, keyed (span length, workers, downtime): keeping, each candidate after its
        restart, and each restart back up's level with and without it."""
        restart = sizing.restart_s
        start = FifoBacklog.from_observation(obs.time, obs.backlog, obs.time_lag_s)
        projected: dict[tuple[int, int, float], Projection] = {}
        for span in {len(j.span): j.span for j in [Judged(obs.workers, self.rates, None), *judged]}.values():
            same = [j for j in judged if len(j.span) == len(span)]
            options = [(obs.workers, 0.0)] + [(j.workers, restart) for j in same]
            options += [(j.again, d) for j in same if j.again is not None for d in (restart, 0.0)]
            options = list(dict.fromkeys(options))
            played = project_options(
                start,
                span,
                step_s,
                [Option(w, float(sizing.model.predict(w)), d) for w, d in options],
                sizing.limits.slo_s,
                tick_s=tick_s,
            )
            projected.update({(len(span), *option): p for option, p in zip(options, played)})
        return projected


def _lasting(
    workers: int, current: int, rates: np.ndarray, outlook: np.ndarray, sizing: Sizing
) -> tuple[np.ndarray, bool]:
    """The horizon extended by the outlook while ``workers`` keep up with it; and whether the outlook then rises
    above them but not above ``current`` (a restart back up that keeping would not need)."""
    capacity = float(sizing.model.predict(workers))
    above = np.flatnonzero(outlook > capacity)
    if len(above) == 0:
        return np.concatenate([rates, outlook]), False
    k = int(above[0])
    return np.concatenate([rates, outlook[:k]]), bool(outlook[k] <= float(sizing.model.predict(current)))
