"""Port of the Kubernetes HPA replica calculator (pkg/controller/podautoscaler/replica_calculator.go).

Pure arithmetic: given pods, their metrics and a target, how many replicas.
The control loop, stabilization windows and rate limits live in
``kale_dagster.policies.hpa``.  Integer percentages are kept exactly as
upstream computes them (utilization is truncated to a whole percent before
the ratio is taken), because the upstream test cases depend on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

DEFAULT_TOLERANCE = 0.1


class ReplicaCalculationError(ValueError):
    """Raised where upstream returns an error (no metrics, missing requests)."""


@dataclass(frozen=True)
class Pod:
    """A pod as the calculator sees it.

    ``phase`` follows Kubernetes (Running, Pending, Failed, Succeeded);
    ``deleting`` marks a set deletion timestamp; ``ready`` the Ready condition.
    ``request`` is the resource request in milli-units (None when unset).
    """

    name: str
    request: Optional[int]
    ready: bool = True
    phase: str = "Running"
    deleting: bool = False


def within_tolerance(ratio: float, tolerance: float = DEFAULT_TOLERANCE) -> bool:
    return (1.0 - tolerance) <= ratio <= (1.0 + tolerance)


def _group_pods(pods: Sequence[Pod], metrics: Mapping[str, int]):
    """Split pods like upstream groupPods: ready count, unready, missing and ignored names."""
    ready_count, unready, missing, ignored = 0, set(), set(), set()
    for pod in pods:
        if pod.deleting or pod.phase == "Failed":
            ignored.add(pod.name)
            continue
        if pod.phase == "Pending":
            unready.add(pod.name)
            continue
        if pod.name not in metrics:
            missing.add(pod.name)
            continue
        if not pod.ready:
            unready.add(pod.name)
            continue
        ready_count += 1
    return ready_count, unready, missing, ignored


def utilization_ratio(metrics: Mapping[str, int], requests: Mapping[str, int], target_utilization: int) -> tuple[float, int]:
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
    metrics: Mapping[str, int],
    tolerance: float = DEFAULT_TOLERANCE,
) -> tuple[int, int]:
    """GetResourceReplicas: (replicas, utilization %) for a target utilization of requests."""
    if not pods:
        raise ReplicaCalculationError("no pods returned by selector while calculating replica count")
    if not metrics:
        raise ReplicaCalculationError("unable to get metrics for resource: no metrics returned from resource metrics API")
    ready_count, unready, missing, ignored = _group_pods(pods, metrics)
    metrics = {k: v for k, v in metrics.items() if k not in ignored and k not in unready}
    if not metrics:
        raise ReplicaCalculationError("did not receive metrics for targeted pods (pods might be unready)")
    requests = {}
    for pod in pods:
        if pod.request is None:
            raise ReplicaCalculationError(f"missing request for {pod.name}")
        requests[pod.name] = pod.request

    usage_ratio, utilization = utilization_ratio(metrics, requests, target_utilization)
    scale_up_with_unready = bool(unready) and usage_ratio > 1.0
    if not scale_up_with_unready and not missing:
        if within_tolerance(usage_ratio, tolerance):
            return current_replicas, utilization
        return math.ceil(usage_ratio * ready_count), utilization

    if missing:
        if usage_ratio < 1.0:
            # On a scale-down, missing pods are assumed at max(100%, target) of their request.
            fallback = max(100, target_utilization)
            for name in missing:
                metrics[name] = requests[name] * fallback // 100
        elif usage_ratio > 1.0:
            for name in missing:
                metrics[name] = 0  # on a scale-up, missing pods are assumed idle
    if scale_up_with_unready:
        for name in unready:
            metrics[name] = 0

    new_ratio, _ = utilization_ratio(metrics, requests, target_utilization)
    if within_tolerance(new_ratio, tolerance) or (usage_ratio < 1.0 < new_ratio) or (usage_ratio > 1.0 > new_ratio):
        # Too small a change, or the assumed values would flip the direction.
        return current_replicas, utilization
    new_replicas = math.ceil(new_ratio * len(metrics))
    if (new_ratio < 1.0 and new_replicas > current_replicas) or (new_ratio > 1.0 and new_replicas < current_replicas):
        return current_replicas, utilization
    return new_replicas, utilization


def external_replicas(current_replicas: int, ready_pod_count: int, metric_total: float, target_value: float, tolerance: float = DEFAULT_TOLERANCE) -> int:
    """GetExternalMetricReplicas with a Value target: ratio of the metric to the target, times ready pods."""
    if target_value <= 0:
        raise ReplicaCalculationError("target value must be > 0")
    ratio = metric_total / target_value
    if within_tolerance(ratio, tolerance):
        return current_replicas
    return math.ceil(ratio * ready_pod_count)


def external_per_pod_replicas(current_replicas: int, metric_total: float, target_average_value: float, tolerance: float = DEFAULT_TOLERANCE) -> int:
    """GetExternalPerPodMetricReplicas (AverageValue target): ceil(total / target), unless within tolerance."""
    if target_average_value <= 0:
        raise ReplicaCalculationError("target average value must be > 0")
    replicas = math.ceil(metric_total / target_average_value)
    if current_replicas > 0 and within_tolerance(metric_total / (target_average_value * current_replicas), tolerance):
        return current_replicas
    return replicas
