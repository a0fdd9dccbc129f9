"""HPA port, checked against upstream's own tests.

Each table row is named after its upstream test and case (kubernetes/kubernetes
pkg/controller/podautoscaler: replica_calculator_test.go, horizontal_test.go);
rows that are not upstream's say so with an ``ours:`` prefix.  Upstream's clock
is ``time.Now()``; here it is ``NOW`` and every offset is kept.
"""

from __future__ import annotations

import pytest

from kale_dagster import HPABehavior, HPAPolicy, HPAScalingPolicy, HPAScalingRules, KaleConfigError, Observation
from kale_dagster.policies.hpa import (
    Recommendations,
    TimestampedScaleEvent,
    convert_desired_replicas_with_rules,
    rate_limit,
    replicas_change_per_period,
    stabilize_recommendation,
    stabilize_recommendation_legacy,
    store_scale_event,
)
from kale_dagster.policies.hpa_replicas import (
    Pod,
    PodMetric,
    ReplicaCalculationError,
    Tolerances,
    external_per_pod_replicas,
    external_replicas,
    group_pods,
    resource_replicas,
)

NOW = 10_000.0
MINUTE = 60.0


def _pods(requests, ready=None, phase=None, deleting=None, start=None):
    n = len(requests)
    ready = ready or [True] * n
    phase = phase or ["Running"] * n
    deleting = deleting or [False] * n
    start = start or [NOW - 1e6] * n
    return [Pod(f"p{i}", requests[i], ready[i], phase[i], deleting[i], start[i], start[i]) for i in range(n)]


HOT = NOW - 1 * MINUTE  # replica_calculator_test.go's hotCPUCreationTime: still initializing
# (name, current, expected, requests (milli), levels (milli, in pod order), target %, readiness, phase, deleting, start
# times, expected utilization)
RESOURCE_CASES = [
    ("TestReplicaCalcScaleUp", 3, 5, [1000] * 3, [300, 500, 700], 30, None, None, None, None, 50),
    (
        "TestReplicaCalcScaleUpUnreadyLessScale",
        3,
        4,
        [1000] * 3,
        [300, 500, 700],
        30,
        [False, True, True],
        None,
        None,
        None,
        60,
    ),
    (
        "TestReplicaCalcScaleUpUnreadyNoScale",
        3,
        3,
        [1000] * 3,
        [400, 500, 700],
        30,
        [True, False, False],
        None,
        None,
        None,
        40,
    ),
    ("TestReplicaCalcScaleDown", 5, 3, [1000] * 5, [100, 300, 500, 250, 250], 50, None, None, None, None, 28),
    (
        "TestReplicaCalcScaleDownIgnoresUnreadyPods",
        5,
        2,
        [1000] * 5,
        [100, 300, 500, 250, 250],
        50,
        [True, True, True, False, False],
        None,
        None,
        None,
        30,
    ),
    (
        "TestReplicaCalcScaleDownIgnoreHotCpuPods",
        5,
        2,
        [1000] * 5,
        [100, 300, 500, 250, 250],
        50,
        None,
        None,
        None,
        [NOW - 1e6] * 3 + [HOT] * 2,
        30,
    ),
    (
        "TestReplicaCalcScaleDownIgnoresFailedPods",
        5,
        3,
        [1000] * 7,
        [100, 300, 500, 250, 250],
        50,
        [True] * 5 + [False] * 2,
        ["Running"] * 5 + ["Failed"] * 2,
        None,
        None,
        28,
    ),
    # Upstream's 2026 change made every terminal pod ignored: the Failed row above, with Succeeded pods.
    (
        "ours: ScaleDownIgnoresSucceededPods",
        5,
        3,
        [1000] * 7,
        [100, 300, 500, 250, 250],
        50,
        [True] * 5 + [False] * 2,
        ["Running"] * 5 + ["Succeeded"] * 2,
        None,
        None,
        28,
    ),
    (
        "TestReplicaCalcScaleDownIgnoresDeletionPods",
        5,
        3,
        [1000] * 7,
        [100, 300, 500, 250, 250],
        50,
        [True] * 5 + [False] * 2,
        None,
        [False] * 5 + [True] * 2,
        None,
        28,
    ),
    ("TestReplicaCalcTolerance", 3, 3, [900, 1000, 1100], [1010, 1030, 1020], 100, None, None, None, None, 102),
    (
        "TestReplicaCalcSuperfluousMetrics",
        4,
        24,
        [1000] * 4,
        [4000, 9500, 3000, 7000, 3200, 2000],
        100,
        None,
        None,
        None,
        None,
        587,
    ),
    ("TestReplicaCalcMissingMetrics", 4, 3, [1000] * 4, [400, 95], 100, None, None, None, None, 24),
    ("TestReplicaCalcMissingMetricsNoChangeEq", 2, 2, [1000] * 2, [1000], 100, None, None, None, None, 100),
    ("TestReplicaCalcMissingMetricsNoChangeGt", 2, 2, [1000] * 2, [1900], 100, None, None, None, None, 190),
    ("TestReplicaCalcMissingMetricsNoChangeLt", 2, 2, [1000] * 2, [600], 100, None, None, None, None, 60),
    (
        "TestReplicaCalcMissingMetricsUnreadyChange",
        3,
        3,
        [1000] * 3,
        [100, 450],
        50,
        [False, True, True],
        None,
        None,
        None,
        45,
    ),
    (
        "TestReplicaCalcMissingMetricsUnreadyScaleUp",
        3,
        4,
        [1000] * 3,
        [100, 2000],
        50,
        [False, True, True],
        None,
        None,
        None,
        200,
    ),
    (
        "TestReplicaCalcMissingMetricsUnreadyScaleDown",
        4,
        3,
        [1000] * 4,
        [100, 100, 100],
        50,
        [False, True, True, True],
        None,
        None,
        None,
        10,
    ),
    ("TestReplicaCalcDuringRollingUpdateWithMaxSurge", 2, 2, [1000] * 3, [100, 100], 50, None, None, None, None, 10),
]


@pytest.mark.parametrize("case", RESOURCE_CASES, ids=[c[0] for c in RESOURCE_CASES])
def test_resource_replicas(case):
    _, current, expected, requests, levels, target, ready, phase, deleting, start, utilization = case
    pods = _pods(requests, ready, phase, deleting, start)
    # Levels belong to pods in order; extra levels are metrics for pods that do not exist.  A sample
    # covers the minute before it was taken, 10 s ago, so a pod ready for less than that is still warming up.
    metrics = {
        (pods[i].name if i < len(pods) else f"ghost{i}"): PodMetric(v, NOW - 10, MINUTE) for i, v in enumerate(levels)
    }
    assert resource_replicas(current, target, pods, metrics, now=NOW) == (expected, utilization)


def test_resource_errors():
    with pytest.raises(ReplicaCalculationError, match="no metrics"):
        resource_replicas(4, 100, _pods([1000] * 3), {})
    with pytest.raises(ReplicaCalculationError, match="missing request"):
        resource_replicas(1, 100, _pods([None]), {"p0": 200})


def _pod(name, phase="Running", ready=True, start=None, transition=None, deleting=False):
    return Pod(name, 1000, ready, phase, deleting, start, transition)


# replica_calculator_test.go TestGroupPods (defaultTestingCPUInitializationPeriod 2 min, initial readiness delay 10 s).
# Upstream's rows used phase Succeeded for pods it counts; since its 2026 change a Succeeded pod is terminal and
# ignored, so those rows run with Running pods here, and the last row checks the change itself.
# (name, pods, metrics, resource, ready count, unready, missing, ignored)
GROUP_CASES = [
    ("void", [], {}, "cpu", 0, set(), set(), set()),
    (
        "count in a ready pod - memory",
        [_pod("bentham", ready=None, start=None)],
        {"bentham": PodMetric(1, NOW, MINUTE)},
        "memory",
        1,
        set(),
        set(),
        set(),
    ),
    (
        "unready a pod without ready condition - CPU",
        [_pod("lucretius", ready=None, start=NOW)],
        {"lucretius": PodMetric(1)},
        "cpu",
        0,
        {"lucretius"},
        set(),
        set(),
    ),
    (
        "count in a ready pod with fresh metrics during initialization period - CPU",
        [_pod("bentham", start=NOW - MINUTE, transition=NOW - 30)],
        {"bentham": PodMetric(1, NOW, 30)},
        "cpu",
        1,
        set(),
        set(),
        set(),
    ),
    (
        "unready a ready pod without fresh metrics during initialization period - CPU",
        [_pod("bentham", start=NOW - MINUTE, transition=NOW - 30)],
        {"bentham": PodMetric(1, NOW, 60)},
        "cpu",
        0,
        {"bentham"},
        set(),
        set(),
    ),
    (
        "unready an unready pod during initialization period - CPU",
        [_pod("lucretius", ready=False, start=NOW - 10 * MINUTE, transition=NOW - 9 * MINUTE - 54)],
        {"lucretius": PodMetric(1)},
        "cpu",
        0,
        {"lucretius"},
        set(),
        set(),
    ),
    (
        "count in a ready pod without fresh metrics after initialization period - CPU",
        [_pod("bentham", start=NOW - 3 * MINUTE, transition=NOW - 3 * MINUTE)],
        {"bentham": PodMetric(1, NOW - 2 * MINUTE, MINUTE)},
        "cpu",
        1,
        set(),
        set(),
        set(),
    ),
    (
        "count in an unready pod that was ready after initialization period - CPU",
        [_pod("lucretius", ready=False, start=NOW - 10 * MINUTE, transition=NOW - 9 * MINUTE)],
        {"lucretius": PodMetric(1)},
        "cpu",
        1,
        set(),
        set(),
        set(),
    ),
    (
        "unready pod that has never been ready after initialization period - CPU",
        [_pod("lucretius", ready=False, start=NOW - 10 * MINUTE, transition=NOW - 9 * MINUTE - 50)],
        {"lucretius": PodMetric(1)},
        "cpu",
        1,
        set(),
        set(),
        set(),
    ),
    ("a missing pod", [_pod("epicurus", ready=None, start=NOW - 3 * MINUTE)], {}, "cpu", 0, set(), {"epicurus"}, set()),
    (
        "several pods",
        [
            _pod("lucretius", ready=None, start=NOW),
            _pod("niccolo", start=NOW - 3 * MINUTE, transition=NOW - 3 * MINUTE),
            _pod("epicurus", ready=None, start=NOW - 3 * MINUTE),
        ],
        {"lucretius": PodMetric(1), "niccolo": PodMetric(1)},
        "cpu",
        1,
        {"lucretius"},
        {"epicurus"},
        set(),
    ),
    (
        "pending pods are unreadied",
        [_pod("unscheduled", phase="Pending", ready=None, start=None)],
        {},
        "cpu",
        0,
        {"unscheduled"},
        set(),
        set(),
    ),
    (
        "ignore pods with deletion timestamps",
        [_pod("deleted", phase="Pending", deleting=True)],
        {"deleted": PodMetric(1)},
        "cpu",
        0,
        set(),
        set(),
        {"deleted"},
    ),
    (
        "ignore pods in a failed state",
        [_pod("failed", phase="Failed")],
        {"failed": PodMetric(1)},
        "cpu",
        0,
        set(),
        set(),
        {"failed"},
    ),
    (
        "ours: ignore pods in a succeeded state (upstream's 2026 change)",
        [_pod("done", phase="Succeeded")],
        {"done": PodMetric(1)},
        "memory",
        0,
        set(),
        set(),
        {"done"},
    ),
]


@pytest.mark.parametrize("case", GROUP_CASES, ids=[c[0] for c in GROUP_CASES])
def test_group_pods(case):
    _, pods, metrics, resource, ready, unready, missing, ignored = case
    assert group_pods(
        pods, metrics, resource, NOW, cpu_initialization_period=2 * MINUTE, delay_of_initial_readiness=10
    ) == (ready, unready, missing, ignored)


def test_readiness_applies_to_cpu_only():
    """Upstream groupPods: an unready pod's sample counts for any resource but CPU (ours)."""
    pods = _pods([1000] * 2, ready=[True, False])
    metrics = {"p0": 900, "p1": 900}
    assert resource_replicas(2, 50, pods, metrics, resource="cpu", now=NOW) == (2, 90)  # p1 ignored, ceil(1.8 * 1) = 2
    assert resource_replicas(2, 50, pods, metrics, resource="memory", now=NOW) == (4, 90)  # both count: ceil(1.8 * 2)


@pytest.mark.parametrize(
    "name, current, total, target, expected",
    [
        ("TestReplicaCalcTolerancePerPodCMExternal", 3, 8600, 2900, 3),  # 8600 / (2900 * 3) = 0.989
        ("ours: per-pod target from one replica", 1, 8600, 2900, 3),
        ("ours: KEDA's ceil(lag / lagThreshold)", 4, 100, 10, 10),
        ("ours: per-pod target from zero replicas", 0, 25, 10, 3),
    ],
)
def test_external_per_pod(name, current, total, target, expected):
    assert external_per_pod_replicas(current, total, target) == expected


@pytest.mark.parametrize(
    "name, current, ready, total, target, expected",
    [
        ("TestReplicaCalcToleranceCMExternal", 3, 3, 8600, 8888, 3),
        ("ours: Value target scales by ready pods", 2, 2, 9000, 3000, 6),
        # getUsageRatioReplicaCount: from zero replicas, ceil(ratio) with no tolerance, so a target can leave 0.
        ("ours: scale from zero, ceil of the usage ratio", 0, 0, 2500, 1000, 3),
        ("ours: scale from zero within tolerance still leaves zero", 0, 0, 1050, 1000, 2),
        ("ours: stay at zero without usage", 0, 0, 0, 1000, 0),
    ],
)
def test_external_value(name, current, ready, total, target, expected):
    assert external_replicas(current, ready, total, target) == expected


@pytest.mark.parametrize(
    "name, tolerances, ratio, within",
    [
        ("ours: default 10% both ways", Tolerances(), 0.91, True),
        ("ours: scale-down tolerance only below", Tolerances(scale_down=0.3, scale_up=0.0), 0.75, True),
        ("ours: scale-up tolerance only above", Tolerances(scale_down=0.3, scale_up=0.0), 1.01, False),
        ("ours: asymmetric up", Tolerances(scale_down=0.0, scale_up=0.5), 1.4, True),
        ("ours: asymmetric down", Tolerances(scale_down=0.0, scale_up=0.5), 0.99, False),
    ],
)
def test_tolerances(name, tolerances, ratio, within):
    assert tolerances.is_within(ratio) is within


def test_behavior_tolerances_override_the_controllers_per_direction():
    hpa = HPAPolicy(behavior={"scaleDown": {"tolerance": 0.5}}, tolerance=0.1)
    assert hpa.tolerances == Tolerances(scale_down=0.5, scale_up=0.1)
    assert HPAPolicy().tolerances == Tolerances(0.1, 0.1)  # no behavior: the controller's flag
    with pytest.raises(KaleConfigError, match="behavior.scaleUp.tolerance"):
        HPAPolicy(behavior={"scaleUp": {"tolerance": -1}})


# horizontal_test.go TestNormalizeDesiredReplicas (the legacy path: no behavior, 5-minute downscale window).
@pytest.mark.parametrize(
    "name, recs, desired, stabilized, log_length",
    [
        ("empty log", [], 5, 5, 1),
        ("stabilize", [(4, -2 * MINUTE), (5, -1 * MINUTE)], 3, 5, 3),
        ("no stabilize", [(1, -2 * MINUTE), (2, -1 * MINUTE)], 3, 3, 3),
        ("no stabilize - old recommendations", [(10, -10 * MINUTE), (9, -9 * MINUTE)], 3, 3, 2),
        (
            "stabilize - old recommendations",
            [(10, -10 * MINUTE), (4, -1 * MINUTE), (5, -2 * MINUTE), (9, -9 * MINUTE)],
            3,
            5,
            4,
        ),
    ],
)
def test_normalize_desired_replicas_legacy(name, recs, desired, stabilized, log_length):
    stored = Recommendations((r, NOW + dt) for r, dt in recs)
    assert stabilize_recommendation_legacy(stored, desired, NOW, window_s=5 * MINUTE) == stabilized
    assert len(stored) == log_length


# horizontal_test.go TestScalingWithRules rows for the legacy limits (convertDesiredReplicasWithRules), which
# upstream's table runs through the behavior path with default rules; these are ours, checking the legacy arithmetic.
@pytest.mark.parametrize(
    "name, current, desired, lo, hi, expected, condition",
    [
        ("ours: legacy within range", 5, 7, 3, 8, 7, "DesiredWithinRange"),
        ("ours: legacy below min", 3, 1, 2, 8, 2, "TooFewReplicas"),
        ("ours: legacy max(2 x current, 4) from 1", 1, 50, 1, 100, 4, "ScaleUpLimit"),
        ("ours: legacy 2 x current", 10, 50, 1, 100, 20, "ScaleUpLimit"),
        ("ours: legacy maxReplicas below the limit", 10, 50, 1, 15, 15, "TooManyReplicas"),
        ("ours: legacy scale-down unlimited", 10, 1, 1, 100, 1, "DesiredWithinRange"),
    ],
)
def test_convert_desired_replicas_with_rules(name, current, desired, lo, hi, expected, condition):
    assert convert_desired_replicas_with_rules(current, desired, lo, hi) == (expected, condition)


def _rules(pods=0, pods_period=0, percent=0, percent_period=0, window=0) -> HPAScalingRules:
    """horizontal_test.go generateScalingRules."""
    policies = []
    if pods:
        policies.append(HPAScalingPolicy("Pods", pods, pods_period))
    if percent:
        policies.append(HPAScalingPolicy("Percent", percent, percent_period))
    return HPAScalingRules(window, tuple(policies), "Max")


def _uniform_events(changes, period_s) -> list[TimestampedScaleEvent]:
    """horizontal_test.go generateEventsUniformDistribution: each event in the middle of its slice of the last
    period."""
    segment = period_s / len(changes)
    return [TimestampedScaleEvent(c, NOW - (period_s - segment * (i + 1) + segment / 2)) for i, c in enumerate(changes)]


UP, DOWN = HPABehavior.default().scale_up, HPABehavior.default().scale_down  # GenerateHPAScale{Up,Down}Rules(nil)
# horizontal_test.go TestScalingWithRules: (name, up events, down events, min, max, up rules, down rules, current,
# desired, expected, condition)
SCALING_WITH_RULES = [
    ("prenormalized desired replicas within range", [], [], 3, 8, None, None, 5, 7, 7, "DesiredWithinRange"),
    ("prenormalized desired replicas < minReplicas", [], [], 2, 8, None, None, 3, 1, 2, "TooFewReplicas"),
    (
        "prenormalized desired replicas within range when minReplicas is 0",
        [],
        [],
        0,
        10,
        None,
        None,
        1,
        0,
        0,
        "DesiredWithinRange",
    ),
    (
        "maxReplicas is the limit because maxReplicas < scaleUpLimit",
        [],
        [],
        1,
        10,
        None,
        None,
        20,
        1000,
        10,
        "TooManyReplicas",
    ),
    (
        "desired replica count is more than the maximum replica count",
        [],
        [],
        100,
        150,
        None,
        None,
        100,
        1000,
        150,
        "TooManyReplicas",
    ),
    (
        "scaleUpLimit is the limit because scaleUpLimit < maxReplicas with user policies",
        [],
        [],
        1,
        2000,
        _rules(0, 0, 1, 60),
        None,
        3,
        1000,
        4,
        "ScaleUpLimit",
    ),
    ("scaleUp with default behavior", [], [], 1, 1000, None, None, 10, 50, 20, "ScaleUpLimit"),
    (
        "scaleUp with pods policy larger than percent policy",
        [],
        [],
        1,
        1000,
        _rules(100, 60, 100, 60),
        None,
        10,
        500,
        110,
        "ScaleUpLimit",
    ),
    (
        "scaleUp with percent policy larger than pods policy",
        [],
        [],
        1,
        1000,
        _rules(2, 60, 100, 60),
        None,
        10,
        500,
        20,
        "ScaleUpLimit",
    ),
    (
        "scaleUp with spec MaxReplicas limitation with large pod policy",
        [],
        [],
        1,
        1000,
        _rules(100, 60),
        None,
        10,
        50,
        50,
        "DesiredWithinRange",
    ),
    (
        "scaleUp with spec MaxReplicas limitation with large percent policy",
        [],
        [],
        1,
        1000,
        _rules(10000, 60),
        None,
        10,
        50,
        50,
        "DesiredWithinRange",
    ),
    ("scaleUp with pod policy limitation", [], [], 1, 1000, _rules(30, 60), None, 10, 50, 40, "ScaleUpLimit"),
    (
        "scaleUp with percent policy limitation",
        [],
        [],
        1,
        1000,
        _rules(0, 0, 200, 60),
        None,
        10,
        50,
        30,
        "ScaleUpLimit",
    ),
    (
        "scaleDown with percent policy larger than pod policy",
        [],
        [],
        1,
        1000,
        None,
        _rules(20, 60, 1, 60, 300),
        100,
        2,
        80,
        "ScaleDownLimit",
    ),
    (
        "scaleDown with pod policy larger than percent policy",
        [],
        [],
        1,
        1000,
        None,
        _rules(2, 60, 1, 60, 300),
        100,
        2,
        98,
        "ScaleDownLimit",
    ),
    (
        "scaleDown with spec MinReplicas limitation with large pod policy",
        [],
        [],
        1,
        1000,
        None,
        _rules(100, 60, 0, 0, 300),
        10,
        0,
        1,
        "TooFewReplicas",
    ),
    (
        "scaleDown with spec MinReplicas limitation with large percent policy",
        [],
        [],
        5,
        1000,
        None,
        _rules(0, 0, 100, 60, 300),
        10,
        2,
        5,
        "TooFewReplicas",
    ),
    (
        "scaleDown with pod policy limitation",
        [],
        [],
        1,
        1000,
        None,
        _rules(5, 60, 0, 0, 300),
        10,
        2,
        5,
        "ScaleDownLimit",
    ),
    (
        "scaleDown with percent policy limitation",
        [],
        [],
        1,
        1000,
        None,
        _rules(0, 0, 50, 60, 300),
        10,
        5,
        5,
        "DesiredWithinRange",
    ),
    (
        "scaleUp with spec MaxReplicas limitation with large pod policy and events",
        [1, 5, 9],
        [],
        1,
        200,
        _rules(300, 60),
        None,
        100,
        500,
        200,
        "TooManyReplicas",
    ),
    (
        "scaleUp with spec MaxReplicas limitation with large percent policy and events",
        [1, 5, 9],
        [],
        1,
        200,
        _rules(0, 0, 10000, 60),
        None,
        100,
        500,
        200,
        "TooManyReplicas",
    ),
    (
        "scaleUp with currentReplicas limitation with rate.PeriodSeconds with a lot of recent scale up events",
        [1, 5, 9],
        [],
        1,
        1000,
        _rules(5, 120),
        None,
        100,
        500,
        100,
        "ScaleUpLimit",
    ),
    (
        "scaleUp with pod policy and previous scale up events",
        [1, 5, 9],
        [],
        1,
        1000,
        _rules(150, 120),
        None,
        100,
        500,
        235,
        "ScaleUpLimit",
    ),
    (
        "scaleUp with percent policy and previous scale up events",
        [1, 5, 9],
        [],
        1,
        1000,
        _rules(0, 0, 200, 120),
        None,
        100,
        500,
        255,
        "ScaleUpLimit",
    ),
    (
        "scaleUp with percent policy and previous scale up and down events",
        [4],
        [2],
        1,
        1000,
        _rules(0, 0, 300, 300),
        None,
        6,
        24,
        16,
        "ScaleUpLimit",
    ),
    (
        "scaleDown with default policy and previous events",
        [],
        [1, 5, 9],
        1,
        1000,
        None,
        None,
        10,
        5,
        5,
        "DesiredWithinRange",
    ),
    (
        "scaleDown with spec MinReplicas=nil limitation with large pod policy and previous events",
        [],
        [1, 5, 9],
        1,
        1000,
        None,
        _rules(115, 120, 0, 0, 300),
        100,
        0,
        1,
        "TooFewReplicas",
    ),
    (
        "scaleDown with spec MinReplicas limitation with large pod policy and previous events",
        [],
        [1, 5, 9],
        5,
        1000,
        None,
        _rules(130, 120, 0, 0, 300),
        100,
        0,
        5,
        "TooFewReplicas",
    ),
    (
        "scaleDown with spec MinReplicas limitation with large percent policy and previous events",
        [],
        [1, 5, 9],
        5,
        1000,
        None,
        _rules(0, 0, 100, 120, 300),
        100,
        2,
        5,
        "TooFewReplicas",
    ),
    (
        "scaleDown with pod policy limitation and previous events",
        [],
        [1, 5, 9],
        1,
        1000,
        None,
        _rules(5, 120, 0, 0, 300),
        100,
        2,
        100,
        "ScaleDownLimit",
    ),
    (
        "scaleDown with percent policy limitation and previous events",
        [],
        [2, 4, 6],
        1,
        1000,
        None,
        _rules(0, 0, 50, 120, 300),
        100,
        0,
        56,
        "ScaleDownLimit",
    ),
    (
        "scaleDown with percent policy and previous scale up and down events",
        [2],
        [4],
        1,
        1000,
        None,
        _rules(0, 0, 50, 180, 0),
        10,
        1,
        6,
        "ScaleDownLimit",
    ),
    (
        "scaleDown with previous events preventing further scale down",
        [],
        [10, 10, 10],
        1,
        1000,
        None,
        _rules(0, 0, 10, 120, 300),
        100,
        0,
        100,
        "ScaleDownLimit",
    ),
    (
        "scaleDown with with previous events still allowing more scale down",
        [],
        [10, 10, 10],
        1,
        1000,
        None,
        _rules(0, 0, 1000, 120, 300),
        10,
        5,
        5,
        "DesiredWithinRange",
    ),
    (
        "check 'outdated' flag for events for one behavior for up",
        [8, 12, 9, 11],
        [],
        1,
        1000,
        _rules(1000, 60),
        None,
        100,
        200,
        200,
        "DesiredWithinRange",
    ),
    (
        "check that events were not marked 'outdated' for two different policies in the behavior for up",
        [8, 12, 9, 11],
        [],
        1,
        1000,
        _rules(1000, 120, 100, 60),
        None,
        100,
        200,
        200,
        "DesiredWithinRange",
    ),
    (
        "check that events were marked 'outdated' for two different policies in the behavior for up",
        [8, 12, 9, 11],
        [],
        1,
        1000,
        _rules(1000, 30, 100, 60),
        None,
        100,
        200,
        200,
        "DesiredWithinRange",
    ),
    (
        "check 'outdated' flag for events for one behavior for down",
        [],
        [8, 12, 9, 11],
        1,
        1000,
        None,
        _rules(1000, 60, 0, 0, 300),
        100,
        5,
        5,
        "DesiredWithinRange",
    ),
    (
        "check that events were not marked 'outdated' for two different policies in the behavior for down",
        [],
        [8, 12, 9, 11],
        1,
        1000,
        None,
        _rules(1000, 120, 100, 60, 300),
        100,
        5,
        5,
        "DesiredWithinRange",
    ),
    (
        "check that events were marked 'outdated' for two different policies in the behavior for down",
        [],
        [8, 12, 9, 11],
        1,
        1000,
        None,
        _rules(1000, 30, 100, 60, 300),
        100,
        5,
        5,
        "DesiredWithinRange",
    ),
]


@pytest.mark.parametrize("case", SCALING_WITH_RULES, ids=[c[0] for c in SCALING_WITH_RULES])
def test_scaling_with_rules(case):
    _, up_events, down_events, lo, hi, up_rules, down_rules, current, desired, expected, condition = case
    behavior = HPABehavior(up_rules or UP, down_rules or DOWN)
    got = rate_limit(
        current,
        desired,
        lo,
        hi,
        behavior,
        _uniform_events(up_events, 120) if up_events else [],
        _uniform_events(down_events, 120) if down_events else [],
        NOW,
    )
    assert got == (expected, condition)


# horizontal_test.go TestStoreScaleEvents: (name, previous events (change, age s), rules, expected change in the last 60
# s,
# expected events after storing a change of 5 (change, outdated)); None rules: an HPA without behavior stores nothing.
STORE_CASES = [
    ("empty entries with default behavior", [], None, 0, []),
    ("empty entries with two-policy-behavior", [], _rules(10, 60, 100, 60), 0, [(5, False)]),
    ("one outdated entry to be kept untouched without behavior", [(7, 61)], None, 0, [(7, False)]),
    ("one outdated entry to be replaced with behavior", [(7, 61)], _rules(10, 60, 100, 60), 0, [(5, False)]),
    (
        "one actual entry to be not touched with behavior",
        [(7, 58)],
        _rules(10, 60, 100, 60),
        7,
        [(7, False), (5, False)],
    ),
    ("two entries, one of them to be replaced", [(7, 61), (6, 59)], _rules(10, 60), 6, [(5, False), (6, False)]),
    (
        "replace one entry, use policies with different periods",
        [(8, 29), (6, 59), (7, 61), (9, 61)],
        _rules(10, 60, 100, 30),
        14,
        [(8, False), (6, False), (7, True), (5, False)],
    ),
    (
        "two entries, both actual",
        [(7, 58), (6, 59)],
        _rules(10, 120, 100, 30),
        13,
        [(7, False), (6, False), (5, False)],
    ),
]


@pytest.mark.parametrize("case", STORE_CASES, ids=[c[0] for c in STORE_CASES])
def test_store_scale_events(case):
    _, previous, rules, change_in_60s, expected = case
    events = [TimestampedScaleEvent(c, NOW - age) for c, age in previous]
    assert replicas_change_per_period(60, events, NOW) == change_in_60s
    # A rescale 10 -> 15 (up) or 10 -> 5 (down); the policy stores events only when it has behavior (see below).
    if rules is not None:
        store_scale_event(events, rules, 5, NOW)
    assert [(e.replica_change, e.outdated) for e in events] == expected


# horizontal_test.go TestNormalizeDesiredReplicasWithBehavior: (name, recommendations (value, age), current, desired,
# expected, expected stored values or None, up window, down window)
STABILIZE_CASES = [
    ("empty recommendations for scaling down", [], 100, 5, 5, [5], 0, 0),
    ("simple scale down stabilization", [(4, 2 * MINUTE), (5, MINUTE)], 100, 3, 5, [4, 5, 3], 0, 3 * MINUTE),
    ("simple scale up stabilization", [(4, 2 * MINUTE), (5, MINUTE)], 1, 7, 4, [4, 5, 7], 5 * MINUTE, 0),
    ("no scale down stabilization", [(1, 2 * MINUTE), (2, MINUTE)], 100, 3, 3, [1, 2, 3], 5 * MINUTE, 0),
    ("no scale up stabilization", [(4, 2 * MINUTE), (5, MINUTE)], 1, 3, 3, [4, 5, 3], 0, 5 * MINUTE),
    (
        "no scale down stabilization, reuse recommendation element",
        [(10, 10 * MINUTE), (9, 9 * MINUTE)],
        100,
        3,
        3,
        [10, 3],
        0,
        0,
    ),
    (
        "no scale up stabilization, reuse recommendation element",
        [(10, 10 * MINUTE), (9, 9 * MINUTE)],
        1,
        100,
        100,
        [10, 100],
        0,
        0,
    ),
    (
        "scale down stabilization, reuse one of obsolete recommendation element",
        [(10, 10 * MINUTE), (4, MINUTE), (5, 2 * MINUTE), (9, 9 * MINUTE)],
        100,
        3,
        5,
        [10, 4, 5, 3],
        0,
        3 * MINUTE,
    ),
    (
        "scale up stabilization, reuse one of obsolete recommendation element",
        [(10, 100 * MINUTE), (6, MINUTE), (5, 2 * MINUTE), (9, 3 * MINUTE)],
        1,
        100,
        5,
        [100, 6, 5, 9],
        300,
        0,
    ),
    (
        "scale up and down stabilization, do not scale up when prenormalized rec goes down",
        [(2, 100 * MINUTE), (3, 3 * MINUTE)],
        2,
        1,
        2,
        None,
        300,
        300,
    ),
    (
        "scale up and down stabilization, do not scale down when prenormalized rec goes up",
        [(2, 100 * MINUTE), (1, 3 * MINUTE)],
        2,
        3,
        2,
        None,
        300,
        300,
    ),
]


@pytest.mark.parametrize("case", STABILIZE_CASES, ids=[c[0] for c in STABILIZE_CASES])
def test_normalize_desired_replicas_with_behavior(case):
    _, recs, current, desired, expected, stored_values, up_window, down_window = case
    behavior = HPABehavior(HPAScalingRules(up_window, ()), HPAScalingRules(down_window, ()))
    stored = Recommendations((r, NOW - age) for r, age in recs)
    assert stabilize_recommendation(stored, behavior, current, desired, NOW) == expected
    if stored_values is not None:
        assert [r for r, _ in stored.rows()] == stored_values


def test_recent_scale_up_events_limit_the_next_one():
    """ours: a Pods policy counts what was added within its period."""
    beh = HPABehavior(HPAScalingRules(0, (HPAScalingPolicy("Pods", 2, 60),)), HPABehavior.default().scale_down)
    assert rate_limit(7, 12, 1, 20, beh, [TimestampedScaleEvent(2, 970)], [], now=1000) == (7, "ScaleUpLimit")
    assert rate_limit(7, 12, 1, 20, beh, [TimestampedScaleEvent(2, 900)], [], now=1000) == (9, "ScaleUpLimit")


def _obs(t, workers, utilization=0.5, backlog=0.0, restarting=False):
    return Observation(
        time=t,
        workers=workers,
        arrival_rate=0,
        consumption_rate=0,
        backlog=backlog,
        time_lag_s=0,
        utilization=utilization,
        restarting=restarting,
    )


def test_policy_without_behavior_takes_the_legacy_path():
    """ours: an HPA written without behavior scales up by max(2 x current, 4) and holds a scale-down for the
    controller's 5-minute window, counting a recommendation exactly at the cutoff (stabilizeRecommendation)."""
    hpa = HPAPolicy(min_replicas=1, max_replicas=32, target_utilization=80)
    assert hpa.decide(_obs(0, 4, utilization=1.0)).workers == 5  # ceil(4 * 100/80)
    assert hpa.decide(_obs(15, 5, utilization=0.2)).workers == 5
    assert hpa.decide(_obs(300, 5, utilization=0.2)).workers == 5  # t=0 is not before the cutoff yet
    assert hpa.decide(_obs(301, 5, utilization=0.2)).workers == 2  # ceil(5 * 20/80)
    assert hpa.decide(_obs(316, 2, utilization=8.0)).workers == 4  # wants 20: max(2 x 2, 4)
    assert hpa.up_events == [] and hpa.down_events == []  # no behavior, no scale events


@pytest.mark.parametrize(
    "current, utilization, expected",
    [
        (2, 16.0, 6),  # wants 40: 4 Pods (6) beats 100 Percent (4) per 15 s, selectPolicy Max
        (10, 3.2, 20),  # wants 40: 100 Percent (20) beats 4 Pods (14)
        (10, 0.96, 12),  # wants 12: within both, no stabilization window on the way up
    ],
)
def test_a_behavior_without_scale_up_gets_upstream_s_default_scale_up_rules(current, utilization, expected):
    """upstream (GenerateHPAScaleUpRules): a direction ``behavior`` leaves out is 0 s of stabilization and
    max(4 Pods, 100 Percent) per 15 s."""
    hpa = HPAPolicy(target_utilization=80, max_replicas=64, behavior={"scaleDown": {"stabilizationWindowSeconds": 60}})
    assert hpa.decide(_obs(0, current, utilization=utilization)).workers == expected


def test_policy_with_behavior_records_the_initial_recommendation():
    """ours (recordInitialRecommendation): what runs at the first sync is a recommendation, so a scale-down
    waits a full window after the autoscaler starts."""
    hpa = HPAPolicy(behavior={"scaleDown": {"stabilizationWindowSeconds": 300}})
    assert hpa.decide(_obs(0, 6, utilization=0.2)).workers == 6
    assert hpa.decide(_obs(299, 6, utilization=0.2)).workers == 6
    decision = hpa.decide(_obs(300, 6, utilization=0.2))
    assert decision.workers == 2 and "DesiredWithinRange" in decision.reason
    assert [(e.replica_change, e.outdated) for e in hpa.down_events] == [(4, False)]
    # The outdated flag survives a restart of the controller (state in the decision's metadata).
    restored = HPAPolicy(behavior={"scaleDown": {"stabilizationWindowSeconds": 300}})
    restored.load_state(hpa.state())
    assert restored.down_events == hpa.down_events and restored.recommendations == hpa.recommendations


def test_policy_on_lag():
    hpa = HPAPolicy(metric="lag", target_lag_per_worker=1000, max_replicas=10)
    assert hpa.decide(_obs(0, 2, backlog=5500)).workers == 4  # wants 6; legacy limit max(2 x 2, 4)


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        # A Resource metric comes from the pods: none while they are not ready, so the sync is skipped.
        ("utilization", 4),
        # An External metric (the lag) comes from Kafka: upstream scales on it while the pods restart.
        ("lag", 8),
    ],
)
def test_policy_while_restarting(metric, expected):
    hpa = HPAPolicy(metric=metric, target_lag_per_worker=1000, max_replicas=10)
    decision = hpa.decide(_obs(15, 4, backlog=50_000, utilization=2.0, restarting=True))
    assert decision.workers == expected, decision.reason


def test_the_default_behavior_is_upstream_s():
    # GenerateHPAScaleUpRules / GenerateHPAScaleDownRules with nothing given, and the controller's 300 s window.
    assert HPABehavior.default() == HPABehavior(
        scale_up=HPAScalingRules(0, (HPAScalingPolicy("Pods", 4, 15), HPAScalingPolicy("Percent", 100, 15)), "Max"),
        scale_down=HPAScalingRules(300, (HPAScalingPolicy("Percent", 100, 15),), "Max"),
    )


def test_a_behavior_as_kubernetes_writes_it():
    spec = {
        "scaleUp": {
            "stabilizationWindowSeconds": 60,
            "policies": [{"type": "Pods", "value": 2, "periodSeconds": 30}],
            "selectPolicy": "Min",
            "tolerance": 0,
        },
        "scaleDown": {"selectPolicy": "Disabled"},
    }
    assert HPABehavior.from_spec(spec) == HPABehavior(
        scale_up=HPAScalingRules(60.0, (HPAScalingPolicy("Pods", 2, 30.0),), "Min", 0.0),
        scale_down=HPAScalingRules(300.0, (HPAScalingPolicy("Percent", 100, 15),), "Disabled"),
    )
    assert HPABehavior.from_spec({}) == HPABehavior.default()


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"scaleup": {}}, "behavior: unknown field(s) scaleup; use scaleUp and scaleDown"),
        ({"scaleUp": {"window": 1, "policy": []}}, "behavior.scaleUp: unknown field(s) policy, window"),
        (
            {"scaleDown": {"selectPolicy": "max"}},
            "behavior.scaleDown.selectPolicy: must be one of Max, Min, Disabled, got 'max'",
        ),
        ({"scaleDown": {"tolerance": -0.1}}, "behavior.scaleDown.tolerance: must be >= 0, got -0.1"),
        (
            {"scaleUp": {"stabilizationWindowSeconds": 3601}},
            "behavior.scaleUp.stabilizationWindowSeconds: must be in [0, 3600], got 3601",
        ),
        (
            {"scaleUp": {"stabilizationWindowSeconds": -1}},
            "behavior.scaleUp.stabilizationWindowSeconds: must be in [0, 3600], got -1",
        ),
        (
            {"scaleUp": {"policies": [{"type": "pods", "value": 1, "periodSeconds": 15}]}},
            "behavior.scaleUp.policies[0].type: must be one of Pods, Percent, got 'pods'",
        ),
        (
            {
                "scaleUp": {
                    "policies": [
                        {"type": "Pods", "value": 1, "periodSeconds": 15},
                        {"type": "Percent", "value": 0, "periodSeconds": 15},
                    ]
                }
            },
            "behavior.scaleUp.policies[1].value: must be > 0, got 0",
        ),
        (
            {"scaleDown": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 1801}]}},
            "behavior.scaleDown.policies[0].periodSeconds: must be in (0, 1800], got 1801",
        ),
        (
            {"scaleDown": {"policies": [{"type": "Pods", "value": 1}]}},
            "behavior.scaleDown.policies[0].periodSeconds: must be in (0, 1800], got 0",
        ),
        (
            {"scaleUp": {"selectPolicy": "Least"}, "scaleDown": {"tolerance": -1}, "other": 1},
            "3 problems: behavior: unknown field(s) other; use scaleUp and scaleDown; "
            "behavior.scaleUp.selectPolicy: must be one of Max, Min, Disabled, got 'Least'; "
            "behavior.scaleDown.tolerance: must be >= 0, got -1",
        ),
    ],
)
def test_a_behavior_is_refused_as_the_api_server_refuses_it(spec, message):
    with pytest.raises(KaleConfigError) as err:
        HPABehavior.from_spec(spec)
    assert str(err.value) == message


@pytest.mark.parametrize("window, period", [(0, 1800), (3600, 0.5)])
def test_a_behavior_at_the_api_server_s_bounds_is_kept(window, period):
    spec = {
        "scaleDown": {
            "stabilizationWindowSeconds": window,
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": period}],
        }
    }
    rules = HPABehavior.from_spec(spec).scale_down
    assert rules.stabilization_window_seconds == window and rules.policies == (HPAScalingPolicy("Pods", 1, period),)


def test_recommendations_equal_only_recommendations():
    rows = [[3, 10.0], [4, 25.0]]
    assert Recommendations(rows) == Recommendations(rows)
    assert Recommendations(rows) != Recommendations([[3, 10.0]])
    assert Recommendations(rows) != rows
    assert Recommendations(rows).rows() == rows and isinstance(Recommendations(rows).rows()[0][0], int)


def test_scale_events_stored_before_the_outdated_flag_are_current():
    policy = HPAPolicy(min_replicas=1, max_replicas=8, behavior=HPABehavior.default())
    policy.load_state({"up_events": [[2, 100.0]], "down_events": [[1, 50.0, True]]})
    assert policy.up_events == [TimestampedScaleEvent(2, 100.0, False)]
    assert policy.down_events == [TimestampedScaleEvent(1, 50.0, True)]
    assert policy.state()["up_events"] == [[2, 100.0, False]]
