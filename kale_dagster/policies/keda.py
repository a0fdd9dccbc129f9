"""Port of KEDA's Apache Kafka scaler (pkg/scalers/kafka_scaler.go) and its scaling loop.

KEDA computes a lag metric; the HPA it creates turns that metric into
replicas with an AverageValue target of ``lagThreshold`` (so replicas =
ceil(totalLag / lagThreshold), with HPA's tolerance, stabilization and rate
limits).  KEDA itself only handles activation: 0 <-> 1 replicas, after
``cooldownPeriod`` without activity.

Lag semantics (telemetry generalises the earliest rule, see ``kale_dagster.stream.telemetry``):

* a partition whose group has no valid committed offset counts as lag 1
  with ``offsetResetPolicy: latest``, as its whole end offset with
  ``earliest``, and as 0 with ``scaleToZeroOnInvalidOffset``;
* a partition missing from the latest-offset response counts as 0 lag
  and is not counted among the topic's partitions (upstream iterates that
  response);
* ``partitionLimitation`` keeps only the listed partitions;
* ``excludePersistentLag`` scales as if a partition whose committed offset
  has not moved since the previous poll had no lag (activation still sees it);
* unless ``allowIdleConsumers``, total lag is capped at
  partitions * lagThreshold (partitions with lag, under
  ``limitToPartitionsWithLag``), so replicas never exceed the partition count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from kale_dagster.errors import KaleConfigError
from kale_dagster.model.types import Decision, Observation, PartitionOffsets
from kale_dagster.policies.hpa import HPAPolicy, sweep_behavior
from kale_dagster.policies.hpa_behavior import HPABehavior
from kale_dagster.policies.registry import PolicySpec, Sizing
from kale_dagster.rules import check, need, ordered, setting

OffsetResetPolicy = Literal["latest", "earliest"]


def partition_lag(
    end_offset: int | None,
    committed: int | None,
    offset_reset_policy: OffsetResetPolicy = "latest",
    scale_to_zero_on_invalid_offset: bool = False,
) -> int:
    """getLagForPartition: lag of one partition, KEDA's rules for a missing committed offset
    (checked first, so scaleToZeroOnInvalidOffset holds even without a latest offset) and for a
    partition the latest-offset response left out (``end_offset`` None: 0 lag)."""
    if committed is None or committed < 0:
        if scale_to_zero_on_invalid_offset:
            return 0
        if offset_reset_policy == "latest":
            return 1
        return 0 if end_offset is None else end_offset
    if end_offset is None:
        return 0
    return end_offset - committed


def parse_partition_limitation(spec: str) -> tuple[int, ...]:
    """kedautil.ParseInt32List: ``partitionLimitation`` as a comma list of ids and ``a-b`` ranges ("1,2,10-12")."""
    ids: list[int] = []
    for part in (p.strip() for p in spec.split(",")):
        try:
            if "-" in part:
                low, high = (int(x) for x in part.split("-", 1))
                if low > high:
                    raise ValueError
                ids.extend(range(low, high + 1))
            else:
                ids.append(int(part))
        except ValueError:
            raise KaleConfigError(
                "partition_limitation", f"error parsing {spec!r}: {part!r} is neither a partition id nor a range a-b"
            ) from None
    return tuple(ids)


def find_factors(n: int) -> list[int]:
    """FindFactors: all divisors of n, ascending (empty for n < 1)."""
    if n < 1:
        return []
    small = [i for i in range(1, math.isqrt(n) + 1) if n % i == 0]
    return sorted(set(small + [n // i for i in small]))


def next_factor_balancing_partitions(total_lag: int, partitions: int, lag_threshold: int) -> int:
    """getNextFactorThatBalancesConsumersToTopicPartitions: the smallest divisor of the
    partition count whose capacity (factor * threshold) covers the lag."""
    for factor in find_factors(partitions):
        if factor * lag_threshold >= total_lag:
            return factor
    return partitions


@dataclass(frozen=True)
class KafkaScalerMetadata:
    """The scaler's trigger metadata (defaults as in KEDA)."""

    lag_threshold: int = setting(10, gt=0, description="lagThreshold: the lag one replica handles")
    activation_lag_threshold: int = setting(0, ge=0, description="activationLagThreshold")
    offset_reset_policy: OffsetResetPolicy = setting("latest", choices=("latest", "earliest"))
    allow_idle_consumers: bool = False
    scale_to_zero_on_invalid_offset: bool = False
    limit_to_partitions_with_lag: bool = False
    ensure_even_distribution_of_partitions: bool = False
    exclude_persistent_lag: bool = False
    partition_limitation: tuple[int, ...] | None = None  # or a string as the trigger writes it ("1,2,10-12")

    def __post_init__(self):
        if isinstance(self.partition_limitation, str):
            object.__setattr__(
                self,
                "partition_limitation",
                parse_partition_limitation(self.partition_limitation) if self.partition_limitation.strip() else None,
            )
        check(
            self,
            need(
                not (self.allow_idle_consumers and self.limit_to_partitions_with_lag),
                "limit_to_partitions_with_lag",
                "cannot be combined with allow_idle_consumers (KEDA rejects it too)",
            ),
            need(
                not (self.limit_to_partitions_with_lag and self.ensure_even_distribution_of_partitions),
                "ensure_even_distribution_of_partitions",
                "cannot be combined with limit_to_partitions_with_lag (KEDA rejects it too)",
            ),
        )


def total_lag(
    partition_lags: Sequence[int], meta: KafkaScalerMetadata, activation_lags: Sequence[int] | None = None
) -> tuple[int, int]:
    """getTotalLag given per-partition lags: (lag used for scaling, lag used for activation).

    ``activation_lags`` are the lags with persistent lag kept (excludePersistentLag), the scaling lags otherwise."""
    lag = sum(partition_lags)
    activation = lag if activation_lags is None else sum(activation_lags)
    return _capped(lag, len(partition_lags), sum(1 for x in partition_lags if x > 0), meta), activation


def _capped(lag: int, partitions: int, lagging: int, meta: KafkaScalerMetadata) -> int:
    """getTotalLag's cap on the summed lag: no more replicas than partitions (or than ``lagging`` ones)."""
    if (
        not meta.allow_idle_consumers
        or meta.limit_to_partitions_with_lag
        or meta.ensure_even_distribution_of_partitions
    ):
        upper = partitions
        if meta.ensure_even_distribution_of_partitions:
            lag = next_factor_balancing_partitions(lag, partitions, meta.lag_threshold) * meta.lag_threshold
        if meta.limit_to_partitions_with_lag:
            upper = lagging
        if lag // meta.lag_threshold > upper:
            lag = upper * meta.lag_threshold
    return lag


@dataclass
class KedaKafkaPolicy:
    """A ScaledObject with one Kafka trigger, driving an HPA on its lag metric.

    ``partition_count`` stands in for per-partition offsets when the
    observation carries only a total backlog (the simulator spreads it
    evenly); real observations carry ``partitions``.
    """

    metadata: KafkaScalerMetadata = field(default_factory=KafkaScalerMetadata)
    min_replicas: int = setting(0, ge=0, description="minReplicaCount")
    max_replicas: int = setting(100, ge=1, description="maxReplicaCount")
    partition_count: int | None = setting(None, ge=1, description="partitions, when readings carry no offsets")
    cooldown_period_s: float = setting(300.0, ge=0, unit="s", description="cooldownPeriod")
    initial_cooldown_period_s: float = setting(
        0.0, ge=0, unit="s", description="initialCooldownPeriod: how long a never-active object waits to go to zero"
    )
    behavior: HPABehavior | None = (
        None  # the HPA's; or a Mapping, as Kubernetes writes it; None: upstream's legacy path
    )
    name: str = "keda"
    sync_period_s: float = 15.0
    _hpa: HPAPolicy = field(init=False)
    _last_active: float | None = field(init=False, default=None)
    #: When the scaled object first decided: its creation, for initialCooldownPeriod.
    _created: float | None = field(init=False, default=None)
    #: excludePersistentLag's memory: each partition's committed offset at the previous poll.
    _previous_offsets: dict = field(init=False, default_factory=dict)

    def __post_init__(self):
        check(self, lambda: ordered(self, "min_replicas", "max_replicas"))
        self._hpa = HPAPolicy(
            min_replicas=max(self.min_replicas, 1),
            max_replicas=self.max_replicas,
            metric="lag",
            target_lag_per_worker=self.metadata.lag_threshold,
            behavior=self.behavior,
            sync_period_s=self.sync_period_s,
            name=self.name,
        )

    def partition_lags(self, obs: Observation) -> tuple[list[int], list[int]]:
        """Per-partition lags (for scaling, for activation) of the partitions the scaler considers."""
        limit = self.metadata.partition_limitation
        # Upstream iterates the latest-offset response: a partition missing from it is not counted.
        considered = [p for p in obs.partitions if (limit is None or p.partition in limit) and p.end_offset is not None]
        with_persistent = [self._lag(p) for p in considered]
        if not self.metadata.exclude_persistent_lag:
            return with_persistent, with_persistent
        return [self._excluding_persistent(p, lag) for p, lag in zip(considered, with_persistent)], with_persistent

    def _spread_total_lag(self, obs: Observation) -> tuple[int, int]:
        """total_lag of the backlog spread evenly over ``partition_count`` partitions (the simulator's
        observations carry no offsets), from the spread's sums instead of a list per sync."""
        if not self.partition_count:
            raise KaleConfigError("partition_count", "needed when observations carry no per-partition offsets")
        lag, n = int(round(obs.backlog)), self.partition_count
        return _capped(lag, n, min(lag, n), self.metadata), lag  # every partition lags once there is one record each

    def _lag(self, p: PartitionOffsets) -> int:
        m = self.metadata
        return partition_lag(p.end_offset, p.committed, m.offset_reset_policy, m.scale_to_zero_on_invalid_offset)

    def _excluding_persistent(self, p: PartitionOffsets, lag: int) -> int:
        """excludePersistentLag: a committed offset that has not moved since the previous poll may be
        stuck on a bad record, so its lag is left out of scaling (valid offsets only, as upstream)."""
        if p.committed is None or p.committed < 0:
            return lag
        previous = self._previous_offsets.get(p.partition)
        if previous == p.committed:
            return 0
        self._previous_offsets[p.partition] = p.committed
        return lag

    def state(self) -> dict:
        return {
            "last_active": self._last_active,
            "created": self._created,
            "hpa": self._hpa.state(),
            "previous_offsets": {str(k): v for k, v in self._previous_offsets.items()},
        }

    def load_state(self, state: dict) -> None:
        self._last_active = state.get("last_active")
        self._created = state.get("created")
        self._hpa.load_state(state.get("hpa", {}))
        self._previous_offsets = {int(k): int(v) for k, v in state.get("previous_offsets", {}).items()}

    def decide(self, obs: Observation) -> Decision:
        if obs.partitions:
            scaling_lags, activation_lags = self.partition_lags(obs)
            lag, activation_lag = total_lag(scaling_lags, self.metadata, activation_lags)
        else:
            lag, activation_lag = self._spread_total_lag(obs)
        active = activation_lag > self.metadata.activation_lag_threshold
        if self._created is None:
            self._created = obs.time
        if active:
            self._last_active = obs.time
        # The scale executor's cases (scale_scaledobjects.go RequestScale), in its order.
        if obs.workers == 0:
            if active:
                return Decision(
                    max(self.min_replicas, 1),
                    self.name,
                    f"activated: lag {activation_lag} > {self.metadata.activation_lag_threshold}",
                )
            return Decision(self.min_replicas, self.name, "inactive at zero replicas; minReplicaCount")
        if not active and self.min_replicas == 0:
            # scaleToZeroOrIdle: an object never active counts from its creation, with initialCooldownPeriod.
            if self._last_active is None:
                since, wait, what = self._created, self.initial_cooldown_period_s, "never active"
            else:
                since, wait, what = self._last_active, self.cooldown_period_s, "inactive"
            if obs.time - since >= wait:
                return Decision(
                    0, self.name, f"{what} for {obs.time - since:.0f} s >= {wait:.0f} s cooldown; scaling to zero"
                )
        decision = self._hpa.decide(obs, lag=float(lag))
        return Decision(
            decision.workers,
            decision.policy,
            f"total lag {lag:,} (threshold {self.metadata.lag_threshold} per replica); {decision.reason}",
        )


#: What a backtest sweeps: lagThreshold, in seconds of one worker's throughput, and the scale-down
#: stabilization window of the HPA KEDA drives (advanced.horizontalPodAutoscalerConfig.behavior).
#: cooldownPeriod is not swept: it acts only when scaling to zero (min_workers 0), at upstream's default.
#: The lowest threshold is KEDA's cheapest setting on most traces, as it patches during restarts too
#: (docs/results.md), so the sweep reaches down to 1 s.
SWEEP_SECONDS_OF_WORK = (1, 6, 30, 60, 300, 600)
SWEEP_SCALE_DOWN_WINDOWS_S = (300, 1800, 3600)
#: Partitions assumed when the sizing does not say (the paper's topic has 800).
DEFAULT_PARTITIONS = 800


def build(
    sizing: Sizing, seconds_of_work: float = 60.0, lag_threshold: int | None = None, **options
) -> KedaKafkaPolicy:
    """KEDA with ``lagThreshold`` as given, else ``seconds_of_work`` of one worker's throughput; ``behavior``
    (of the HPA KEDA creates) may be given as Kubernetes writes it."""
    if lag_threshold is None:
        lag_threshold = _lag_threshold(sizing, seconds_of_work)
    return KedaKafkaPolicy(
        KafkaScalerMetadata(lag_threshold=lag_threshold, activation_lag_threshold=sizing.limits.activation_lag),
        min_replicas=sizing.limits.min_workers,
        max_replicas=sizing.limits.max_workers,
        partition_count=sizing.partitions or DEFAULT_PARTITIONS,
        **options,
    )


def _lag_threshold(sizing: Sizing, seconds_of_work: float) -> int:
    """``lagThreshold`` as this many seconds of one worker's throughput (at least one record)."""
    return max(int(float(sizing.model.predict(1)) * seconds_of_work), 1)


def sweep(sizing: Sizing) -> list[tuple[dict, dict]]:
    # The threshold is fixed when the setting is chosen, as a user writes it into the ScaledObject.
    return [
        (
            {"lag_threshold_seconds_of_work": s, "scale_down_window_s": w},
            {"lag_threshold": _lag_threshold(sizing, s), "behavior": sweep_behavior(w, "upstream")},
        )
        for s in SWEEP_SECONDS_OF_WORK
        for w in SWEEP_SCALE_DOWN_WINDOWS_S
    ]


SPEC = PolicySpec(
    name="keda",
    description="KEDA's Apache Kafka scaler driving an HPA on consumer lag (upstream port)",
    build=build,
    sweep=sweep,
)
