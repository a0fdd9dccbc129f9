"""Kale's stabilizer planner (the policy ``kale_stabilizer``): the paper's pipeline, then a restart-cost test.

Workers per plan step from the forecast (upper band or a quantile) plus the backlog's drain rate
(``kale_dagster.model.estimator``) and again from the point forecast; our variant of the paper's Algorithm 1, or the
paper's own with ``stabilizer="paper"`` (``kale_dagster.model.stabilizer``); guards (no scale-in on a forecast alone
while measured lag is high, as AWS predictive scaling, and none within ``tau_s`` of the last rescale); then a
restart-cost test (``choice.choose``): every candidate level, and keeping the current one, is played over the
horizon's expected traffic through the FIFO backlog model with the restart's downtime, and the cheapest wins.  The
fallback sizes for the measured rate plus the backlog's drain, and judges the restart the same way.

With ``min_workers: 0`` zero workers is one more candidate while at most ``activation_lag`` samples wait, judged as
holding zero over the horizon with one restart back up charged.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from kale_dagster.model.estimator import estimate_workers, resample_max
from kale_dagster.model.stabilizer import MODES, Mode, stabilize
from kale_dagster.model.types import Decision, Observation
from kale_dagster.policies.kale.base import KaleBase, KaleSettings, fmt_rate, steps_past
from kale_dagster.policies.kale.choice import Choice
from kale_dagster.policies.registry import PolicySpec, Sizing
from kale_dagster.rules import setting

#: The longest horizon the fallback projects a rescale over (a backlog that takes longer to clear is cleared anyway).
MAX_FALLBACK_HORIZON_S = 6 * 3600.0


@dataclass(frozen=True)
class KaleStabilizerConfig(KaleSettings):
    """The stabilizer planner's knobs, and those both planners share (``KaleSettings``).  ``None`` for the derived
    thresholds means: the SLO for the drain window (lag is back to zero one SLO after a restart), a quarter of it
    for the scale-in guard."""

    rho: int = setting(1, ge=1, description="the stabilizer's smallest change, in workers")
    tau_s: float = setting(600.0, ge=0, unit="s", description="the shortest time between two rescales")
    drain_window_s: float | None = setting(None, gt=0, unit="s", description="a backlog is drained within this")
    scale_in_lag_guard_s: float | None = setting(None, gt=0, unit="s", description="no scale-in above this lag")
    projection_tick_s: float = setting(300.0, gt=0, unit="s", description="the backlog projection's step")
    stabilizer: Mode = setting("kale", choices=MODES, description='"paper": Algorithm 1 exactly as published')
    # Judge a scale-in over as long as the forecast's outlook says the lower level lasts (see choice.Choice).
    # Measured (docs/experiments.md): far cheaper on bursty, mostly idle traffic, a little dearer on daily traffic.
    outlook_scale_in: bool = setting(False, description="judge a scale-in over the forecast's outlook")


@dataclass
class KaleStabilizerPolicy(KaleBase):
    """Kale with the estimator and stabilizer.  Keeps only the time of its last rescale as state."""

    sizing: Sizing
    config: KaleStabilizerConfig = field(default_factory=KaleStabilizerConfig)
    name: str = "kale_stabilizer"
    last_change_time: float | None = None

    @property
    def drain_window(self) -> float:
        return self.config.drain_window_s or self.limits.slo_s

    @property
    def scale_in_lag_guard(self) -> float:
        return self.config.scale_in_lag_guard_s or self.limits.slo_s / 4

    def state(self) -> dict:
        return {"last_change_time": self.last_change_time}

    def load_state(self, state: dict) -> None:
        self.last_change_time = state.get("last_change_time")

    def _decide_forecast(self, obs: Observation) -> Decision:
        # Two readings of the forecast: the planning level (the upper band, or forecast_quantile) sizes for what may
        # come, the point forecast for what is expected.  Both plans' levels are candidates; the restart-cost test
        # prices each on the expected traffic, since the upper band of bursty traffic is mostly bursts that a
        # held level pays for every minute, while a real burst is met by the burst trigger and the fallback.
        cfg = self.config
        rates = self._planned_rates(obs, cfg.forecast_quantile)
        expected = self._planned_rates(obs, 0.5)
        raw_plan, drain = self._estimate(obs, rates)
        expected_plan, _ = self._estimate(obs, expected)
        stable = functools.partial(stabilize, step_minutes=cfg.plan_step_s / 60, rho=cfg.rho, mode=cfg.stabilizer)
        plan, plan_expected = (
            stable(raw_plan, tau_minutes=cfg.tau_s / 60),
            stable(expected_plan, tau_minutes=cfg.tau_s / 60),
        )
        peak_i = int(np.argmax(rates))
        why = (
            f"forecast peak {fmt_rate(rates[peak_i])} in {peak_i * cfg.plan_step_s / 60:.0f} min needs "
            f"{raw_plan[peak_i]} workers (expected {fmt_rate(float(np.max(expected)))}, {max(expected_plan)} workers)"
        )
        if drain > 0:
            why += f"; backlog {obs.backlog:,.0f} drains at +{fmt_rate(drain)}"
        details = {
            "raw_plan": raw_plan,
            "planned_rates": [float(r) for r in rates],
            "expected_plan": expected_plan,
            "expected_rates": [float(r) for r in expected],
        }
        choice = Choice(set(plan) | set(plan_expected), expected, self._outlook(obs), max(expected_plan))
        return self._apply_guards(obs, choice, why, plan, details, policy=self.name)

    def _decide_reactive(
        self, obs: Observation, trigger: str, rate: float | None = None, burst: bool = False
    ) -> Decision:
        """Size for the measured rate plus the backlog's drain, judged over long enough for it to clear the
        backlog."""
        cfg = self.config
        rate = self._measured_rate(obs, rate)
        est = estimate_workers(
            np.array([rate]),
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
        why = f"fallback ({trigger}): measured {fmt_rate(rate)}"
        if est.drain_rate > 0:
            why += f" + drain {fmt_rate(est.drain_rate)} for backlog {obs.backlog:,.0f}"
        # Judge the restart over long enough for the target to clear the backlog: with a deep backlog,
        # twice the SLO can end before a restart pays back, while keeping an allocation that cannot
        # keep up only grows the lag beyond it.
        spare = float(self.model.predict(target)) - rate
        drain_s = obs.backlog / spare if spare > 0 else 0.0
        horizon_s = min(max(2 * self.limits.slo_s, self.sizing.restart_s + drain_s), MAX_FALLBACK_HORIZON_S)
        horizon = np.full(max(1, math.ceil(horizon_s / cfg.plan_step_s)), rate)
        return self._apply_guards(obs, Choice({target}, horizon), why, [target], {}, policy=f"{self.name}/fallback")

    def _planned_rates(self, obs: Observation, quantile: float | None) -> np.ndarray:
        """The forecast at ``quantile`` (None: the upper band; 0.5: the point forecast) from now on, each plan step's
        peak."""
        fc = obs.forecast
        assert fc is not None
        # Forecast steps already in the past are dropped so step 0 is "now".
        levels = fc.level(quantile)[steps_past(obs) :]
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

    def _outlook(self, obs: Observation) -> np.ndarray | None:
        """With ``outlook_scale_in``, the forecast's outlook past the horizon on the plan's grid (step maxima, at the
        planning quantile)."""
        fc = obs.forecast
        if not self.config.outlook_scale_in or fc is None or len(fc.outlook) == 0:
            return None
        return resample_max(fc.outlook_level(self.config.forecast_quantile), fc.step_s, self.config.plan_step_s)

    def _apply_guards(self, obs: Observation, choice: Choice, why: str, plan, details: dict, policy: str) -> Decision:
        """Drop candidates the guards forbid, then pick the cheapest by projected cost."""
        cfg = self.config
        current = obs.workers
        plan_t = tuple(int(p) for p in plan)
        held = []
        fewest = self._fewest(obs)
        candidates = {max(c, fewest) for c in choice.candidates} | ({0} if fewest == 0 else set())
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
        target, cost_why = choice._replace(candidates=candidates).choose(
            obs, self.sizing, cfg.objective, cfg.projection_tick_s
        )
        note = "; ".join(held + [cost_why, why])
        if target == current:
            return Decision(current, policy, f"hold at {current}: {note}", plan_t, cfg.plan_step_s, details)
        self.last_change_time = obs.time
        return Decision(target, policy, f"{current} -> {target} workers: {note}", plan_t, cfg.plan_step_s, details)


def build(sizing: Sizing, **options) -> KaleStabilizerPolicy:
    """Kale's stabilizer planner within the sizing's limits; ``options`` are ``KaleStabilizerConfig`` fields."""
    return KaleStabilizerPolicy(sizing, KaleStabilizerConfig(**options))


SPEC = PolicySpec(
    name="kale_stabilizer",
    description="Kale as the paper plans: estimator, stabilizer, guards and the restart-cost test",
    build=build,
    uses_forecast=True,
    uses_estimates=True,
    variant_of="kale",
)
