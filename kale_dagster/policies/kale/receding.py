"""Kale's receding planner (the policy ``kale``): the offline optimum's program, solved again from now.

The offline optimum's dynamic program (``kale_dagster.model.schedule``) is solved from now over the forecast (its
point, then its outlook, up to ``plan_horizon_s``, or ``trusted_horizon_s`` while its recent error is small; scaled up
by as much as it fell short of the arrivals of the last two hours, at most ``max_forecast_scale``) with the workers
running, the backlog waiting and its age as the state, the fitted throughput model and the measured restart time.
The first step is applied, and the plan is solved again every ``replan_s`` or when the workers change.  The fallback
plans the same way, on the measured rate held for as long as the backlog is old (a rate that has lasted that long is
expected to last as long again), then the forecast.  Either scales in only if a plan over its rates raised by the
forecast's band (``scale_in_quantile``) scales in too.

With ``min_workers: 0`` (scale to zero, as KEDA users know it) zero workers is one more level while at most
``activation_lag`` samples wait, weighed like any count (its restart back up included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from kale_dagster.errors import KaleConfigError
from kale_dagster.model.schedule import plan_from_now
from kale_dagster.model.types import Decision, Observation
from kale_dagster.policies.kale.base import KaleBase, KaleSettings, steps_past
from kale_dagster.policies.registry import PolicySpec, Sizing
from kale_dagster.rules import check, need, ordered, setting


@dataclass(frozen=True)
class KaleConfig(KaleSettings):
    """The receding planner's knobs, and those both planners share (``KaleSettings``); the pipeline's limits
    (worker bounds, SLO, restart time) come with its ``Sizing``."""

    plan_horizon_s: float = setting(6 * 3600.0, ge=600, le=86_400, unit="s", description="how far the plan reaches")
    # A plan that ends before a level it will need cannot see that a restart into that level is coming anyway: on a
    # rising day a 6-hour plan adds a worker at every re-plan where one restart would do.  Only a forecast that has
    # proven accurate is worth planning on that far; on bursty traffic a long plan on the typical day runs lean.
    trusted_horizon_s: float = setting(
        12 * 3600.0,
        ge=600,
        le=86_400,
        unit="s",
        description="how far the plan reaches while the forecast is accurate (trusted_forecast_error)",
    )
    trusted_forecast_error: float = setting(
        0.1, ge=0, description="recent sMAPE at or below which the forecast is planned on for trusted_horizon_s"
    )
    replan_s: float = setting(600.0, gt=0, unit="s", description="the plan is solved again at least this often")
    plan_tail_s: float = setting(
        0.0,
        ge=0,
        le=86_400,
        unit="s",
        description="past its horizon, the plan's last count is held over this much more of the forecast, so that "
        "a restart that pays back only after the horizon is weighed; 0: the plan ends there",
    )
    plan_quantile: float | None = setting(
        0.5, gt=0, lt=1, description="the forecast quantile planned on (0.5: the point forecast)"
    )
    # A scale-in the arrivals then exceed costs a pause and a slow drain; on bursty traffic the forecast's band is
    # wide and that risk outweighs the few workers saved (measured in docs/results.md).
    scale_in_quantile: float | None = setting(
        0.55,
        gt=0.5,
        lt=1,
        description="a scale-in only if the plan over the forecast raised to this quantile (the band's median ratio "
        "to the point) scales in too; None: as the plan says",
    )
    max_forecast_scale: float = setting(
        2.0,
        ge=1,
        description="the forecast is scaled up by its recent shortfall (the arrivals over the ratio window / what "
        "it predicted for them), at most this much; 1: never",
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


def _minutes_ahead(obs: Observation, quantile: float | None) -> np.ndarray:
    """The observation's forecast at ``quantile`` from now on, then its outlook, one value per minute."""
    fc = obs.forecast
    assert fc is not None  # asked only of observations with a forecast
    series = np.concatenate([fc.level(quantile)[steps_past(obs) :], fc.outlook_level(quantile)])
    return np.repeat(series, max(int(round(fc.step_s / 60)), 1))


class _Plan(NamedTuple):
    """The latest plan, and what it was made at."""

    time: float
    workers: int
    path: str  # the policy label: the forecast's plan or the fallback's
    steps: np.ndarray
    band_judged: bool = False  # its scale-in was judged over the forecast's band (scale_in_quantile) and stands
    held: str = ""  # why it holds the running count where the plan scaled in (the band), said until it is due


@dataclass
class KalePolicy(KaleBase):
    """Kale with the receding planner.  Keeps its latest plan, reused for ``replan_s`` while the workers and the
    path (the forecast's or the fallback's) hold."""

    sizing: Sizing
    config: KaleConfig = field(default_factory=KaleConfig)
    name: str = "kale"
    _latest_plan: _Plan | None = field(default=None, init=False, repr=False)

    def state(self) -> dict:
        return {}

    def load_state(self, state: dict) -> None:
        pass

    def _decide_forecast(self, obs: Observation) -> Decision:
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

    def _decide_reactive(
        self, obs: Observation, trigger: str, rate: float | None = None, burst: bool = False
    ) -> Decision:
        """A rate that has held for as long as the backlog is old is expected to hold as long again, then the
        forecast (or the windowed rate) resumes."""
        cfg = self.config
        rate = self._measured_rate(obs, rate)
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
        ahead = int(horizon_s // 60)
        tail = np.maximum(per_minute[ahead : ahead + int(self.config.plan_tail_s // 60)], 0.0)
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
            self.config.objective,
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


def build(sizing: Sizing, **options) -> KalePolicy:
    """Kale within the sizing's limits and on its throughput model; ``options`` are ``KaleConfig`` fields."""
    if "planner" in options:  # an option of 0.1.0: say where the stabilizer went
        raise KaleConfigError(
            "planner", "Kale's planners are two policies: 'kale' (the receding planner) and 'kale_stabilizer'"
        )
    return KalePolicy(sizing, KaleConfig(**options))


SPEC = PolicySpec(
    name="kale",
    description="forecast-driven allocation: the optimum's program over the forecast, solved again from now",
    build=build,
    uses_forecast=True,
    uses_estimates=True,
)
