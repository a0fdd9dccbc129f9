"""KEDA Kafka scaler port: lag semantics, caps, even distribution, activation."""

from __future__ import annotations

import pytest

from kale_dagster import KafkaScalerMetadata, KaleConfigError, KedaKafkaPolicy, Observation, PartitionOffsets
from kale_dagster.policies.keda import find_factors, next_factor_balancing_partitions, partition_lag, total_lag


@pytest.mark.parametrize(
    "end, committed, policy, to_zero, expected",
    [
        (100, 40, "latest", False, 60),
        (100, None, "latest", False, 1),
        (100, None, "latest", True, 0),
        (100, None, "earliest", False, 100),
        (100, None, "earliest", True, 0),
        (100, -1, "latest", False, 1),  # Kafka's "no offset" sentinel
        (100, 100, "latest", False, 0),
    ],
)
def test_partition_lag(end, committed, policy, to_zero, expected):
    assert partition_lag(end, committed, policy, to_zero) == expected


@pytest.mark.parametrize("n, expected", [(0, []), (1, [1]), (6, [1, 2, 3, 6]), (24, [1, 2, 3, 4, 6, 8, 12, 24]), (800, [1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 40, 50, 80, 100, 160, 200, 400, 800])])
def test_find_factors(n, expected):
    assert find_factors(n) == expected


@pytest.mark.parametrize(
    "lag, partitions, threshold, expected",
    [
        (0, 10, 1, 1),
        (1, 10, 1, 1),
        (3, 10, 1, 5),
        (6, 10, 1, 10),
        (25, 10, 10, 5),
        (101, 10, 10, 10),
        (50, 7, 10, 7),
    ],
)
def test_next_factor(lag, partitions, threshold, expected):
    assert next_factor_balancing_partitions(lag, partitions, threshold) == expected


@pytest.mark.parametrize(
    "lags, meta, expected",
    [
        ([5, 5, 5], KafkaScalerMetadata(lag_threshold=10), (15, 15)),
        ([500, 0, 0], KafkaScalerMetadata(lag_threshold=10), (30, 500)),  # capped at partitions * threshold
        ([500, 0, 0], KafkaScalerMetadata(lag_threshold=10, allow_idle_consumers=True), (500, 500)),
        ([500, 0, 0], KafkaScalerMetadata(lag_threshold=10, limit_to_partitions_with_lag=True), (10, 500)),
        ([12, 3, 0, 0], KafkaScalerMetadata(lag_threshold=10, ensure_even_distribution_of_partitions=True), (20, 15)),
    ],
)
def test_total_lag(lags, meta, expected):
    assert total_lag(lags, meta) == expected


def test_metadata_validation_names_the_field():
    with pytest.raises(KaleConfigError, match="lag_threshold"):
        KafkaScalerMetadata(lag_threshold=0)
    with pytest.raises(KaleConfigError, match="limit_to_partitions_with_lag"):
        KafkaScalerMetadata(allow_idle_consumers=True, limit_to_partitions_with_lag=True)


def _obs(t, workers, partitions=(), backlog=0.0):
    return Observation(time=t, workers=workers, arrival_rate=0, consumption_rate=0, backlog=backlog, time_lag_s=0, utilization=1, partitions=partitions)


def test_policy_replicas_from_partition_offsets():
    keda = KedaKafkaPolicy(KafkaScalerMetadata(lag_threshold=100), min_replicas=1, max_replicas=10)
    parts = tuple(PartitionOffsets(i, end_offset=1000, committed=850) for i in range(4))
    # 600 lag / 100 = 6 replicas, but never more than 4 partitions' worth.
    assert keda.decide(_obs(0, 1, parts)).workers == 4


def test_policy_activation_and_cooldown_to_zero():
    keda = KedaKafkaPolicy(KafkaScalerMetadata(lag_threshold=10), min_replicas=0, max_replicas=10, partition_count=8)
    assert keda.decide(_obs(0, 0, backlog=0)).workers == 0
    assert keda.decide(_obs(30, 0, backlog=35)).workers == 1
    assert keda.decide(_obs(45, 1, backlog=35)).workers == 4
    assert keda.decide(_obs(60, 4, backlog=0)).workers == 4  # within cooldown (and HPA's down window)
    # Last active at t=45: zero only once cooldownPeriod (300 s) has passed.
    assert keda.decide(_obs(45 + 299, 4, backlog=0)).workers != 0
    assert keda.decide(_obs(45 + 300, 4, backlog=0)).workers == 0


def test_policy_needs_partitions_or_a_count():
    with pytest.raises(KaleConfigError, match="partition_count"):
        KedaKafkaPolicy().decide(_obs(0, 1, backlog=10))
