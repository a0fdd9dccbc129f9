"""What Kale's two planners share: the settings both read, and the stages before a plan.

One decision, in stages that are each small and testable:

1. a restart under way: wait for it, or redirect it to a group sized for a burst (``_during_restart``);
2. at zero workers, hold until more than ``activation_lag`` samples wait;
3. a burst (the latest interval's arrival rate far above both what the workers can consume and what was expected)
   -> plan at once for the burst's rate;
4. no forecast, lag above the fallback threshold, or recent forecast error too large -> plan on the measured rate
   (the fallback);
5. else plan on the forecast.

Stages 3 to 5 are each planner's own (``_decide_reactive``, ``_decide_forecast``): the receding planner
(``receding.py``, the policy ``kale``) and the paper's estimator and stabilizer (``stabilizer.py``, the policy
``kale_stabilizer``).  Both minimise the same objective as the offline optimum: GPU-minutes + ``lag_weight`` x
lag-minutes + ``violation_weight`` x minutes above the SLO.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from kale_dagster.model.limits import Limits
from kale_dagster.model.schedule import Objective
from kale_dagster.model.throughput import ThroughputModel
from kale_dagster.model.types import Decision, Observation
from kale_dagster.policies.registry import Sizing
from kale_dagster.rules import check, setting


@dataclass(frozen=True)
class KaleSettings:
    """The knobs both planners read; each planner's config adds its own.

    Times are in seconds.  ``lag_weight`` prices one lag-minute integrated over one minute in GPU-minutes; when
    every duration is compressed by a speed-up (demo, end-to-end benchmark) multiply it by the speed-up, since
    accumulated lag shrinks with the square of the time scale and GPU-minutes only linearly.  ``None`` for the
    fallback threshold means half the SLO.
    """

    plan_step_s: float = setting(Objective.plan_step_s, gt=0, unit="s", description="the plan's step")
    forecast_quantile: float | None = setting(
        None, gt=0, lt=1, description="the forecast quantile planned for; None: the upper band"
    )
    fallback_lag_s: float | None = setting(None, gt=0, unit="s", description="lag above this falls back to rates")
    max_forecast_error: float = setting(0.5, gt=0, description="recent sMAPE above this falls back to rates")
    # A burst: the latest interval's arrival rate above this multiple of both the running workers' capacity and the
    # expected rate (the forecast's planning level now; without one, the windowed mean).  Acted on at once: the
    # windowed rate and the lag take a rate window or half an SLO to show it, too late to restart in time.
    burst_ratio: float = setting(2.0, gt=1, description="a multiple of capacity and of the expected rate")
    # The burst is sized on its first reading, often its onset: a restart sized for it that meets the burst's top
    # is followed by a second restart, two pauses at the worst time.  Above 1 the burst is planned for this
    # multiple of that reading (off by default: measured in docs/experiments.md, it trades one bursty trace for
    # another).
    burst_scale: float = setting(1.0, ge=1, description="the burst path plans for this multiple of the burst's rate")
    lag_weight: float = setting(Objective.lag_weight, ge=0, description="GPU-minutes one lag-minute costs")
    violation_weight: float = setting(Objective.violation_weight, ge=0, description="GPU-minutes an SLO minute costs")
    sync_period_s: float = setting(60.0, gt=0, unit="s", description="how often the policy is asked")

    def __post_init__(self):
        check(self)

    @property
    def objective(self) -> Objective:
        return Objective(self.plan_step_s, self.lag_weight, self.violation_weight)


def steps_past(obs: Observation) -> int:
    """How many steps of the observation's forecast lie in the past: the index of "now"."""
    fc = obs.forecast
    assert fc is not None  # asked only of observations with a forecast
    return max(int((obs.time - fc.start) // fc.step_s), 0)


def fmt_rate(rate: float) -> str:
    return f"{rate:,.0f}/s"


class KaleBase(ABC):
    """The stages both planners share; a planner fills in ``_decide_forecast`` and ``_decide_reactive``.

    A subclass is a dataclass with ``sizing``, ``config`` (a ``KaleSettings``) and ``name``.
    """

    sizing: Sizing
    config: KaleSettings
    name: str

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
    def fallback_lag(self) -> float:
        return self.config.fallback_lag_s or self.limits.slo_s / 2

    def decide(self, obs: Observation) -> Decision:
        if obs.restarting:
            return self._during_restart(obs)
        if obs.workers == 0 and obs.backlog <= self.limits.activation_lag:
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
        return self._decide_forecast(obs)

    @abstractmethod
    def _decide_forecast(self, obs: Observation) -> Decision:
        """Plan on the forecast (there is one, it has been accurate, and the lag is low)."""

    @abstractmethod
    def _decide_reactive(
        self, obs: Observation, trigger: str, rate: float | None = None, burst: bool = False
    ) -> Decision:
        """Plan on the measured ``rate`` (the windowed arrival rate unless given), for the reason ``trigger``;
        ``burst``: the rate is a burst's, news that a cached plan does not know."""

    # --- the shared stages ----------------------------------------------------

    def _burst(self, obs: Observation, latest: float | None = None) -> str:
        """Why the latest interval's rate (or ``latest``) is a burst to act on now, or "" when it is not."""
        latest = obs.latest_arrival_rate if latest is None else latest
        if latest is None:
            return ""
        capacity = float(self.model.predict(obs.workers))
        expected, of = obs.arrival_rate, "the windowed rate"
        if obs.forecast is not None and len(obs.forecast):
            now = min(steps_past(obs), len(obs.forecast) - 1)
            expected, of = float(obs.forecast.level(self.config.forecast_quantile)[now]), "the forecast"
        bound = self.config.burst_ratio * max(capacity, expected)
        if latest <= bound:
            return ""
        return (
            f"burst: {fmt_rate(latest)} over the last interval, above {self.config.burst_ratio:g}x both the "
            f"{obs.workers} workers' capacity {fmt_rate(capacity)} and {of} {fmt_rate(expected)}"
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

    def _during_restart(self, obs: Observation) -> Decision:
        """Wait for the restart under way, unless a burst comes that its group cannot serve and the launcher can
        still redirect the restart (``Observation.retargetable``): then it is pointed at a group sized for the
        burst now, where waiting would pause the workers twice at the burst's top (the second restart after this
        one; docs/results.md)."""
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

    def _measured_rate(self, obs: Observation, rate: float | None) -> float:
        """The rate the fallback plans on: ``rate`` (the windowed arrival rate unless given), at least the forecast
        for now."""
        rate = obs.arrival_rate if rate is None else rate
        if obs.forecast is not None and len(obs.forecast):
            rate = max(rate, float(obs.forecast.point[0]))
        return rate

    def _fewest(self, obs: Observation) -> int:
        """The fewest workers a plan may run: zero only while running, with min_workers 0, and at most
        activation_lag samples waiting (more would start the workers again at once)."""
        lim = self.limits
        idle = lim.min_workers == 0 and obs.workers > 0 and obs.backlog <= lim.activation_lag
        return 0 if idle else max(lim.min_workers, 1)
