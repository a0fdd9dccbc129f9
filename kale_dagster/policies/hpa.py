"""Port of the Kubernetes HPA control loop (horizontal.go).

Stages, as upstream keeps them apart:

1. replica calculation (``hpa_replicas``) from the metric, with the
   tolerances (per direction when ``behavior`` sets them);
2. with ``behavior``: :func:`stabilize_recommendation` (up-window minimum and
   down-window maximum of recent recommendations), then :func:`rate_limit`
   (the scaling policies, Pods / Percent per period, selectPolicy Max / Min /
   Disabled, against recent scale events), then min/max replicas;
3. without ``behavior`` (the legacy path, what an HPA written with no
   ``behavior`` gets): :func:`stabilize_recommendation_legacy` (the
   controller's 5-minute downscale window) and
   :func:`convert_desired_replicas_with_rules` (at most max(2 x current, 4)).

:class:`HPAPolicy` drives those stages each sync period (15 s by default)
on either GPU utilization (a Resource metric with a target utilization,
Kubernetes' default of 80% unless set) or consumer lag (an External metric
with an AverageValue target).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from kale_dagster.model.types import Decision, Observation
from kale_dagster.policies.hpa_behavior import HPABehavior, HPAScalingRules
from kale_dagster.policies.hpa_replicas import (
    DEFAULT_TOLERANCE,
    Pod,
    PodMetric,
    Tolerances,
    external_per_pod_replicas,
    resource_replicas,
)
from kale_dagster.policies.registry import PolicySpec, Sizing
from kale_dagster.rules import check, ordered, setting

#: What a backtest sweeps, as users tune an HPA in front of slow restarts: the target utilization (percent),
#: the scale-down stabilization window (s) and the rate policies (upstream's, or damped ones that allow
#: doubling per 15 minutes and halving per 30).
SWEEP_TARGETS = (50, 60, 70, 80, 90)
SWEEP_SCALE_DOWN_WINDOWS_S = (300, 1800, 3600)
#: horizontal.go's legacy scale-up limit (no ``behavior``): max(scaleUpLimitFactor x current, scaleUpLimitMinimum).
SCALE_UP_LIMIT_FACTOR = 2.0
SCALE_UP_LIMIT_MINIMUM = 4
#: kube-controller-manager's --horizontal-pod-autoscaler-downscale-stabilization default.
DOWNSCALE_STABILIZATION_WINDOW_S = 300.0
SWEEP_RATE_POLICIES = {
    "upstream": {},
    "damped": {
        "scaleUp": {"policies": [{"type": "Percent", "value": 100, "periodSeconds": 900}]},
        "scaleDown": {"policies": [{"type": "Percent", "value": 50, "periodSeconds": 1800}]},
    },
}


class Recommendations:
    """Upstream's recommendations slice: each sync's unstabilized recommendation and when it was made, a slot
    older than every window reused by the next.  Kept as two arrays, as a sync reads up to a window's worth
    (240 for an hour of 15 s syncs)."""

    def __init__(self, rows=()):
        rows = list(rows)  # (recommendation, timestamp) pairs, in slot order
        self.values = np.array([int(r) for r, _ in rows], dtype=np.int64)
        self.times = np.array([float(t) for _, t in rows], dtype=float)

    def __len__(self) -> int:
        return len(self.values)

    def __eq__(self, other) -> bool:
        return isinstance(other, Recommendations) and self.rows() == other.rows()

    def __repr__(self) -> str:
        return f"Recommendations({self.rows()})"

    def rows(self) -> list[list]:
        """[recommendation, timestamp] per slot, as the policy's state stores them."""
        return [[r, t] for r, t in zip(self.values.tolist(), self.times.tolist())]

    def record(self, slot: int | None, desired: int, now: float) -> None:
        """Record the unstabilized recommendation in a reusable slot, or append it (upstream keeps the slice short)."""
        if slot is None:
            self.values, self.times = np.append(self.values, desired), np.append(self.times, now)
        else:
            self.values[slot], self.times[slot] = desired, now

    def last_before(self, cutoff: float) -> int | None:
        """The last slot whose recommendation is older than ``cutoff``: the one to reuse."""
        stale = self.times < cutoff
        return len(stale) - 1 - int(stale[::-1].argmax()) if stale.any() else None


@dataclass
class TimestampedScaleEvent:
    replica_change: int
    timestamp: float
    outdated: bool = False  # older than every policy period; its slot is reused by the next event


def replicas_change_per_period(period_seconds: float, events: list[TimestampedScaleEvent], now: float) -> int:
    """Sum of replica changes within the last ``period_seconds`` (getReplicasChangePerPeriod)."""
    cutoff = now - period_seconds
    return sum(e.replica_change for e in events if e.timestamp > cutoff)


def store_scale_event(
    events: list[TimestampedScaleEvent], rules: HPAScalingRules, replica_change: int, now: float
) -> None:
    """storeScaleEvent for one direction: mark events older than the longest policy period outdated
    (markScaleEventsOutdated), then put the new one in the last outdated slot, or append it."""
    longest = max((p.period_seconds for p in rules.policies), default=0)
    slot = None
    for i, event in enumerate(events):
        if event.timestamp < now - longest:
            event.outdated = True
        if event.outdated:
            slot = i
    new = TimestampedScaleEvent(replica_change, now)
    if slot is None:
        events.append(new)
    else:
        events[slot] = new


def stabilize_recommendation(
    recommendations: Recommendations,
    behavior: HPABehavior,
    current: int,
    desired: int,
    now: float,
) -> int:
    """stabilizeRecommendationWithBehaviors; records ``desired`` in ``recommendations``."""
    up_cutoff = now - behavior.scale_up.stabilization_window_seconds
    down_cutoff = now - behavior.scale_down.stabilization_window_seconds
    values, times = recommendations.values, recommendations.times
    # Upstream's one loop: the lowest within the scale-up window and the highest within the scale-down window,
    # each with ``desired``, and the last slot older than both.
    up_recent, down_recent = values[times > up_cutoff], values[times > down_cutoff]
    up_rec = min(desired, int(up_recent.min())) if len(up_recent) else desired
    down_rec = max(desired, int(down_recent.max())) if len(down_recent) else desired
    slot = recommendations.last_before(min(up_cutoff, down_cutoff))
    result = current
    if result < up_rec:
        result = up_rec
    if result > down_rec:
        result = down_rec
    recommendations.record(slot, desired, now)
    return result


def stabilize_recommendation_legacy(
    recommendations: Recommendations, desired: int, now: float, window_s: float = DOWNSCALE_STABILIZATION_WINDOW_S
) -> int:
    """stabilizeRecommendation (no ``behavior``): the highest recommendation within the downscale window."""
    cutoff = now - window_s
    recent = recommendations.values[recommendations.times >= cutoff]
    highest = max(desired, int(recent.max())) if len(recent) else desired
    recommendations.record(recommendations.last_before(cutoff), desired, now)
    return highest


def convert_desired_replicas_with_rules(
    current: int, desired: int, min_replicas: int, max_replicas: int
) -> tuple[int, str]:
    """convertDesiredReplicasWithRules (no ``behavior``): (replicas, ScalingLimited reason) within min/max,
    and up by at most max(2 x current, 4)."""
    scale_up_limit = int(max(SCALE_UP_LIMIT_FACTOR * current, SCALE_UP_LIMIT_MINIMUM))
    maximum, reason = (
        (scale_up_limit, "ScaleUpLimit") if max_replicas > scale_up_limit else (max_replicas, "TooManyReplicas")
    )
    if desired < min_replicas:
        return min_replicas, "TooFewReplicas"
    if desired > maximum:
        return maximum, reason
    return desired, "DesiredWithinRange"


def _scaling_limit(current: int, up_events, down_events, rules: HPAScalingRules, now: float, up: bool) -> int:
    """calculateScaleUpLimitWithScalingRules / calculateScaleDownLimitWithBehaviors.

    Each policy proposes a limit from the replica count at the start of its
    period; selectPolicy Max picks the largest change (the highest limit up,
    the lowest down), Min the smallest.
    """
    if rules.select_policy == "Disabled":
        return current
    largest_change = rules.select_policy != "Min"
    pick = max if largest_change == up else min
    result: int | None = None
    for policy in rules.policies:
        added = replicas_change_per_period(policy.period_seconds, up_events, now)
        deleted = replicas_change_per_period(policy.period_seconds, down_events, now)
        start = current - added + deleted
        if policy.type == "Pods":
            proposed = start + policy.value if up else start - policy.value
        elif up:
            proposed = math.ceil(start * (1 + policy.value / 100))
        else:
            proposed = int(start * (1 - policy.value / 100))
        result = proposed if result is None else pick(result, proposed)
    return current if result is None else result


def scale_up_limit(current: int, up_events, down_events, rules: HPAScalingRules, now: float) -> int:
    return _scaling_limit(current, up_events, down_events, rules, now, up=True)


def scale_down_limit(current: int, up_events, down_events, rules: HPAScalingRules, now: float) -> int:
    return _scaling_limit(current, up_events, down_events, rules, now, up=False)


def rate_limit(
    current: int,
    desired: int,
    min_replicas: int,
    max_replicas: int,
    behavior: HPABehavior,
    up_events,
    down_events,
    now: float,
) -> tuple[int, str]:
    """convertDesiredReplicasWithBehaviorRate: (replicas, ScalingLimited reason)."""
    if desired > current:
        # A limit below what runs (rules changed after many scale-ups) only stops further scale-up.
        limit = max(scale_up_limit(current, up_events, down_events, behavior.scale_up, now), current)
        maximum, reason = (limit, "ScaleUpLimit") if max_replicas > limit else (max_replicas, "TooManyReplicas")
        if desired > maximum:
            return maximum, reason
    elif desired < current:
        limit = min(scale_down_limit(current, up_events, down_events, behavior.scale_down, now), current)
        minimum, reason = (limit, "ScaleDownLimit") if min_replicas < limit else (min_replicas, "TooFewReplicas")
        if desired < minimum:
            return minimum, reason
    return desired, "DesiredWithinRange"


@functools.lru_cache(maxsize=1 << 16)
def _worker_replicas(
    current: int, target_utilization: int, usage_milli: int, tolerances: Tolerances
) -> tuple[int, int]:
    """GetResourceReplicas for ``current`` workers as pods, each requesting one GPU (1000m) and reporting the same
    ``usage_milli``.  The pods started long ago and are ready, so no initialization period applies and the answer
    depends on these four alone: a sync that meets a count and utilization met before (a backtest syncs 80,000
    times) reuses it."""
    pods = tuple(Pod(f"w{i}", request=1000) for i in range(current))
    sample = PodMetric(usage_milli)
    return resource_replicas(
        current, target_utilization, pods, dict.fromkeys((p.name for p in pods), sample), tolerances
    )


@dataclass
class HPAPolicy:
    """A HorizontalPodAutoscaler on GPU utilization (default) or on consumer lag.

    ``metric="utilization"``: a Resource-style target of ``target_utilization``
    percent of each worker's capacity (one GPU).  ``metric="lag"``: an
    External metric, total consumer lag, with ``target_lag_per_worker`` as
    the AverageValue target.  ``behavior=None`` is an HPA written without
    ``behavior`` (upstream's legacy path); ``tolerance`` is the controller's
    --horizontal-pod-autoscaler-tolerance, which ``behavior`` may override per
    direction.
    """

    min_replicas: int = setting(1, ge=1, description="minReplicas")
    max_replicas: int = setting(32, ge=1, description="maxReplicas")
    metric: Literal["utilization", "lag"] = setting("utilization", choices=("utilization", "lag"))
    target_utilization: int = setting(80, gt=0, unit="%", description="averageUtilization of a worker's capacity")
    target_lag_per_worker: float = setting(100_000.0, gt=0, description="averageValue of the lag metric")
    behavior: HPABehavior | None = None  # or a Mapping, as Kubernetes writes it
    tolerance: float = setting(DEFAULT_TOLERANCE, ge=0, description="--horizontal-pod-autoscaler-tolerance")
    sync_period_s: float = setting(15.0, gt=0, unit="s", description="--horizontal-pod-autoscaler-sync-period")
    name: str = "hpa"
    recommendations: Recommendations = field(default_factory=Recommendations)
    up_events: list = field(default_factory=list)
    down_events: list = field(default_factory=list)

    def __post_init__(self):
        if isinstance(self.behavior, Mapping):  # as Kubernetes writes it (HPABehavior.from_spec)
            self.behavior = HPABehavior.from_spec(self.behavior)
        check(self, lambda: ordered(self, "min_replicas", "max_replicas"))

    @property
    def tolerances(self) -> Tolerances:
        """tolerancesForHpa: the controller's tolerance unless ``behavior`` sets a direction's own."""
        down = up = self.tolerance
        if self.behavior is not None:
            if self.behavior.scale_down.tolerance is not None:
                down = self.behavior.scale_down.tolerance
            if self.behavior.scale_up.tolerance is not None:
                up = self.behavior.scale_up.tolerance
        return Tolerances(down, up)

    def _metric_replicas(self, obs: Observation, lag: float | None) -> tuple[int, str]:
        current = obs.workers
        if self.metric == "lag":
            lag = obs.backlog if lag is None else lag
            desired = external_per_pod_replicas(current, lag, self.target_lag_per_worker, self.tolerances)
            return desired, f"lag {lag:,.0f} vs {self.target_lag_per_worker:,.0f} per worker"
        # Every worker reports the group's utilization (data-parallel workers
        # move in lockstep); usage in milli-GPU against a 1000m request.
        desired, util = _worker_replicas(
            current, self.target_utilization, int(round(obs.utilization * 1000)), self.tolerances
        )
        return desired, f"utilization {util}% vs target {self.target_utilization}%"

    def decide(self, obs: Observation, lag: float | None = None) -> Decision:
        """One sync.  ``lag`` is the External metric's value where another component serves it (KEDA's scaler
        serves its own total lag); by default the observation's backlog."""
        current = obs.workers
        now = obs.time
        if current == 0:
            # Upstream: scaling is disabled while the target has zero replicas.
            return Decision(current, self.name, "scaling disabled at 0 replicas")
        if obs.restarting and self.metric == "utilization":
            # Pods are not ready, so the metrics API has nothing for them and
            # upstream skips the sync ("did not receive metrics").  An External
            # metric (the lag) does not come from the pods: upstream scales on
            # it during a restart too (GetExternalPerPodMetricReplicas reads no
            # pod), and a patch then restarts the forming group at the new size.
            return Decision(current, self.name, "no metrics while pods are not ready")
        if not self.recommendations:
            # recordInitialRecommendation: what runs counts as a recommendation from the first sync on.
            self.recommendations.record(None, current, now)
        if current > self.max_replicas:
            desired, why = self.max_replicas, "above maxReplicas"
        elif current < self.min_replicas:
            desired, why = self.min_replicas, "below minReplicas"
        else:
            metric_desired, why = self._metric_replicas(obs, lag)
            if self.behavior is None:
                stabilized = stabilize_recommendation_legacy(self.recommendations, metric_desired, now)
                desired, limited = convert_desired_replicas_with_rules(
                    current, stabilized, self.min_replicas, self.max_replicas
                )
            else:
                stabilized = stabilize_recommendation(self.recommendations, self.behavior, current, metric_desired, now)
                desired, limited = rate_limit(
                    current,
                    stabilized,
                    self.min_replicas,
                    self.max_replicas,
                    self.behavior,
                    self.up_events,
                    self.down_events,
                    now,
                )
            why += f"; recommendation {metric_desired}, stabilized {stabilized}, {desired} ({limited})"
        if desired != current and self.behavior is not None:
            # Upstream stores scale events only for an HPA with behavior: nothing else reads them.
            up = desired > current
            store_scale_event(
                self.up_events if up else self.down_events,
                self.behavior.scale_up if up else self.behavior.scale_down,
                abs(desired - current),
                now,
            )
        return Decision(desired, self.name, why)

    def state(self) -> dict:
        """The controller's memory, as upstream keeps it per HPA: recommendations and scale events."""
        return {
            "recommendations": self.recommendations.rows(),
            "up_events": [[e.replica_change, e.timestamp, e.outdated] for e in self.up_events],
            "down_events": [[e.replica_change, e.timestamp, e.outdated] for e in self.down_events],
        }

    def load_state(self, state: dict) -> None:
        def events(rows):  # [change, time] rows from before the outdated flag read as not outdated
            return [
                TimestampedScaleEvent(int(row[0]), float(row[1]), bool(row[2]) if len(row) > 2 else False)
                for row in rows
            ]

        self.recommendations = Recommendations(state.get("recommendations", []))
        self.up_events = events(state.get("up_events", []))
        self.down_events = events(state.get("down_events", []))


def build(sizing: Sizing, **options) -> HPAPolicy:
    """An HPA between the sizing's worker bounds; ``options`` are further ``HPAPolicy`` fields
    (``behavior`` may be given as Kubernetes writes it, see ``HPABehavior.from_spec``).  An HPA keeps at least one
    replica (minReplicas 0 needs the alpha HPAScaleToZero gate), so ``min_workers: 0`` means 1 here."""
    return HPAPolicy(min_replicas=max(sizing.limits.min_workers, 1), max_replicas=sizing.limits.max_workers, **options)


def sweep_behavior(scale_down_window_s: float, rate_policies: str) -> dict:
    """An HPA ``behavior`` as a manifest writes it, for one swept setting."""
    rates = SWEEP_RATE_POLICIES[rate_policies]
    behavior = {"scaleDown": {**rates.get("scaleDown", {}), "stabilizationWindowSeconds": scale_down_window_s}}
    if "scaleUp" in rates:
        behavior["scaleUp"] = rates["scaleUp"]
    return behavior


def sweep(sizing: Sizing) -> list[tuple[dict, dict]]:
    return [
        (
            {"target_utilization_pct": t, "scale_down_window_s": w, "rate_policies": r},
            {"target_utilization": t, "behavior": sweep_behavior(w, r)},
        )
        for t in SWEEP_TARGETS
        for w in SWEEP_SCALE_DOWN_WINDOWS_S
        for r in SWEEP_RATE_POLICIES
    ]


SPEC = PolicySpec(
    name="hpa",
    description="Kubernetes HorizontalPodAutoscaler on GPU utilization (upstream port)",
    build=build,
    sweep=sweep,
)
