"""Kale: forecast-driven worker allocation with stabilization and a reactive fallback.

One decision, in stages that are each small and testable:

1. fallback check: no forecast, lag above the fallback threshold, or recent
   forecast error too large -> the reactive policy on measured rates acts;
2. estimate: workers per plan step from the forecast (upper band or a
   quantile) plus the backlog's drain rate (``kale_dagster.estimator``);
3. stabilize: the paper's Algorithm 1 (``kale_dagster.stabilizer``);
4. lookahead: a rescale takes ``restart_s`` and should then hold for
   ``tau_s``, so the target covers the plan over that window;
5. guards: no scale-in on a forecast alone while measured lag is high (as
   AWS predictive scaling), no scale-in within ``tau_s`` of the last
   rescale, and the restart-cost test (``kale_dagster.projection``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..backlog import FifoBacklog
from ..errors import KaleConfigError
from ..estimator import estimate_workers, resample_max
from ..policy import Decision, Observation
from ..projection import project
from ..stabilizer import stabilize
from ..throughput import ThroughputModel


@dataclass(frozen=True)
class KaleConfig:
    """Settings of the Kale policy; validated here, once.

    Times are in seconds.  ``None`` for the derived thresholds means: the
    SLO for the drain window (lag is back to zero one SLO after a restart),
    half the SLO for the fallback trigger, a quarter of it for the scale-in
    guard.
    """

    min_workers: int = 1
    max_workers: int = 32
    slo_s: float = 1200.0
    restart_s: float = 600.0
    plan_step_s: float = 600.0
    rho: int = 1
    tau_s: float = 600.0
    forecast_quantile: Optional[float] = None
    drain_window_s: Optional[float] = None
    fallback_lag_s: Optional[float] = None
    max_forecast_error: float = 0.5
    scale_in_lag_guard_s: Optional[float] = None
    scale_in_max_lag_fraction: float = 0.5
    sync_period_s: float = 60.0

    def __post_init__(self):
        def need(ok: bool, name: str, problem: str):
            if not ok:
                raise KaleConfigError(name, problem)

        need(self.min_workers >= 0, "min_workers", f"must be >= 0, got {self.min_workers}")
        need(self.max_workers >= max(self.min_workers, 1), "max_workers", f"must be >= min_workers ({self.min_workers}) and >= 1, got {self.max_workers}")
        for name in ("slo_s", "plan_step_s", "sync_period_s"):
            need(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")
        for name in ("restart_s", "tau_s"):
            need(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")
        need(self.rho >= 1, "rho", f"must be >= 1, got {self.rho}")
        need(self.forecast_quantile is None or 0 < self.forecast_quantile < 1, "forecast_quantile", f"must be in (0, 1) or None for the upper band, got {self.forecast_quantile}")
        for name in ("drain_window_s", "fallback_lag_s", "scale_in_lag_guard_s"):
            value = getattr(self, name)
            need(value is None or value > 0, name, f"must be > 0 or None, got {value}")
        need(self.max_forecast_error > 0, "max_forecast_error", f"must be > 0, got {self.max_forecast_error}")
        need(0 < self.scale_in_max_lag_fraction <= 1, "scale_in_max_lag_fraction", f"must be in (0, 1], got {self.scale_in_max_lag_fraction}")

    @property
    def drain_window(self) -> float:
        return self.drain_window_s or self.slo_s

    @property
    def fallback_lag(self) -> float:
        return self.fallback_lag_s or self.slo_s / 2

    @property
    def scale_in_lag_guard(self) -> float:
        return self.scale_in_lag_guard_s or self.slo_s / 4


def _fmt_rate(rate: float) -> str:
    return f"{rate:,.0f}/s"


@dataclass
class KalePolicy:
    """The Kale policy.  Keeps only the time of its last rescale as state."""

    model: ThroughputModel
    config: KaleConfig = field(default_factory=KaleConfig)
    name: str = "kale"
    last_change_time: Optional[float] = None

    @property
    def sync_period_s(self) -> float:
        return self.config.sync_period_s

    # --- stages -------------------------------------------------------------

    def _fallback_reason(self, obs: Observation) -> str:
        cfg = self.config
        if obs.forecast is None or len(obs.forecast) == 0:
            return "no forecast available"
        if obs.time_lag_s > cfg.fallback_lag:
            return f"lag {obs.time_lag_s / 60:.1f} min above the fallback threshold {cfg.fallback_lag / 60:.0f} min"
        if obs.forecast_error is not None and obs.forecast_error > cfg.max_forecast_error:
            return f"recent forecast error (sMAPE {obs.forecast_error:.2f}) above {cfg.max_forecast_error:.2f}"
        return ""

    def _planned_rates(self, obs: Observation) -> np.ndarray:
        fc = obs.forecast
        assert fc is not None
        # Forecast steps already in the past are dropped so step 0 is "now".
        skip = max(int((obs.time - fc.start) // fc.step_s), 0)
        levels = fc.level(self.config.forecast_quantile)[skip:]
        if len(levels) == 0:
            levels = np.array([obs.arrival_rate])
        return resample_max(levels, fc.step_s, self.config.plan_step_s)

    def _estimate(self, obs: Observation, rates: np.ndarray) -> tuple[list[int], float]:
        cfg = self.config
        common = dict(
            rates=rates,
            step_s=cfg.plan_step_s,
            model=self.model,
            min_workers=cfg.min_workers,
            max_workers=cfg.max_workers,
            backlog=obs.backlog,
            arrival_rate=obs.arrival_rate,
            drain_window_s=cfg.drain_window,
        )
        est = estimate_workers(**common, downtime_s=0.0)
        if est.plan[0] != obs.workers:
            # Changing costs a restart, during which the backlog grows.
            est = estimate_workers(**common, downtime_s=cfg.restart_s)
        return list(est.plan), est.drain_rate

    def _lookahead_target(self, plan: list[int]) -> int:
        cfg = self.config
        steps = max(1, math.ceil((cfg.restart_s + cfg.tau_s) / cfg.plan_step_s))
        return max(plan[:steps])

    def _cost_test(self, obs: Observation, rates: np.ndarray, target: int) -> tuple[bool, str]:
        """Is rescaling from obs.workers to target worth its downtime over the horizon?"""
        cfg = self.config
        start = FifoBacklog.from_observation(obs.time, obs.backlog, obs.time_lag_s)
        keep = project(start, rates, cfg.plan_step_s, self.model.predict(obs.workers), obs.workers, cfg.slo_s)
        change = project(start, rates, cfg.plan_step_s, self.model.predict(target), target, cfg.slo_s, downtime_s=cfg.restart_s)
        if target > obs.workers:
            if change.accumulated_lag_min < keep.accumulated_lag_min:
                return True, f"projected accumulated lag {keep.accumulated_lag_min:.0f} -> {change.accumulated_lag_min:.0f} min over the horizon"
            return False, (
                f"scale-up not worth its {cfg.restart_s / 60:.0f} min restart: projected accumulated lag "
                f"{keep.accumulated_lag_min:.0f} min without it, {change.accumulated_lag_min:.0f} min with it"
            )
        limit = cfg.scale_in_max_lag_fraction * cfg.slo_s
        saved = keep.gpu_minutes - change.gpu_minutes
        restart_cost = obs.workers * cfg.restart_s / 60.0
        if change.max_lag_s > limit:
            return False, f"scale-in would push projected lag to {change.max_lag_s / 60:.1f} min (limit {limit / 60:.0f} min)"
        if saved < restart_cost:
            return False, f"scale-in saves {saved:.0f} GPU-min over the horizon, less than the {restart_cost:.0f} GPU-min its restart costs"
        return True, f"saves {saved:.0f} GPU-min over the horizon, projected max lag {change.max_lag_s / 60:.1f} min"

    # --- decision -----------------------------------------------------------

    def decide(self, obs: Observation) -> Decision:
        cfg = self.config
        current = obs.workers
        if obs.restarting:
            return Decision(current, self.name, "rescale in progress; waiting for it to finish")

        fallback = self._fallback_reason(obs)
        if fallback:
            return self._decide_reactive(obs, fallback)

        rates = self._planned_rates(obs)
        raw_plan, drain = self._estimate(obs, rates)
        plan = stabilize(raw_plan, cfg.plan_step_s / 60, rho=cfg.rho, tau_minutes=cfg.tau_s / 60)
        target = self._lookahead_target(plan)
        peak_i = int(np.argmax(rates))
        why = (
            f"forecast peak {_fmt_rate(rates[peak_i])} in {peak_i * cfg.plan_step_s / 60:.0f} min needs "
            f"{raw_plan[peak_i]} workers"
        )
        if drain > 0:
            why += f"; backlog {obs.backlog:,.0f} drains at +{_fmt_rate(drain)}"
        details = {"raw_plan": raw_plan, "planned_rates": [float(r) for r in rates]}
        return self._apply_guards(obs, target, rates, why, plan, details, policy=self.name)

    def _decide_reactive(self, obs: Observation, trigger: str) -> Decision:
        cfg = self.config
        current = obs.workers
        rate = obs.arrival_rate
        if obs.forecast is not None and len(obs.forecast):
            rate = max(rate, float(obs.forecast.point[0]))
        rates = np.array([rate])
        est = estimate_workers(
            rates, cfg.plan_step_s, self.model, cfg.min_workers, cfg.max_workers,
            backlog=obs.backlog, arrival_rate=obs.arrival_rate,
            downtime_s=cfg.restart_s, drain_window_s=cfg.drain_window,
        )
        target = est.plan[0]
        why = f"fallback ({trigger}): measured {_fmt_rate(rate)}"
        if est.drain_rate > 0:
            why += f" + drain {_fmt_rate(est.drain_rate)} for backlog {obs.backlog:,.0f}"
        horizon = np.full(max(1, math.ceil(2 * cfg.slo_s / cfg.plan_step_s)), rate)
        return self._apply_guards(obs, target, horizon, why, [target], {}, policy=f"{self.name}/fallback")

    def _apply_guards(self, obs, target, rates, why, plan, details, policy) -> Decision:
        cfg = self.config
        current = obs.workers
        plan_t = tuple(int(p) for p in plan)
        if target == current:
            return Decision(current, policy, f"hold at {current}: {why}", plan_t, cfg.plan_step_s, details)
        if target < current:
            if obs.time_lag_s > cfg.scale_in_lag_guard:
                return Decision(current, policy, f"hold at {current}: no scale-in while lag is {obs.time_lag_s / 60:.1f} min (> {cfg.scale_in_lag_guard / 60:.0f} min); {why}", plan_t, cfg.plan_step_s, details)
            if self.last_change_time is not None and obs.time - self.last_change_time < cfg.tau_s:
                return Decision(current, policy, f"hold at {current}: last rescale {(obs.time - self.last_change_time) / 60:.0f} min ago, under the {cfg.tau_s / 60:.0f} min hold; {why}", plan_t, cfg.plan_step_s, details)
        worth, cost_why = self._cost_test(obs, rates, target)
        if not worth:
            return Decision(current, policy, f"hold at {current}: {cost_why}; {why}", plan_t, cfg.plan_step_s, details)
        self.last_change_time = obs.time
        return Decision(target, policy, f"{current} -> {target} workers: {why}; {cost_why}", plan_t, cfg.plan_step_s, details)
