"""KEDA Kafka scaler port: lag semantics, caps, even distribution, activation.

Rows named after a test in kedacore/keda pkg/scalers/kafka_scaler_test.go carry that name; rows that
are ours say so with an ``ours:`` prefix (their expectations are read from kafka_scaler.go).
"""

from __future__ import annotations

import pytest

from kale_dagster import KafkaScalerMetadata, KaleConfigError, KedaKafkaPolicy, Observation, PartitionOffsets
from kale_dagster.policies.keda import (
    find_factors,
    next_factor_balancing_partitions,
    parse_partition_limitation,
    partition_lag,
    total_lag,
)


@pytest.mark.parametrize(
    "name, end, committed, policy, to_zero, expected",
    [
        ("ours: committed offset", 100, 40, "latest", False, 60),
        ("ours: no committed offset, latest", 100, None, "latest", False, 1),
        ("ours: no committed offset, latest, scaleToZeroOnInvalidOffset", 100, None, "latest", True, 0),
        ("ours: no committed offset, earliest", 100, None, "earliest", False, 100),
        ("ours: no committed offset, earliest, scaleToZeroOnInvalidOffset", 100, None, "earliest", True, 0),
        ("ours: Kafka's -1 sentinel is no offset", 100, -1, "latest", False, 1),
        ("ours: caught up", 100, 100, "latest", False, 0),
        ("ours: partition missing from the latest-offset response is 0 lag", None, 40, "latest", False, 0),
        ("ours: missing partition, no offset, scaleToZeroOnInvalidOffset still 0", None, None, "earliest", True, 0),
        ("ours: missing partition, no offset, latest still 1 (checked first)", None, None, "latest", False, 1),
    ],
)
def test_partition_lag(name, end, committed, policy, to_zero, expected):
    assert partition_lag(end, committed, policy, to_zero) == expected


@pytest.mark.parametrize(
    "name, n, expected",
    [
        ("TestFindFactors 10", 10, [1, 2, 5, 10]),
        ("TestFindFactors 13", 13, [1, 13]),
        ("TestFindFactors 17", 17, [1, 17]),
        ("TestFindFactors 25", 25, [1, 5, 25]),
        ("TestFindFactors 50", 50, [1, 2, 5, 10, 25, 50]),
        ("TestFindFactors 100", 100, [1, 2, 4, 5, 10, 20, 25, 50, 100]),
        ("ours: none below 1", 0, []),
        (
            "ours: the paper's 800 partitions",
            800,
            [1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 40, 50, 80, 100, 160, 200, 400, 800],
        ),
    ],
)
def test_find_factors(name, n, expected):
    assert find_factors(n) == expected


@pytest.mark.parametrize(
    "name, lag, partitions, threshold, expected",
    [
        ("TestGetNextFactor 10", 10, 100, 10, 1),
        ("TestGetNextFactor 20", 20, 100, 10, 2),
        ("TestGetNextFactor 40", 40, 100, 10, 4),
        ("TestGetNextFactor 50", 50, 100, 10, 5),
        ("TestGetNextFactor 99", 99, 100, 10, 10),
        ("TestGetNextFactor 100", 100, 100, 10, 10),
        ("TestGetNextFactor 101", 101, 100, 10, 20),
        ("ours: no factor covers the lag", 101, 10, 10, 10),
        ("ours: prime partition count", 50, 7, 10, 7),
    ],
)
def test_next_factor(name, lag, partitions, threshold, expected):
    assert next_factor_balancing_partitions(lag, partitions, threshold) == expected


@pytest.mark.parametrize(
    "name, lags, meta, expected",
    [
        ("ours: plain sum", [5, 5, 5], KafkaScalerMetadata(lag_threshold=10), (15, 15)),
        ("ours: capped at partitions x threshold", [500, 0, 0], KafkaScalerMetadata(lag_threshold=10), (30, 500)),
        (
            "ours: allowIdleConsumers lifts the cap",
            [500, 0, 0],
            KafkaScalerMetadata(lag_threshold=10, allow_idle_consumers=True),
            (500, 500),
        ),
        (
            "ours: limitToPartitionsWithLag caps at partitions with lag",
            [500, 0, 0],
            KafkaScalerMetadata(lag_threshold=10, limit_to_partitions_with_lag=True),
            (10, 500),
        ),
        (
            "ours: ensureEvenDistributionOfPartitions rounds up to a factor",
            [12, 3, 0, 0],
            KafkaScalerMetadata(lag_threshold=10, ensure_even_distribution_of_partitions=True),
            (20, 15),
        ),
    ],
)
def test_total_lag(name, lags, meta, expected):
    assert total_lag(lags, meta) == expected


# parseKafkaMetadata's checks, which upstream's parse tests exercise (its rows are unnamed): (name, metadata, error
# field or None).
METADATA_CASES = [
    ("lagThreshold must be positive", dict(lag_threshold=0), "lag_threshold"),
    ("activationLagThreshold must not be negative", dict(activation_lag_threshold=-1), "activation_lag_threshold"),
    ("offsetResetPolicy latest or earliest", dict(offset_reset_policy="newest"), "offset_reset_policy"),
    (
        "allowIdleConsumers and limitToPartitionsWithLag cannot be set simultaneously",
        dict(allow_idle_consumers=True, limit_to_partitions_with_lag=True),
        "limit_to_partitions_with_lag",
    ),
    (
        "limitToPartitionsWithLag and ensureEvenDistributionOfPartitions cannot be set simultaneously",
        dict(limit_to_partitions_with_lag=True, ensure_even_distribution_of_partitions=True),
        "ensure_even_distribution_of_partitions",
    ),
    ("partitionLimitation that does not parse", dict(partition_limitation="1,x"), "partition_limitation"),
    (
        "allowIdleConsumers with ensureEvenDistributionOfPartitions is accepted",
        dict(allow_idle_consumers=True, ensure_even_distribution_of_partitions=True),
        None,
    ),
    ("excludePersistentLag is accepted", dict(exclude_persistent_lag=True), None),
]


@pytest.mark.parametrize("case", METADATA_CASES, ids=[c[0] for c in METADATA_CASES])
def test_metadata_validation_names_the_field(case):
    _, fields, error = case
    if error is None:
        KafkaScalerMetadata(**fields)
    else:
        with pytest.raises(KaleConfigError, match=error):
            KafkaScalerMetadata(**fields)


@pytest.mark.parametrize(
    "name, spec, partitions, expected",
    [
        ("TestGetTopicPartitions success_all_partitions_explicit", "1,2", [1, 2], [1, 2]),
        ("TestGetTopicPartitions success_partial_partitions_explicit", "1,2,3", [1, 2, 3, 4, 5, 6], [1, 2, 3]),
        ("TestGetTopicPartitions success_all_partitions_implicit", "", [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]),
        ("ours: a range", "0,2-4", [0, 1, 2, 3, 4, 5], [0, 2, 3, 4]),
    ],
)
def test_partition_limitation(name, spec, partitions, expected):
    keda = KedaKafkaPolicy(
        KafkaScalerMetadata(lag_threshold=10, partition_limitation=spec), min_replicas=1, max_replicas=10
    )
    # Lag = the partition id + 1, so the considered partitions show in the lags.
    obs = _obs(0, 1, tuple(PartitionOffsets(i, end_offset=100 + i + 1, committed=100) for i in partitions))
    scaling, activation = keda.partition_lags(obs)
    assert scaling == activation == [i + 1 for i in expected]
    assert parse_partition_limitation("5-7") == (5, 6, 7)


def test_partition_missing_from_the_latest_offsets_is_not_counted():
    """ours: upstream iterates the latest-offset response, so a partition it leaves out neither lags nor raises the
    cap."""
    keda = KedaKafkaPolicy(KafkaScalerMetadata(lag_threshold=10), min_replicas=1, max_replicas=10)
    parts = (PartitionOffsets(0, end_offset=600, committed=0), PartitionOffsets(1, end_offset=None, committed=0))
    assert keda.partition_lags(_obs(0, 1, parts)) == ([600], [600])
    assert keda.decide(_obs(0, 1, parts)).workers == 1  # capped at the one partition counted


def test_exclude_persistent_lag():
    """ours: excludePersistentLag leaves out a partition whose committed offset has not moved since the previous
    poll (maybe stuck on a bad record) from scaling, but not from activation; state survives a restart."""
    keda = KedaKafkaPolicy(
        KafkaScalerMetadata(lag_threshold=10, exclude_persistent_lag=True), min_replicas=0, max_replicas=10
    )
    first = (PartitionOffsets(0, 500, 100), PartitionOffsets(1, 500, 100))
    assert keda.partition_lags(_obs(0, 1, first)) == ([400, 400], [400, 400])  # no previous poll: all count
    second = (PartitionOffsets(0, 600, 100), PartitionOffsets(1, 600, 200))
    assert keda.partition_lags(_obs(15, 1, second)) == ([0, 400], [500, 400])
    restored = KedaKafkaPolicy(
        KafkaScalerMetadata(lag_threshold=10, exclude_persistent_lag=True), min_replicas=0, max_replicas=10
    )
    restored.load_state(keda.state())
    stuck = (PartitionOffsets(0, 700, 100), PartitionOffsets(1, 700, 200))
    assert restored.partition_lags(_obs(30, 1, stuck)) == ([0, 0], [600, 500])
    # Everything stuck: nothing to scale on, yet the group stays active (not scaled to zero).
    assert restored.decide(_obs(30, 0, stuck)).workers == 1


def _obs(t, workers, partitions=(), backlog=0.0):
    return Observation(
        time=t,
        workers=workers,
        arrival_rate=0,
        consumption_rate=0,
        backlog=backlog,
        time_lag_s=0,
        utilization=1,
        partitions=partitions,
    )


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


def test_policy_never_active_goes_to_its_minimum_after_initial_cooldown():
    """Upstream scales a never-active object (no lastActiveTime) to zero once initialCooldownPeriod has passed
    since its creation (default 0: at once), and an inactive object below minReplicaCount up to it."""

    def scaled_object(**options):
        return KedaKafkaPolicy(
            KafkaScalerMetadata(lag_threshold=10), min_replicas=0, max_replicas=10, partition_count=8, **options
        )

    decision = scaled_object().decide(_obs(0, 3, backlog=0))
    assert decision.workers == 0 and "never active" in decision.reason
    waiting = scaled_object(initial_cooldown_period_s=120)
    assert waiting.decide(_obs(0, 3, backlog=0)).workers != 0
    restored = scaled_object(initial_cooldown_period_s=120)
    restored.load_state(waiting.state())  # creation survives a restart of the controller
    assert restored.decide(_obs(119, 3, backlog=0)).workers != 0
    assert restored.decide(_obs(120, 3, backlog=0)).workers == 0
    floor = KedaKafkaPolicy(KafkaScalerMetadata(lag_threshold=10), min_replicas=2, max_replicas=10, partition_count=8)
    assert floor.decide(_obs(0, 0, backlog=0)).workers == 2


@pytest.mark.parametrize(
    "meta",
    [
        KafkaScalerMetadata(lag_threshold=10),
        KafkaScalerMetadata(lag_threshold=10, allow_idle_consumers=True),
        KafkaScalerMetadata(lag_threshold=10, limit_to_partitions_with_lag=True),
        KafkaScalerMetadata(lag_threshold=7, ensure_even_distribution_of_partitions=True),
    ],
)
@pytest.mark.parametrize("backlog", [0, 1, 5, 7.6, 8, 79, 80, 81, 12_345.4])
def test_ours_a_spread_backlog_totals_as_its_partitions_would(meta, backlog):
    """Ours: the simulator's backlog, spread evenly over partition_count partitions, totals as the list of
    those partitions' lags does."""
    keda = KedaKafkaPolicy(meta, max_replicas=100, partition_count=8)
    base, extra = divmod(int(round(backlog)), 8)
    assert keda._spread_total_lag(_obs(0, 1, backlog=backlog)) == total_lag(
        [base + 1] * extra + [base] * (8 - extra), meta
    )


def test_policy_needs_partitions_or_a_count():
    with pytest.raises(KaleConfigError, match="partition_count"):
        KedaKafkaPolicy().decide(_obs(0, 1, backlog=10))
