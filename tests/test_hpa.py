"""HPA port: cases from upstream replica_calculator_test.go and horizontal_test.go."""

from __future__ import annotations

import pytest

from kale_dagster import HPABehavior, HPAPolicy, HPAScalingPolicy, HPAScalingRules, Observation
from kale_dagster.policies.hpa import (
    TimestampedRecommendation,
    TimestampedScaleEvent,
    rate_limit,
    replicas_change_per_period,
    stabilize_recommendation,
)
from kale_dagster.policies.hpa_replicas import (
    Pod,
    ReplicaCalculationError,
    external_per_pod_replicas,
    external_replicas,
    resource_replicas,
)


def _pods(requests, ready=None, phase=None, deleting=None):
    n = len(requests)
    ready = ready or [True] * n
    phase = phase or ["Running"] * n
    deleting = deleting or [False] * n
    return [Pod(f"p{i}", requests[i], ready[i], phase[i], deleting[i]) for i in range(n)]


# (name, current, expected, requests (milli), levels (milli, in pod order), target %, readiness, phase, deleting, expected utilization)
RESOURCE_CASES = [
    ("ScaleUp", 3, 5, [1000] * 3, [300, 500, 700], 30, None, None, None, 50),
    ("ScaleUpUnreadyLessScale", 3, 4, [1000] * 3, [300, 500, 700], 30, [False, True, True], None, None, 60),
    ("ScaleUpUnreadyNoScale", 3, 3, [1000] * 3, [400, 500, 700], 30, [True, False, False], None, None, 40),
    ("ScaleDown", 5, 3, [1000] * 5, [100, 300, 500, 250, 250], 50, None, None, None, 28),
    ("ScaleDownIncludeUnreadyPods", 5, 2, [1000] * 5, [100, 300, 500, 250, 250], 50, [True, True, True, False, False], None, None, 30),
    ("ScaleDownIgnoresFailedPods", 5, 3, [1000] * 7, [100, 300, 500, 250, 250], 50, [True] * 5 + [False] * 2, ["Running"] * 5 + ["Failed"] * 2, None, 28),
    ("ScaleDownIgnoresDeletionPods", 5, 3, [1000] * 7, [100, 300, 500, 250, 250], 50, [True] * 5 + [False] * 2, None, [False] * 5 + [True] * 2, 28),
    ("Tolerance", 3, 3, [900, 1000, 1100], [1010, 1030, 1020], 100, None, None, None, 102),
    ("SuperfluousMetrics", 4, 24, [1000] * 4, [4000, 9500, 3000, 7000, 3200, 2000], 100, None, None, None, 587),
    ("MissingMetrics", 4, 3, [1000] * 4, [400, 95], 100, None, None, None, 24),
    ("MissingMetricsNoChangeEq", 2, 2, [1000] * 2, [1000], 100, None, None, None, 100),
    ("MissingMetricsNoChangeGt", 2, 2, [1000] * 2, [1900], 100, None, None, None, 190),
    ("MissingMetricsNoChangeLt", 2, 2, [1000] * 2, [600], 100, None, None, None, 60),
    ("MissingMetricsUnreadyChange", 3, 3, [1000] * 3, [100, 450], 50, [False, True, True], None, None, 45),
    ("MissingMetricsUnreadyScaleUp", 3, 4, [1000] * 3, [100, 2000], 50, [False, True, True], None, None, 200),
    ("MissingMetricsUnreadyScaleDown", 4, 3, [1000] * 4, [100, 100, 100], 50, [False, True, True, True], None, None, 10),
    ("DuringRollingUpdateWithMaxSurge", 2, 2, [1000] * 3, [100, 100], 50, None, None, None, 10),
]


@pytest.mark.parametrize("case", RESOURCE_CASES, ids=[c[0] for c in RESOURCE_CASES])
def test_resource_replicas(case):
    _, current, expected, requests, levels, target, ready, phase, deleting, utilization = case
    pods = _pods(requests, ready, phase, deleting)
    # Levels belong to pods in order; extra levels are metrics for pods that do not exist.
    metrics = {(pods[i].name if i < len(pods) else f"ghost{i}"): v for i, v in enumerate(levels)}
    assert resource_replicas(current, target, pods, metrics) == (expected, utilization)


def test_resource_errors():
    with pytest.raises(ReplicaCalculationError, match="no metrics"):
        resource_replicas(4, 100, _pods([1000] * 3), {})
    with pytest.raises(ReplicaCalculationError, match="missing request"):
        resource_replicas(1, 100, _pods([None]), {"p0": 200})


@pytest.mark.parametrize(
    "current, total, target, expected",
    [
        (3, 8600, 2900, 3),  # TolerancePerPodCMExternal: 8600 / (2900*3) = 0.989
        (1, 8600, 2900, 3),
        (4, 100, 10, 10),  # KEDA: ceil(lag / lagThreshold)
        (0, 25, 10, 3),
    ],
)
def test_external_per_pod(current, total, target, expected):
    assert external_per_pod_replicas(current, total, target) == expected


def test_external_value_tolerance():
    assert external_replicas(3, 3, 8600, 8888) == 3  # ToleranceCMExternal


def test_default_behavior_10_to_50_gives_20():
    beh = HPABehavior.default()
    assert rate_limit(10, 50, 1, 100, beh, [], [], now=1000) == 20
    # Small deployments grow by 4 pods per period (Max of Pods 4 and Percent 100).
    assert rate_limit(1, 50, 1, 100, beh, [], [], now=1000) == 5


def test_down_stabilization_window():
    beh = HPABehavior(HPABehavior.default().scale_up, HPAScalingRules(180, (HPAScalingPolicy("Percent", 100, 15),)))
    recs = [TimestampedRecommendation(4, 1000 - 120), TimestampedRecommendation(5, 1000 - 60)]
    assert stabilize_recommendation(recs, beh, current=100, desired=3, now=1000) == 5
    assert any(r.recommendation == 3 and r.timestamp == 1000 for r in recs)


@pytest.mark.parametrize(
    "name, desired, current, recs, expected",
    [
        ("Scale up stabilized", 10, 5, [(8, -120), (7, -240)], 7),
        ("Scale down stabilized", 3, 8, [(5, -300), (4, -480)], 5),
        ("No change needed", 5, 5, [(5, -60)], 5),
    ],
)
def test_stabilize_recommendation_table(name, desired, current, recs, expected):
    beh = HPABehavior(HPAScalingRules(300, ()), HPAScalingRules(600, ()))
    stored = [TimestampedRecommendation(r, 1000 + dt) for r, dt in recs]
    assert stabilize_recommendation(stored, beh, current, desired, now=1000) == expected
    assert len(stored) == len(recs) + 1


@pytest.mark.parametrize(
    "current, desired, up, down, expected",
    [
        (5, 15, HPAScalingPolicy("Percent", 200, 60), HPAScalingPolicy("Percent", 100, 60), 10),  # max replicas 10
        (8, 2, HPAScalingPolicy("Percent", 200, 60), HPAScalingPolicy("Percent", 50, 60), 4),
        (5, 8, HPAScalingPolicy("Percent", 200, 60), HPAScalingPolicy("Percent", 100, 60), 8),
        (5, 3, HPAScalingPolicy("Percent", 200, 60), HPAScalingPolicy("Percent", 100, 60), 3),
        (8, 12, HPAScalingPolicy("Percent", 200, 60), HPAScalingPolicy("Percent", 100, 60), 10),
    ],
)
def test_rate_limit_table(current, desired, up, down, expected):
    beh = HPABehavior(HPAScalingRules(0, (up,)), HPAScalingRules(0, (down,)))
    assert rate_limit(current, desired, 1, 10, beh, [], [], now=0) == expected


def test_replicas_change_per_period():
    now = 1000
    events = [TimestampedScaleEvent(3, now - 30), TimestampedScaleEvent(2, now - 45), TimestampedScaleEvent(1, now - 70)]
    assert replicas_change_per_period(60, [], now) == 0
    assert replicas_change_per_period(60, events[:1], now) == 3
    assert replicas_change_per_period(60, events, now) == 5


def test_recent_scale_up_events_limit_the_next_one():
    beh = HPABehavior(HPAScalingRules(0, (HPAScalingPolicy("Pods", 2, 60),)), HPABehavior.default().scale_down)
    # 2 pods were added 30 s ago: the period allows no more.
    assert rate_limit(7, 12, 1, 20, beh, [TimestampedScaleEvent(2, 970)], [], now=1000) == 7
    assert rate_limit(7, 12, 1, 20, beh, [TimestampedScaleEvent(2, 900)], [], now=1000) == 9


def _obs(t, workers, utilization=0.5, backlog=0.0, restarting=False):
    return Observation(time=t, workers=workers, arrival_rate=0, consumption_rate=0, backlog=backlog, time_lag_s=0, utilization=utilization, restarting=restarting)


def test_policy_scales_up_on_utilization_and_waits_five_minutes_to_scale_down():
    hpa = HPAPolicy(min_replicas=1, max_replicas=32, target_utilization=80)
    assert hpa.decide(_obs(0, 4, utilization=1.0)).workers == 5  # ceil(4 * 100/80)
    # Load drops: the 300 s down window keeps the earlier, higher recommendation.
    assert hpa.decide(_obs(15, 5, utilization=0.2)).workers == 5
    assert hpa.decide(_obs(299, 5, utilization=0.2)).workers == 5
    # The t=0 recommendation leaves the window (strictly after the cutoff, as upstream).
    assert hpa.decide(_obs(300, 5, utilization=0.2)).workers == 2  # ceil(5 * 20/80)


def test_policy_on_lag_and_no_metrics_while_restarting():
    hpa = HPAPolicy(metric="lag", target_lag_per_worker=1000, max_replicas=10)
    assert hpa.decide(_obs(0, 2, backlog=5500)).workers == 6
    assert hpa.decide(_obs(15, 6, backlog=50_000, restarting=True)).workers == 6
