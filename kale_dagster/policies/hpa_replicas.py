"""Port of the Kubernetes HPA replica calculator (pkg/controller/podautoscaler/replica_calculator.go).

Pure arithmetic: given pods, their metrics and a target, how many replicas.
The control loop, stabilization windows and rate limits live in
``kale_dagster.policies.hpa``.  Integer percentages are kept exactly as
upstream computes them (utilization is truncated to a whole percent before
the ratio is taken), because the upstream test cases depend on it.
Times are seconds on any clock shared by the pods, the metrics and ``now``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEFAULT_TOLERANCE = 0.1
#: kube-controller-manager's --horizontal-pod-autoscaler-cpu-initialization-period and
#: --horizontal-pod-autoscaler-initial-readiness-delay defaults.
CPU_INITIALIZATION_PERIOD_S = 300.0
DELAY_OF_INITIAL_READINESS_STATUS_S = 30.0
#: How long ago a pod described only by ``ready`` started: long enough to be past every initialization period.
_LONG_AGO_S = 1e9


class ReplicaCalculationError(ValueError):
    """Raised where upstream returns an error (no metrics, missing requests)."""


@dataclass(frozen=True)
class Tolerances:
    """Upstream's ``Tolerances``: how far below and above 1.0 the usage ratio may be before scaling.

    Both default to the controller's --horizontal-pod-autoscaler-tolerance; Kubernetes 1.33+ lets an
    HPA set each direction (``behavior.scaleDown.tolerance`` / ``behavior.scaleUp.tolerance``)."""

    scale_down: float = DEFAULT_TOLERANCE
    scale_up: float = DEFAULT_TOLERANCE

    def is_within(self, ratio: float) -> bool:
        return (1.0 - self.scale_down) <= ratio <= (1.0 + self.scale_up)


@dataclass(frozen=True)
class Pod:
    """A pod as the calculator sees it.

    ``phase`` follows Kubernetes (Running, Pending, Failed, Succeeded); ``deleting`` marks a set
    deletion timestamp; ``ready`` the Ready condition's status (None: the pod has no Ready condition).
    ``start_time`` and ``ready_transition`` (the Ready condition's last transition) matter only to
    CPU readiness; left unset, the pod started long ago and its condition last changed then.
    ``request`` is the resource request in milli-units (None when unset).
    """

    name: str
    request: int | None
    ready: bool | None = True
    phase: str = "Running"
    deleting: bool = False
    start_time: float | None = -_LONG_AGO_S
    ready_transition: float | None = None


@dataclass(frozen=True)
class PodMetric:
    """One pod's sample: value (milli-units), when it was taken and over what window (metrics-server's 1 min...)."""

    value: int
    timestamp: float = 0.0
    window: float = 60.0


Metrics = Mapping[str, int | PodMetric]


def _metric(m: int | PodMetric) -> PodMetric:
    return m if isinstance(m, PodMetric) else PodMetric(int(m))


def _cpu_unready(
    pod: Pod,
    sample: int | PodMetric,
    now: float,
    cpu_initialization_period: float,
    delay_of_initial_readiness: float,
) -> bool:
    """groupPods' CPU rule: a sample is ignored while the pod may still be initializing."""
    if pod.ready is None or pod.start_time is None:
        return True
    transition = pod.start_time if pod.ready_transition is None else pod.ready_transition
    if pod.start_time + cpu_initialization_period > now:
        # Still initializing: ignore the sample if unready or if no full metric window passed since the last transition.
        metric = _metric(sample)
        return (not pod.ready) or metric.timestamp < transition + metric.window
    # Initialized: ignore it only if the pod is unready and has never been ready.
    return (not pod.ready) and pod.start_time + delay_of_initial_readiness > transition


def group_pods(
    pods: Sequence[Pod],
    metrics: Metrics,
    resource: str = "cpu",
    now: float = 0.0,
    cpu_initialization_period: float = CPU_INITIALIZATION_PERIOD_S,
    delay_of_initial_readiness: float = DELAY_OF_INITIAL_READINESS_STATUS_S,
) -> tuple[int, set, set, set]:
    """groupPods: (ready count, unready, missing, ignored) pod names.

    Terminal pods (Failed and, since upstream's 2026 change, Succeeded) and pods being deleted are
    ignored; Pending pods are unready; readiness applies to the CPU resource only."""
    ready_count, unready, missing, ignored = 0, set(), set(), set()
    cpu = resource == "cpu"
    for pod in pods:
        name, phase = pod.name, pod.phase
        if pod.deleting or phase == "Failed" or phase == "Succeeded":
            ignored.add(name)
        elif phase == "Pending":
            unready.add(name)
        elif name not in metrics:
            missing.add(name)
        elif cpu and _cpu_unready(pod, metrics[name], now, cpu_initialization_period, delay_of_initial_readiness):
            unready.add(name)
        else:
            ready_count += 1
    return ready_count, unready, missing, ignored


def utilization_ratio(
    metrics: Mapping[str, int], requests: Mapping[str, int], target_utilization: int
) -> tuple[float, int]:
    """(usage ratio, utilization %) over pods that have both a metric and a request.

    Metrics for pods that do not exist (no request known) are ignored, as upstream does.
    """
    total_metric = total_request = 0
    for name, value in metrics.items():
        if name in requests:
            total_metric += value
            total_request += requests[name]
    if total_request == 0:
        raise ReplicaCalculationError("no metrics returned matched known pods")
    utilization = (total_metric * 100) // total_request
    return utilization / target_utilization, utilization


def resource_replicas(
    current_replicas: int,
    target_utilization: int,
    pods: Sequence[Pod],
    metrics: Metrics,
    tolerances: Tolerances = Tolerances(),
    resource: str = "cpu",
    now: float = 0.0,
) -> tuple[int, int]:
    """GetResourceReplicas: (replicas, utilization %) for a target utilization of requests."""
    if not metrics:
        raise ReplicaCalculationError(
            "unable to get metrics for resource: no metrics returned from resource metrics API"
        )
    if not pods:
        raise ReplicaCalculationError("no pods returned by selector while calculating replica count")
    ready_count, unready, missing, ignored = group_pods(pods, metrics, resource, now)
    left_out = ignored | unready
    values = {k: v.value if isinstance(v, PodMetric) else int(v) for k, v in metrics.items() if k not in left_out}
    if not values:
        raise ReplicaCalculationError("did not receive metrics for targeted pods (pods might be unready)")
    unset = next((pod for pod in pods if pod.request is None), None)
    if unset is not None:
        raise ReplicaCalculationError(f"missing request for {resource} in pod {unset.name}")
    requests = {pod.name: pod.request for pod in pods if pod.request is not None}  # all of them, as checked

    usage_ratio, utilization = utilization_ratio(values, requests, target_utilization)
    scale_up_with_unready = bool(unready) and usage_ratio > 1.0
    if not scale_up_with_unready and not missing:
        if tolerances.is_within(usage_ratio):
            return current_replicas, utilization
        return math.ceil(usage_ratio * ready_count), utilization

    if missing:
        if usage_ratio < 1.0:
            # On a scale-down, missing pods are assumed at max(100%, target) of their request.
            fallback = max(100, target_utilization)
            for name in missing:
                values[name] = requests[name] * fallback // 100
        elif usage_ratio > 1.0:
            for name in missing:
                values[name] = 0  # on a scale-up, missing pods are assumed idle
    if scale_up_with_unready:
        for name in unready:
            values[name] = 0

    new_ratio, _ = utilization_ratio(values, requests, target_utilization)
    if tolerances.is_within(new_ratio) or (usage_ratio < 1.0 < new_ratio) or (usage_ratio > 1.0 > new_ratio):
        # Too small a change, or the assumed values would flip the direction.
        return current_replicas, utilization
    new_replicas = math.ceil(new_ratio * len(values))
    if (new_ratio < 1.0 and new_replicas > current_replicas) or (new_ratio > 1.0 and new_replicas < current_replicas):
        return current_replicas, utilization
    return new_replicas, utilization


def ready_pod_count(pods: Sequence[Pod]) -> int:
    """getReadyPodsCount: Running pods whose Ready condition is true."""
    return sum(1 for p in pods if p.phase == "Running" and p.ready)


def external_replicas(
    current_replicas: int,
    ready_pods: int,
    metric_total: float,
    target_value: float,
    tolerances: Tolerances = Tolerances(),
) -> int:
    """GetExternalMetricReplicas (Value target) through getUsageRatioReplicaCount.

    From zero replicas the ratio alone decides (ceil), with no tolerance, so a target can scale up from 0."""
    if target_value <= 0:
        raise ReplicaCalculationError("target value must be > 0")
    ratio = metric_total / target_value
    if current_replicas == 0:
        return math.ceil(ratio)
    if tolerances.is_within(ratio):
        return current_replicas
    return math.ceil(ratio * ready_pods)


def external_per_pod_replicas(
    current_replicas: int, metric_total: float, target_average_value: float, tolerances: Tolerances = Tolerances()
) -> int:
    """GetExternalPerPodMetricReplicas (AverageValue target): ceil(total / target), unless within tolerance."""
    if target_average_value <= 0:
        raise ReplicaCalculationError("target average value must be > 0")
    replicas = math.ceil(metric_total / target_average_value)
    if current_replicas > 0 and tolerances.is_within(metric_total / (target_average_value * current_replicas)):
        return current_replicas
    return replicas
