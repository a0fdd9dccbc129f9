"""Kale: forecast-driven worker allocation with a reactive fallback.

One decision, in stages that are each small and testable:

1. fallback check: a burst (the latest interval's arrival rate far above
   both what the workers can consume and what was expected), no forecast,
   lag above the fallback threshold, or recent forecast error too large ->
   the reactive policy on measured rates acts;
2. plan, by one of two planners (``planner``):

   * ``receding`` (the default): the offline optimum's dynamic program
     (``kale_dagster.model.schedule``), solved from now over the forecast
     (its point, then its outlook, up to ``plan_horizon_s``, or
     ``trusted_horizon_s`` while its recent error is small; scaled up by
     as much as it fell short of the arrivals of the last two hours, at
     most ``max_forecast_scale``) with the workers running, the backlog
     waiting and its age as the state, the fitted throughput model and the
     measured restart time; the first step is applied, and the plan is
     solved again every ``replan_s`` or when the workers change.  The
     fallback plans the same way, on the measured rate held for as long as
     the backlog is old (a rate that has lasted that long is expected to
     last as long again), then the forecast.  Either scales in only if a plan
     over its rates raised by the forecast's band (``scale_in_quantile``)
     scales in too.
   * ``stabilizer``: the paper's pipeline.  Workers per plan step from the
     forecast (upper band or a quantile) plus the backlog's drain rate
     (``kale_dagster.model.estimator``) and again from the point forecast;
     our variant of the paper's Algorithm 1, or the paper's own with
     ``stabilizer="paper"`` (``kale_dagster.model.stabilizer``); guards (no
     scale-in on a forecast alone while measured lag is high, as AWS
     predictive scaling, and none within ``tau_s`` of the last rescale);
     then a restart-cost test: every candidate level, and keeping the
     current one, is played over the horizon's expected traffic through
     the FIFO backlog model with the restart's downtime
     (``kale_dagster.model.projection``), and the cheapest wins.

Both minimise the same objective as the offline optimum: GPU-minutes +
``lag_weight`` x lag-minutes + ``violation_weight`` x minutes above the SLO.

With ``min_workers: 0`` (scale to zero, as KEDA users know it) zero workers
is one more level while at most ``activation_lag`` samples wait: the
receding planner weighs it like any count (its restart back up included);
the stabilizer judges it as holding zero over the horizon with one restart
back up charged.  At zero Kale holds until more than ``activation_lag``
samples wait, then starts at the cheapest level of at least one worker.

While a restart is under way Kale waits for it, but for a burst its new
group cannot serve where the launcher can still redirect the restart
(``Observation.retargetable``): the restart is then pointed at a group
sized for the burst.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, get_args

import numpy as np

from kale_dagster.errors import KaleConfigError
from kale_dagster.model.backlog import FifoBacklog
from kale_dagster.model.estimator import estimate_workers, resample_max
from kale_dagster.model.limits import Limits
from kale_dagster.model.projection import Option, Projection, project_options
from kale_dagster.model.schedule import Objective, plan_from_now
from kale_dagster.model.stabilizer import MODES, Mode, stabilize
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.model.types import Decision, Observation
from kale_dagster.policies.registry import PolicySpec, Sizing
from kale_dagster.rules import check, need, ordered, setting

Planner = Literal["receding", "stabilizer"]
PLANNERS: tuple[str, ...] = get_args(Planner)


@dataclass(frozen=True)
class KaleConfig:
    """Kale's own knobs; the pipeline's limits (worker bounds, SLO, restart time) come with its ``Sizing``.

    Times are in seconds.  ``lag_weight`` prices one lag-minute integrated
    over one minute in GPU-minutes; when every duration is compressed by a
    speed-up (demo, end-to-end benchmark) multiply it by the speed-up, since
    accumulated lag shrinks with the square of the time scale and GPU-minutes
    only linearly.  ``None`` for the derived thresholds means: the
    SLO for the drain window (lag is back to zero one SLO after a restart),
    half the SLO for the fallback trigger, a quarter of it for the scale-in
    guard.
    """

    plan_step_s: float = setting(Objective.plan_step_s, gt=0, unit="s", description="the plan's step")
    rho: int = setting(1, ge=1, description="the stabilizer's smallest change, in workers")
    tau_s: float = setting(600.0, ge=0, unit="s", description="the shortest time between two rescales")
    forecast_quantile: float | None = setting(
        None, gt=0, lt=1, description="the forecast quantile planned for; None: the upper band"
    )
    drain_window_s: float | None = setting(None, gt=0, unit="s", description="a backlog is drained within this")
    fallback_lag_s: float | None = setting(None, gt=0, unit="s", description="lag above this falls back to rates")
    max_forecast_error: float = setting(0.5, gt=0, description="recent sMAPE above this falls back to rates")
    # A burst: the latest interval's arrival rate above this multiple of both the running workers' capacity and the
    # expected rate (the forecast's planning level now; without one, the windowed mean).  Acted on at once: the
    # windowed rate and the lag take a rate window or half an SLO to show it, too late to restart in time.
    burst_ratio: float = setting(2.0, gt=1, description="a multiple of capacity and of the expected rate")
    # The burst is sized on its first reading, often its onset: a restart sized for it that meets the burst's top
    # is followed by a second restart, two pauses at the worst time.  Above 1 the burst is planned for this
    # multiple of that reading (off by default: measured in docs/results.md, it trades one bursty trace for another).
    burst_scale: float = setting(1.0, ge=1, description="the burst path plans for this multiple of the burst's rate")
    scale_in_lag_guard_s: float | None = setting(None, gt=0, unit="s", description="no scale-in above this lag")
    lag_weight: float = setting(Objective.lag_weight, ge=0, description="GPU-minutes one lag-minute costs")
    violation_weight: float = setting(Objective.violation_weight, ge=0, description="GPU-minutes an SLO minute costs")
    projection_tick_s: float = setting(300.0, gt=0, unit="s", description="the backlog projection's step")
    sync_period_s: float = setting(60.0, gt=0, unit="s", description="how often the policy is asked")
    stabilizer: Mode = setting("kale", choices=MODES, description='"paper": Algorithm 1 exactly as published')
    # Judge a scale-in over as long as the forecast's outlook says the lower level lasts (see KalePolicy._choose).
    # Measured (README Results): far cheaper on bursty, mostly idle traffic, a little dearer on strongly daily traffic.
    outlook_scale_in: bool = setting(False, description="judge a scale-in over the forecast's outlook")
    planner: Planner = setting(
        "receding",
        choices=PLANNERS,
        description='"receding": the optimum\'s program over the forecast from now; "stabilizer": the paper\'s '
        "estimator and stabilizer, then the restart-cost test",
    )
    plan_horizon_s: float = setting(
        6 * 3600.0, ge=600, le=86_400, unit="s", description="how far the receding planner plans"
    )
    # A plan that ends before a level it will need cannot see that a restart into that level is coming anyway: on a
    # rising day a 6-hour plan adds a worker at every re-plan where one restart would do.  Only a forecast that has
    # proven accurate is worth planning on that far; on bursty traffic a long plan on the typical day runs lean.
    trusted_horizon_s: float = setting(
        12 * 3600.0,
        ge=600,
        le=86_400,
        unit="s",
        description="how far the receding planner plans while the forecast is accurate (trusted_forecast_error)",
    )
    trusted_forecast_error: float = setting(
        0.1, ge=0, description="recent sMAPE at or below which the forecast is planned on for trusted_horizon_s"
    )
    replan_s: float = setting(600.0, gt=0, unit="s", description="the receding planner re-plans at least this often")
    plan_tail_s: float = setting(
        0.0,
        ge=0,
        le=86_400,
        unit="s",
        description="past its horizon, the receding planner holds the plan's last count over this much more of the "
        "forecast, so that a restart that pays back only after the horizon is weighed; 0: the plan ends there",
    )
    plan_quantile: float | None = setting(
        0.5, gt=0, lt=1, description="the forecast quantile the receding planner plans on (0.5: the point forecast)"
    )

    # A scale-in the arrivals then exceed costs a pause and a slow drain; on bursty traffic the forecast's band is
    # wide and that risk outweighs the few workers saved (measured in docs/results.md).
    scale_in_quantile: float | None = setting(
        0.55,
        gt=0.5,
        lt=1,
        description="the receding planner scales in only if it would over the forecast raised to this quantile "
        "(the band's median ratio to the point); None: as the plan says",
    )
    max_forecast_scale: float = setting(
        2.0,
        ge=1,
        description="the receding planner scales the forecast up by its recent shortfall (the arrivals over the "
        "ratio window / what it predicted for them), at most this much; 1: never",
    )

    def __post_init__(self):
        check(self, self._horizon_problems)

    def _horizon_problems(self) -> list[KaleConfigError]:
        """The trusted horizon is at least the plain one; either may be the one to change, so both are named."""
        short, trusted = self.plan_horizon_s, self.trusted_horizon_s
        named = (
            ordered(self, "plan_horizon_s", "trusted_horizon_s"),
            need(short <= trusted, "trusted_horizon_s", f"must be >= plan_horizon_s ({short}), got {trusted}"),
        )
        return [problem for problem in named if problem is not None]


#: The longest horizon the fallback projects a rescale over (a backlog that takes longer to clear is cleared anyway).
MAX_FALLBACK_HORIZON_S = 6 * 3600.0


def _steps_past(obs: Observation) -> int:
    """How many steps of the observation's forecast lie in the past: the index of "now"."""
    fc = obs.forecast
    assert fc is not None  # asked only of observations with a forecast
    return max(int((obs.time - fc.start) // fc.step_s), 0)


def _minutes_ahead(obs: Observation, quantile: float | None) -> np.ndarray:
    """The observation's forecast at ``quantile`` from now on, then its outlook, one value per minute."""
    fc = obs.forecast
    assert fc is not None  # asked only of observations with a forecast
    series = np.concatenate([fc.level(quantile)[_steps_past(obs) :], fc.outlook_level(quantile)])
    return np.repeat(series, max(int(round(fc.step_s / 60)), 1))


class _Plan(NamedTuple):
    """The receding planner's latest plan, and what it was made at."""

    time: float
    workers: int
    path: str  # the policy label: the forecast's plan or the fallback's
    steps: np.ndarray
    band_judged: bool = False  # its scale-in was judged over the forecast's band (scale_in_quantile) and stands
    held: str = ""  # why it holds the running count where the plan scaled in (the band), said until it is due


def _fmt_rate(rate: float) -> str:
    return f"{rate:,.0f}/s"


@dataclass
class KalePolicy:
    """The Kale policy.  Keeps only the time of its last rescale as state."""

    sizing: Sizing
    config: KaleConfig = field(default_factory=KaleConfig)
    name: str = "kale"
    last_change_time: float | None = None
    #: The receding planner's latest plan, reused for replan_s while the workers and the path hold.
    _latest_plan: _Plan | None = field(default=None, init=False, repr=False)

    @property
    def sync_period_s(self) -> float:
        return self.config.sync_period_s

    @property
    def model(self) -> ThroughputModel:
        return self.sizing.model

    @property
    def limits(self) -> Limits:
        return self.sizing.limits

    @property
    def drain_window(self) -> float:
        return self.config.drain_window_s or self.limits.slo_s

    @property
    def fallback_lag(self) -> float:
        return self.config.fallback_lag_s or self.limits.slo_s / 2

    @property
    def scale_in_lag_guard(self) -> float:
        return self.config.scale_in_lag_guard_s or self.limits.slo_s / 4

    def state(self) -> dict:
        return {"last_change_time": self.last_change_time}

    def load_state(self, state: dict) -> None:
        self.last_change_time = state.get("last_change_time")

    # --- stages -------------------------------------------------------------

    def _burst(self, obs: Observation, latest: float | None = None) -> str:
        """Why the latest interval's rate (or ``latest``) is a burst to act on now, or "" when it is not."""
        latest = obs.latest_arrival_rate if latest is None else latest
        if latest is None:
            return ""
        capacity = float(self.model.predict(obs.workers))
        expected, of = obs.arrival_rate, "the windowed rate"
        if obs.forecast is not None and len(obs.forecast):
            now = min(_steps_past(obs), len(obs.forecast) - 1)
            expected, of = float(obs.forecast.level(self.config.forecast_quantile)[now]), "the forecast"
        bound = self.config.burst_ratio * max(capacity, expected)
        if latest <= bound:
            return ""
        return (
            f"burst: {_fmt_rate(latest)} over the last interval, above {self.config.burst_ratio:g}x both the "
            f"{obs.workers} workers' capacity {_fmt_rate(capacity)} and {of} {_fmt_rate(expected)}"
        )

    def _fallback_reason(self, obs: Observation) -> str:
        cfg = self.config
        if obs.forecast is None or len(obs.forecast) == 0:
            return "no forecast available"
        if obs.time_lag_s > self.fallback_lag:
            return f"lag {obs.time_lag_s / 60:.1f} min above the fallback threshold {self.fallback_lag / 60:.0f} min"
        if obs.forecast_error is not None and obs.forecast_error > cfg.max_forecast_error:
            return f"recent forecast error (sMAPE {obs.forecast_error:.2f}) above {cfg.max_forecast_error:.2f}"
        return ""

    def _planned_rates(self, obs: Observation, quantile: float | None) -> np.ndarray:
        """The forecast at ``quantile`` (None: the upper band; 0.5: the point forecast) from now on, each plan step's
        peak."""
        fc = obs.forecast
        assert fc is not None
        # Forecast steps already in the past are dropped so step 0 is "now".
        levels = fc.level(quantile)[_steps_past(obs) :]
        if len(levels) == 0:
            levels = np.array([obs.arrival_rate])
        return resample_max(levels, fc.step_s, self.config.plan_step_s)

    def _estimate(self, obs: Observation, rates: np.ndarray) -> tuple[list[int], float]:
        estimate = functools.partial(
            estimate_workers,
            rates=rates,
            step_s=self.config.plan_step_s,
            model=self.model,
            min_workers=self.limits.min_workers,
            max_workers=self.limits.max_workers,
            backlog=obs.backlog,
            arrival_rate=obs.arrival_rate,
            drain_window_s=self.drain_window,
        )
        est = estimate(downtime_s=0.0)
        if est.plan[0] != obs.workers:
            # Changing costs a restart, during which the backlog grows.
            est = estimate(downtime_s=self.sizing.restart_s)
        return list(est.plan), est.drain_rate

    def _project(
        self, obs: Observation, rates: np.ndarray, options: list[tuple[int, float]]
    ) -> dict[tuple[int, float], Projection]:
        """Each (workers, downtime s) held over ``rates`` from what is waiting now, keyed by the option."""
        cfg = self.config
        start = FifoBacklog.from_observation(obs.time, obs.backlog, obs.time_lag_s)
        played = project_options(
            start,
            rates,
            cfg.plan_step_s,
            [Option(w, float(self.model.predict(w)), d) for w, d in options],
            self.limits.slo_s,
            tick_s=cfg.projection_tick_s,
        )
        return dict(zip(options, played))

    def _cost(self, p: Projection) -> float:
        cfg = self.config
        return p.gpu_minutes + cfg.lag_weight * p.accumulated_lag_min + cfg.violation_weight * p.violation_min

    def _choose(
        self,
        obs: Observation,
        rates: np.ndarray,
        candidates: set[int],
        outlook: np.ndarray | None = None,
        horizon_need: int | None = None,
    ) -> tuple[int, str]:
        """The candidate whose projected cost (GPU-min + weighted lag) most undercuts keeping the current level;
        at zero workers (activated: records wait) the cheapest candidate, since zero is no longer an option.

        Each candidate is judged against keeping over the same span: the horizon, or, for a scale-in to a level
        the whole horizon's plan is content with (``horizon_need``, backlog drain included) when there is an
        ``outlook``, as long as the outlook says that level will do: a scale-in of one worker repays a restart
        only after hours, longer than the horizon.  A lower level that the outlook says will not last is also
        charged the restart back up, unless keeping would need that restart too.
        """
        current, restart = obs.workers, self.sizing.restart_s
        judged = []  # (workers, the span it is judged over, the level a restart back up is charged at, or None)
        for w in sorted(candidates - {current}):
            span, again = rates, None
            if w == 0:  # zero holds for the span; anything arriving needs a worker again
                again = 1 if np.any(rates > 0) else None
            elif (
                w < current and outlook is not None and len(outlook) and horizon_need is not None and w >= horizon_need
            ):
                span, back_up = self._lasting(w, current, rates, outlook)
                again = w if back_up else None
            judged.append((w, span, again))
        # One projection per span: keeping, each candidate after its restart, and each restart back up's level
        # with and without it.
        projected: dict[tuple[int, int, float], Projection] = {}
        for span in {len(span): span for _, span, _ in [(current, rates, None), *judged]}.values():
            options = [(current, 0.0)] + [(w, restart) for w, s, _ in judged if len(s) == len(span)]
            options += [(a, d) for _, s, a in judged if a is not None and len(s) == len(span) for d in (restart, 0.0)]
            options = list(dict.fromkeys(options))
            projected.update({(len(span), *option): p for option, p in self._project(obs, span, options).items()})

        best, best_delta, best_note = current, 0.0, ""
        if current == 0:  # activated: the cheapest start wins, however dear
            best_delta = math.inf
        for w, span, again in judged:
            p, kept = projected[(len(span), w, restart)], projected[(len(span), current, 0.0)]
            delta = self._cost(p) - self._cost(kept)
            if again is not None:  # what one restart costs over the span at that level
                delta += self._cost(projected[(len(span), again, restart)]) - self._cost(
                    projected[(len(span), again, 0.0)]
                )
            if delta < best_delta:
                best, best_delta = w, delta
                best_note = (
                    f"{w} workers cost least over {len(span) * self.config.plan_step_s / 3600:.1f} h including a "
                    f"{restart / 60:.1f} min restart{' and one back up' if again is not None else ''}: "
                    f"{p.gpu_minutes:.0f} GPU-min and {p.accumulated_lag_min:.0f} lag-min (max {p.max_lag_s / 60:.1f} "
                    "min) "
                    f"vs {kept.gpu_minutes:.0f} GPU-min and {kept.accumulated_lag_min:.0f} lag-min at {current}"
                )
        if best == current:
            k = projected[(len(rates), current, 0.0)]
            return (
                current,
                f"keeping {current} costs least (lag {k.accumulated_lag_min:.0f} lag-min over the horizon, max "
                f"{k.max_lag_s / 60:.1f} min)",
            )
        return best, best_note

    def _lasting(self, workers: int, current: int, rates: np.ndarray, outlook: np.ndarray) -> tuple[np.ndarray, bool]:
        """The horizon extended by the outlook while ``workers`` keep up with it; and whether the outlook then
        rises above them but not above ``current`` (a restart back up that keeping would not need)."""
        capacity = float(self.model.predict(workers))
        above = np.flatnonzero(outlook > capacity)
        if len(above) == 0:
            return np.concatenate([rates, outlook]), False
        k = int(above[0])
        return np.concatenate([rates, outlook[:k]]), bool(outlook[k] <= float(self.model.predict(current)))

    # --- decision -----------------------------------------------------------

    def decide(self, obs: Observation) -> Decision:
        cfg = self.config
        current = obs.workers
        if obs.restarting:
            return self._during_restart(obs)
        if current == 0 and obs.backlog <= self.limits.activation_lag:
            return Decision(
                0,
                self.name,
                f"idle at 0 workers: {obs.backlog:,.0f} samples waiting, not above activation_lag "
                f"{self.limits.activation_lag:,}",
            )

        burst = self._burst(obs)
        if burst:
            return self._decide_burst(obs, burst)
        fallback = self._fallback_reason(obs)
        if fallback:
            return self._decide_reactive(obs, fallback)

        if cfg.planner == "receding":
            return self._decide_receding(obs)
        # Two readings of the forecast: the planning level (the upper band, or forecast_quantile) sizes for what may
        # come, the point forecast for what is expected.  Both plans' levels are candidates; the restart-cost test
        # prices each on the expected traffic, since the upper band of bursty traffic is mostly bursts that a
        # held level pays for every minute, while a real burst is met by the burst trigger and the fallback.
        rates = self._planned_rates(obs, cfg.forecast_quantile)
        expected = self._planned_rates(obs, 0.5)
        raw_plan, drain = self._estimate(obs, rates)
        expected_plan, _ = self._estimate(obs, expected)
        plan = stabilize(raw_plan, cfg.plan_step_s / 60, rho=cfg.rho, tau_minutes=cfg.tau_s / 60, mode=cfg.stabilizer)
        plan_expected = stabilize(
            expected_plan, cfg.plan_step_s / 60, rho=cfg.rho, tau_minutes=cfg.tau_s / 60, mode=cfg.stabilizer
        )
        peak_i = int(np.argmax(rates))
        why = (
            f"forecast peak {_fmt_rate(rates[peak_i])} in {peak_i * cfg.plan_step_s / 60:.0f} min needs "
            f"{raw_plan[peak_i]} workers (expected {_fmt_rate(float(np.max(expected)))}, {max(expected_plan)} workers)"
        )
        if drain > 0:
            why += f"; backlog {obs.backlog:,.0f} drains at +{_fmt_rate(drain)}"
        details = {
            "raw_plan": raw_plan,
            "planned_rates": [float(r) for r in rates],
            "expected_plan": expected_plan,
            "expected_rates": [float(r) for r in expected],
        }
        outlook = self._outlook(obs) if cfg.outlook_scale_in else None
        return self._apply_guards(
            obs,
            set(plan) | set(plan_expected),
            expected,
            why,
            plan,
            details,
            policy=self.name,
            outlook=outlook,
            horizon_need=max(expected_plan),
        )

    def _decide_receding(self, obs: Observation) -> Decision:
        scale = self._forecast_scale(obs)
        why = "the forecast"
        if scale > 1:
            why += f" x{scale:.2f} (recent arrivals were {obs.forecast_ratio:.2f}x what it predicted)"
        cfg = self.config
        horizon = cfg.plan_horizon_s
        if obs.forecast_error is not None and obs.forecast_error <= cfg.trusted_forecast_error:
            horizon = cfg.trusted_horizon_s
            why += f", {horizon / 3600:g} h ahead (recent sMAPE {obs.forecast_error:.2f})"
        return self._receding(obs, _minutes_ahead(obs, cfg.plan_quantile) * scale, self.name, why, horizon)

    def _forecast_scale(self, obs: Observation) -> float:
        """How much to scale the forecast up: by as much as it fell short of the recent arrivals (a forecast fitted
        for the typical rate runs low on bursty traffic), within ``max_forecast_scale``.  Never down: lag costs
        ``lag_weight`` GPU-minutes a minute, so a forecast that ran high costs less than one that ran low."""
        ratio = obs.forecast_ratio
        return min(max(ratio, 1.0), self.config.max_forecast_scale) if ratio is not None else 1.0

    def _receding(
        self, obs: Observation, per_minute: np.ndarray, policy: str, why: str, horizon_s: float, fresh: bool = False
    ) -> Decision:
        """Apply the first step of the cheapest plan over ``per_minute`` rates (``_plan``), but a scale-in only if a
        plan over those rates raised by the forecast's band (``scale_in_quantile``) scales in too."""
        cfg = self.config
        plan = self._plan(obs, per_minute, policy, horizon_s, fresh)
        latest = self._latest_plan
        assert latest is not None  # _plan made or reused it
        target = int(plan[0])
        judge = target < obs.workers and not fresh and not latest.band_judged
        band = self._band_ratio(obs) if judge else 1.0
        if band > 1 and int(self._solve(obs, per_minute * band, horizon_s)[0]) >= obs.workers:
            # A scale-in pauses consumption, and if the arrivals exceed the forecast it then drains at little spare
            # capacity, for the sake of a few workers: on bursty traffic what it saves is less than the lag it risks.
            # The hold is cached as a plan, so it is judged again once replan_s has passed.
            plan = np.concatenate([[obs.workers], plan[1:]])
            held = (
                f"the plan over {why} scales in to {target}, but not over it x{band:.2f} (the forecast's band at "
                f"quantile {cfg.scale_in_quantile:g})"
            )
            self._latest_plan = _Plan(obs.time, obs.workers, policy, plan, held=held)
            return Decision(
                obs.workers, policy, f"hold at {obs.workers}: {held}", tuple(int(p) for p in plan), cfg.plan_step_s
            )
        if judge:  # the verdict holds with the plan, so a scale-in still pending is not judged again every tick
            self._latest_plan = latest._replace(band_judged=True)
        plan_t = tuple(int(p) for p in plan)
        if target == obs.workers:
            note = f"the plan over {why} keeps it"
            if latest.held:  # the band's hold, until the plan is due: the plan itself still scales in
                note = f"{latest.held}, {(obs.time - latest.time) / 60:.0f} min ago; judged again when the plan is due"
            return Decision(target, policy, f"hold at {target}: {note}", plan_t, cfg.plan_step_s)
        # The plan stays cached: it is keyed on the running workers, so it is solved again once they change, and
        # until then (a rescale under way, an advisory pipeline) it says the same.
        self.last_change_time = obs.time
        return Decision(target, policy, f"{obs.workers} -> {target} workers: plan over {why}", plan_t, cfg.plan_step_s)

    def _plan(self, obs: Observation, per_minute: np.ndarray, policy: str, horizon_s: float, fresh: bool) -> np.ndarray:
        """The cheapest plan over ``per_minute`` rates; the latest plan holds for ``replan_s`` while the workers and
        the path (``policy``) hold, unless ``fresh`` (news: a burst)."""
        latest = self._latest_plan
        if (
            not fresh
            and latest is not None
            and (latest.workers, latest.path) == (obs.workers, policy)
            and obs.time - latest.time < self.config.replan_s
        ):
            return latest.steps
        plan = self._solve(obs, per_minute, horizon_s)
        self._latest_plan = _Plan(obs.time, obs.workers, policy, plan)
        return plan

    def _solve(self, obs: Observation, per_minute: np.ndarray, horizon_s: float) -> np.ndarray:
        """The workers of each step of the cheapest schedule from now over ``horizon_s`` of ``per_minute`` rates
        (and past it ``plan_tail_s`` more, the last count held)."""
        cfg = self.config
        ahead = int(horizon_s // 60)
        tail = np.maximum(per_minute[ahead : ahead + int(cfg.plan_tail_s // 60)], 0.0)
        per_minute = per_minute[:ahead]
        if len(per_minute) == 0:
            per_minute = np.array([obs.arrival_rate])
        plan, _ = plan_from_now(
            np.maximum(per_minute, 0.0),
            self.model,
            self.limits,
            self.sizing.restart_s,
            obs.workers,
            obs.backlog,
            obs.time_lag_s,
            Objective(cfg.plan_step_s, cfg.lag_weight, cfg.violation_weight),
            fewest=self._fewest(obs),
            tail=tail,
        )
        return plan

    def _band_ratio(self, obs: Observation) -> float:
        """How far the forecast's ``scale_in_quantile`` lies above its point: the median ratio over its steps
        (1: no band, no forecast, or the option off)."""
        q, fc = self.config.scale_in_quantile, obs.forecast
        if q is None or fc is None or len(fc) == 0:
            return 1.0
        positive = fc.point > 0
        if not positive.any():
            return 1.0
        return float(np.median(fc.level(q)[positive] / fc.point[positive]))

    def _fewest(self, obs: Observation) -> int:
        """The fewest workers a plan may run: zero only while running, with min_workers 0, and at most
        activation_lag samples waiting (more would start the workers again at once)."""
        lim = self.limits
        idle = lim.min_workers == 0 and obs.workers > 0 and obs.backlog <= lim.activation_lag
        return 0 if idle else max(lim.min_workers, 1)

    def _during_restart(self, obs: Observation) -> Decision:
        """Wait for the restart under way, unless a burst comes that its group cannot serve and the launcher can
        still redirect the restart: then it is pointed at a group sized for the burst now, where waiting would
        pause the workers twice at the burst's top (the second restart after this one; docs/results.md)."""
        burst = self._burst(obs) if obs.retargetable else ""
        # A retarget starts the restart over, and a one-interval spike often ends before the restart would have:
        # the windowed rate must show at least half a burst too (measured: docs/results.md).
        if burst and self._burst(obs, latest=2 * obs.arrival_rate):
            decision = self._decide_burst(obs, f"{burst}, during the restart to {obs.workers}")
            if decision.workers > obs.workers:
                return decision
        return Decision(obs.workers, self.name, "rescale in progress; waiting for it to finish")

    def _decide_burst(self, obs: Observation, burst: str) -> Decision:
        assert obs.latest_arrival_rate is not None  # a burst is read from it
        scale = self.config.burst_scale
        if scale > 1:
            burst += f"; planned for {scale:g}x it"
        return self._decide_reactive(obs, burst, rate=obs.latest_arrival_rate * scale, burst=True)

    def _decide_reactive(
        self, obs: Observation, trigger: str, rate: float | None = None, burst: bool = False
    ) -> Decision:
        """Size for the measured ``rate`` (the windowed arrival rate unless given) held over the judge horizon."""
        cfg = self.config
        rate = obs.arrival_rate if rate is None else rate
        if obs.forecast is not None and len(obs.forecast):
            rate = max(rate, float(obs.forecast.point[0]))
        if cfg.planner == "receding":
            # A rate that has held for as long as the backlog is old is expected to hold as long again, then the
            # forecast (or the windowed rate) resumes.
            held = max(int(math.ceil(obs.time_lag_s / 60)), int(cfg.plan_step_s // 60))
            after = (
                _minutes_ahead(obs, 0.5) * self._forecast_scale(obs)
                if obs.forecast is not None and len(obs.forecast)
                else np.full(int(cfg.plan_horizon_s // 60), obs.arrival_rate)
            )
            return self._receding(
                obs,
                np.concatenate([np.full(held, rate), after[held:]]),
                f"{self.name}/fallback",
                f"fallback ({trigger})",
                cfg.plan_horizon_s,
                fresh=burst,
            )
        rates = np.array([rate])
        est = estimate_workers(
            rates,
            cfg.plan_step_s,
            self.model,
            self.limits.min_workers,
            self.limits.max_workers,
            backlog=obs.backlog,
            arrival_rate=obs.arrival_rate,
            downtime_s=self.sizing.restart_s,
            drain_window_s=self.drain_window,
        )
        target = est.plan[0]
        why = f"fallback ({trigger}): measured {_fmt_rate(rate)}"
        if est.drain_rate > 0:
            why += f" + drain {_fmt_rate(est.drain_rate)} for backlog {obs.backlog:,.0f}"
        # Judge the restart over long enough for the target to clear the backlog: with a deep backlog,
        # twice the SLO can end before a restart pays back, while keeping an allocation that cannot
        # keep up only grows the lag beyond it.
        spare = float(self.model.predict(target)) - rate
        drain_s = obs.backlog / spare if spare > 0 else 0.0
        horizon_s = min(max(2 * self.limits.slo_s, self.sizing.restart_s + drain_s), MAX_FALLBACK_HORIZON_S)
        horizon = np.full(max(1, math.ceil(horizon_s / cfg.plan_step_s)), rate)
        return self._apply_guards(obs, {target}, horizon, why, [target], {}, policy=f"{self.name}/fallback")

    def _outlook(self, obs: Observation) -> np.ndarray | None:
        """The forecast's outlook past the horizon on the plan's grid (step maxima, at the planning quantile)."""
        fc = obs.forecast
        if fc is None or len(fc.outlook) == 0:
            return None
        return resample_max(fc.outlook_level(self.config.forecast_quantile), fc.step_s, self.config.plan_step_s)

    def _apply_guards(
        self, obs, candidates: set[int], rates, why, plan, details, policy, outlook=None, horizon_need=None
    ) -> Decision:
        """Drop candidates the guards forbid, then pick the cheapest by projected cost."""
        cfg = self.config
        current = obs.workers
        plan_t = tuple(int(p) for p in plan)
        held = []
        fewest = self._fewest(obs)
        candidates = {max(c, fewest) for c in candidates} | ({0} if fewest == 0 else set())
        if any(c < current for c in candidates):
            if obs.time_lag_s > self.scale_in_lag_guard:
                held.append(
                    f"no scale-in while lag is {obs.time_lag_s / 60:.1f} min (> {self.scale_in_lag_guard / 60:.0f} min)"
                )
            elif self.last_change_time is not None and obs.time - self.last_change_time < cfg.tau_s:
                held.append(
                    f"no scale-in: last rescale {(obs.time - self.last_change_time) / 60:.0f} min ago, under the "
                    f"{cfg.tau_s / 60:.0f} min hold"
                )
            if held:
                candidates = {c for c in candidates if c >= current}
        target, cost_why = self._choose(obs, rates, candidates, outlook, horizon_need)
        note = "; ".join(held + [cost_why, why])
        if target == current:
            return Decision(current, policy, f"hold at {current}: {note}", plan_t, cfg.plan_step_s, details)
        self.last_change_time = obs.time
        return Decision(target, policy, f"{current} -> {target} workers: {note}", plan_t, cfg.plan_step_s, details)


def build(sizing: Sizing, **options) -> KalePolicy:
    """Kale within the sizing's limits and on its throughput model; ``options`` are ``KaleConfig`` fields."""
    return KalePolicy(sizing, KaleConfig(**options))


SPEC = PolicySpec(
    name="kale",
    description="forecast-driven allocation: estimator, stabilizer, guards and the restart-cost test",
    build=build,
    uses_forecast=True,
    uses_estimates=True,
)
