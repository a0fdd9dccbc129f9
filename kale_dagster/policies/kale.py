"""Kale: forecast-driven worker allocation with stabilization and a reactive fallback.

One decision, in stages that are each small and testable:

1. fallback check: no forecast, lag above the fallback threshold, or recent
   forecast error too large -> the reactive policy on measured rates acts;
2. estimate: workers per plan step from the forecast (upper band or a
   quantile) plus the backlog's drain rate (``kale_dagster.model.estimator``);
3. stabilize: our variant of the paper's Algorithm 1, or the paper's own with
   ``stabilizer="paper"`` (``kale_dagster.model.stabilizer`` names the
   differences); the levels of the stabilized plan are the candidate targets;
4. guards: no scale-in on a forecast alone while measured lag is high (as
   AWS predictive scaling) and none within ``tau_s`` of the last rescale;
5. restart-cost test: every remaining candidate, and keeping the current
   level, is played over the horizon through the FIFO backlog model with
   the restart's downtime (``kale_dagster.model.projection``); the cheapest in
   GPU-minutes + ``lag_weight`` x lag-minutes + ``violation_weight`` x
   minutes above the SLO wins.  A rescale is thus made only when what it
   buys over the horizon exceeds what its downtime costs.  This test, the
   backlog's drain rate in stage 2 and the guards of stage 4 are our
   additions to the paper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from kale_dagster.errors import KaleConfigError
from kale_dagster.model.backlog import FifoBacklog
from kale_dagster.model.estimator import estimate_workers, resample_max
from kale_dagster.model.projection import project
from kale_dagster.model.stabilizer import MODES, Mode, stabilize
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.model.types import Decision, Observation
from kale_dagster.policies.registry import PolicySpec, Sizing


@dataclass(frozen=True)
class KaleConfig:
    """Settings of the Kale policy; validated here, once.

    Times are in seconds.  ``lag_weight`` prices one lag-minute integrated
    over one minute in GPU-minutes; when every duration is compressed by a
    speed-up (demo, end-to-end benchmark) multiply it by the speed-up, since
    accumulated lag shrinks with the square of the time scale and GPU-minutes
    only linearly.  ``None`` for the derived thresholds means: the
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
    lag_weight: float = 8.0
    violation_weight: float = 100.0
    projection_tick_s: float = 300.0
    sync_period_s: float = 60.0
    stabilizer: Mode = "kale"  # "paper": Algorithm 1 exactly as published

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
        for name in ("lag_weight", "violation_weight"):
            need(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")
        need(self.projection_tick_s > 0, "projection_tick_s", f"must be > 0, got {self.projection_tick_s}")
        need(self.stabilizer in MODES, "stabilizer", f"must be 'kale' or 'paper', got {self.stabilizer!r}")

    @property
    def drain_window(self) -> float:
        return self.drain_window_s or self.slo_s

    @property
    def fallback_lag(self) -> float:
        return self.fallback_lag_s or self.slo_s / 2

    @property
    def scale_in_lag_guard(self) -> float:
        return self.scale_in_lag_guard_s or self.slo_s / 4


#: The longest horizon the fallback projects a rescale over (a backlog that takes longer to clear is cleared anyway).
MAX_FALLBACK_HORIZON_S = 6 * 3600.0


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

    def state(self) -> dict:
        return {"last_change_time": self.last_change_time}

    def load_state(self, state: dict) -> None:
        self.last_change_time = state.get("last_change_time")

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

    def _project(self, obs: Observation, rates: np.ndarray, workers: int):
        cfg = self.config
        start = FifoBacklog.from_observation(obs.time, obs.backlog, obs.time_lag_s)
        downtime = 0.0 if workers == obs.workers else cfg.restart_s
        return project(start, rates, cfg.plan_step_s, self.model.predict(workers), workers, cfg.slo_s, downtime_s=downtime, tick_s=cfg.projection_tick_s)

    def _cost(self, p) -> float:
        cfg = self.config
        return p.gpu_minutes + cfg.lag_weight * p.accumulated_lag_min + cfg.violation_weight * p.violation_min

    def _choose(self, obs: Observation, rates: np.ndarray, candidates: set[int]) -> tuple[int, str]:
        """The candidate level with the lowest projected horizon cost (GPU-min + weighted lag)."""
        current = obs.workers
        projections = {w: self._project(obs, rates, w) for w in sorted(candidates | {current})}
        best = min(projections, key=lambda w: (self._cost(projections[w]), w != current, w))
        keep, chosen = projections[current], projections[best]
        if best == current:
            return current, f"keeping {current} costs least over the horizon (lag {keep.accumulated_lag_min:.0f} lag-min, max {keep.max_lag_s / 60:.1f} min)"
        return best, (
            f"{best} workers cost least over the horizon including a {self.config.restart_s / 60:.1f} min restart: "
            f"{chosen.gpu_minutes:.0f} GPU-min and {chosen.accumulated_lag_min:.0f} lag-min (max {chosen.max_lag_s / 60:.1f} min) "
            f"vs {keep.gpu_minutes:.0f} GPU-min and {keep.accumulated_lag_min:.0f} lag-min at {current}"
        )

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
        plan = stabilize(raw_plan, cfg.plan_step_s / 60, rho=cfg.rho, tau_minutes=cfg.tau_s / 60, mode=cfg.stabilizer)
        peak_i = int(np.argmax(rates))
        why = (
            f"forecast peak {_fmt_rate(rates[peak_i])} in {peak_i * cfg.plan_step_s / 60:.0f} min needs "
            f"{raw_plan[peak_i]} workers"
        )
        if drain > 0:
            why += f"; backlog {obs.backlog:,.0f} drains at +{_fmt_rate(drain)}"
        details = {"raw_plan": raw_plan, "planned_rates": [float(r) for r in rates]}
        return self._apply_guards(obs, set(plan), rates, why, plan, details, policy=self.name)

    def _decide_reactive(self, obs: Observation, trigger: str) -> Decision:
        cfg = self.config
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
        # Judge the restart over long enough for the target to clear the backlog: with a deep backlog,
        # twice the SLO can end before a restart pays back, while keeping an allocation that cannot
        # keep up only grows the lag beyond it.
        spare = float(self.model.predict(target)) - rate
        drain_s = obs.backlog / spare if spare > 0 else 0.0
        horizon_s = min(max(2 * cfg.slo_s, cfg.restart_s + drain_s), MAX_FALLBACK_HORIZON_S)
        horizon = np.full(max(1, math.ceil(horizon_s / cfg.plan_step_s)), rate)
        return self._apply_guards(obs, {target}, horizon, why, [target], {}, policy=f"{self.name}/fallback")

    def _apply_guards(self, obs, candidates: set[int], rates, why, plan, details, policy) -> Decision:
        """Drop candidates the guards forbid, then pick the cheapest by projected cost."""
        cfg = self.config
        current = obs.workers
        plan_t = tuple(int(p) for p in plan)
        held = []
        if any(c < current for c in candidates):
            if obs.time_lag_s > cfg.scale_in_lag_guard:
                held.append(f"no scale-in while lag is {obs.time_lag_s / 60:.1f} min (> {cfg.scale_in_lag_guard / 60:.0f} min)")
            elif self.last_change_time is not None and obs.time - self.last_change_time < cfg.tau_s:
                held.append(f"no scale-in: last rescale {(obs.time - self.last_change_time) / 60:.0f} min ago, under the {cfg.tau_s / 60:.0f} min hold")
            if held:
                candidates = {c for c in candidates if c >= current}
        target, cost_why = self._choose(obs, rates, candidates)
        note = "; ".join(held + [cost_why, why])
        if target == current:
            return Decision(current, policy, f"hold at {current}: {note}", plan_t, cfg.plan_step_s, details)
        self.last_change_time = obs.time
        return Decision(target, policy, f"{current} -> {target} workers: {note}", plan_t, cfg.plan_step_s, details)


def build(sizing: Sizing, **options) -> KalePolicy:
    """Kale on the sizing's throughput model; ``options`` are further ``KaleConfig`` fields."""
    config = KaleConfig(min_workers=sizing.min_workers, max_workers=sizing.max_workers, slo_s=sizing.slo_s, restart_s=sizing.restart_s, **options)
    return KalePolicy(sizing.model, config)


SPEC = PolicySpec(
    name="kale",
    description="forecast-driven allocation: estimator, stabilizer, guards and the restart-cost test",
    build=build,
    uses_forecast=True,
    uses_estimates=True,
)
