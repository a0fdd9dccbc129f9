"""Stream telemetry: what Kale sees of a topic and the trainer's consumer group.

Per partition and in total: end offset, committed offset, lag, arrival and
consumption rates, and time lag (the paper's definition: now minus the time
the oldest unconsumed sample entered the topic).

Lag and rates are in samples: offset differences times ``samples_per_record``
(1 unless the producer packs micro-batches of samples into each record, which
high-rate topics do because a Python consumer parses records, not bytes, at a
bounded rate).  Offsets themselves stay offsets.

How each figure is measured, so that it is right on Apache Kafka and on the
embedded Tansu broker alike:

* committed offsets: one OffsetFetch for the group (admin client);
* end offsets: ListOffsets(LATEST), then corrected by the high watermark of
  a Fetch (``max`` of the two).  Kafka answers both the same; Tansu's
  ListOffsets returns the base offset of the last batch + 1, while its
  Fetch high watermark is exact;
* time lag: that same Fetch starts at each partition's committed offset,
  so its first record is the oldest unconsumed sample, and its timestamp
  (LogAppendTime where the topic sets it, else the producer's CreateTime)
  is when it entered the topic.  Record timestamps are exact to the
  sample, need no history, and survive restarts of the telemetry itself;
* missing committed offset: the trainer resets to the earliest offset, so
  the lag is end - earliest (KEDA's ``offsetResetPolicy: earliest``,
  generalised to logs whose start is not 0);
* arrival / consumption rates: differences of end / committed offsets
  between two snapshots, divided by the time between them.

Cost is a constant number of broker round trips whatever the partition
count: Metadata, ListOffsets(LATEST) and ListOffsets(EARLIEST) once per
leader broker, one OffsetFetch, and one Fetch round per leader broker.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kale_dagster.model.types import PartitionOffsets
from kale_dagster.stream.record_time import usable_ms


@dataclass(frozen=True)
class RawOffsets:
    """What one read of the broker returns, before any arithmetic."""

    time: float
    partitions: tuple[PartitionOffsets, ...]
    topic_of: tuple[str, ...]  # topic of each partition entry
    oldest_unconsumed_ms: tuple[int | None, ...]  # record timestamp at the committed offset


@dataclass(frozen=True)
class PartitionStats:
    topic: str
    partition: int
    end_offset: int
    committed: int | None
    lag: int  # samples
    arrival_rate: float | None  # samples per second
    consumption_rate: float | None
    time_lag_s: float


@dataclass(frozen=True)
class StreamSnapshot:
    """Telemetry at one instant.  Rates are None on a first snapshot (no previous one)."""

    time: float
    partitions: tuple[PartitionStats, ...]
    end_offset_total: int
    committed_total: int
    sample_lag: int
    arrival_rate: float | None
    consumption_rate: float | None
    time_lag_s: float
    time_lag_complete: bool = True  # False when some lagging partition's oldest record was not read, or unusable
    unusable_stamps: int = 0  # lagging partitions whose oldest record's timestamp cannot be used (record_time)

    def offsets(self) -> dict[str, dict[int, tuple[int, int | None]]]:
        out: dict[str, dict[int, tuple[int, int | None]]] = {}
        for p in self.partitions:
            out.setdefault(p.topic, {})[p.partition] = (p.end_offset, p.committed)
        return out

    def metadata(self) -> dict:
        """Flat figures for Dagster metadata and the history table."""
        return {
            "arrival_rate": self.arrival_rate,
            "consumption_rate": self.consumption_rate,
            "sample_lag": self.sample_lag,
            "time_lag_s": self.time_lag_s,
            "end_offset_total": self.end_offset_total,
            "committed_total": self.committed_total,
            "partitions": len(self.partitions),
        }


@dataclass(frozen=True)
class PreviousOffsets:
    """The parts of an earlier snapshot needed for rates (kept in a sensor cursor)."""

    time: float
    offsets: dict = field(default_factory=dict)  # topic -> partition -> [end, committed]


def partition_lag(p: PartitionOffsets) -> int:
    """Message lag with the trainer's earliest-reset rule for a missing committed offset."""
    assert p.end_offset is not None  # read_offsets has every partition's (a KEDA port's readings may not)
    if p.committed is None or p.committed < 0:
        return max(p.end_offset - p.earliest_offset, 0)
    return max(p.end_offset - p.committed, 0)


def build_snapshot(
    raw: RawOffsets, previous: PreviousOffsets | None = None, samples_per_record: int = 1
) -> StreamSnapshot:
    """Pure arithmetic from raw offsets (and an earlier snapshot) to a snapshot."""
    dt = raw.time - previous.time if previous is not None else 0.0
    earlier = previous.offsets if previous is not None else {}
    k = samples_per_record
    stats, unusable, unknown = [], 0, 0
    for p, topic, oldest_ms in zip(raw.partitions, raw.topic_of, raw.oldest_unconsumed_ms):
        lag = partition_lag(p) * k
        assert p.end_offset is not None
        arrival = consumption = None
        before = earlier.get(topic, {}).get(str(p.partition))
        # An end offset that went backwards means the topic was recreated
        # (or an in-memory broker restarted): no rate rather than a false one.
        if before is not None and dt > 0 and p.end_offset >= before[0]:
            arrival = max(p.end_offset - before[0], 0) * k / dt
            if p.committed is not None:
                # No earlier commit: the group started from the earliest offset.
                was = before[1] if before[1] is not None else p.earliest_offset
                consumption = max(p.committed - was, 0) * k / dt
        stamp = usable_ms(oldest_ms, raw.time)  # a missing, non-positive or future stamp says nothing of the lag
        unknown += lag > 0 and stamp is None  # not read, or read and unusable: the time lag is incomplete
        unusable += lag > 0 and oldest_ms is not None and stamp is None
        time_lag = max(raw.time - stamp / 1000.0, 0.0) if (lag > 0 and stamp is not None) else 0.0
        stats.append(PartitionStats(topic, p.partition, p.end_offset, p.committed, lag, arrival, consumption, time_lag))

    def total(values):
        vals = [v for v in values if v is not None]
        return sum(vals) if vals and len(vals) == len(stats) else None

    return StreamSnapshot(
        time=raw.time,
        partitions=tuple(stats),
        end_offset_total=sum(s.end_offset for s in stats),
        committed_total=sum(s.committed or 0 for s in stats),
        sample_lag=sum(s.lag for s in stats),
        arrival_rate=total(s.arrival_rate for s in stats),
        consumption_rate=total(s.consumption_rate for s in stats),
        time_lag_s=max((s.time_lag_s for s in stats), default=0.0),
        time_lag_complete=not unknown,
        unusable_stamps=unusable,
    )


def previous_from(snapshot: StreamSnapshot) -> PreviousOffsets:
    offsets: dict = {}
    for p in snapshot.partitions:
        offsets.setdefault(p.topic, {})[str(p.partition)] = [p.end_offset, p.committed]
    return PreviousOffsets(snapshot.time, offsets)


def topic_partitions(consumer, topics: Sequence[str]) -> list:
    """Every partition of ``topics``, in order; a topic without partitions is a LookupError naming it."""
    from kafka.structs import TopicPartition

    tps = []
    for topic in topics:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            raise LookupError(f"topic {topic!r} does not exist or has no partitions")
        tps.extend(TopicPartition(topic, p) for p in sorted(parts))
    return tps


def read_offsets(consumer, admin, topics: list[str], group_id: str, fetch_timeout_s: float = 5.0) -> RawOffsets:
    """Read raw offsets with kafka-python clients (see module docstring for the requests made)."""
    now = time.time()
    tps = topic_partitions(consumer, topics)
    ends = consumer.end_offsets(tps)
    starts = consumer.beginning_offsets(tps)
    committed_raw = admin.list_group_offsets(group_id).get(group_id, {})
    committed = {
        tp: (meta.offset if meta is not None and meta.offset >= 0 else None) for tp, meta in committed_raw.items()
    }

    # One Fetch round from each partition's committed (or earliest) offset:
    # the first record is the oldest unconsumed sample; the response carries
    # the exact high watermark.
    consumer.assign(tps)
    for tp in tps:
        pos = committed.get(tp)
        consumer.seek(tp, pos if pos is not None else starts[tp])
    oldest: dict = {}
    highwater: dict = {}
    deadline = time.monotonic() + fetch_timeout_s
    while time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=100, max_records=1_000_000).items():
            if records and tp not in oldest:
                oldest[tp] = records[0].timestamp
            consumer.pause(tp)
        for tp in tps:
            hw = consumer.highwater(tp)
            if hw is not None:
                highwater[tp] = hw
        if len(highwater) == len(tps) and all(
            tp in oldest or highwater[tp] <= _start(committed, starts, tp) for tp in tps
        ):
            break
    consumer.unsubscribe()
    partitions = tuple(
        PartitionOffsets(tp.partition, max(ends[tp], highwater.get(tp, 0)), committed.get(tp), starts[tp]) for tp in tps
    )
    return RawOffsets(now, partitions, tuple(tp.topic for tp in tps), tuple(oldest.get(tp) for tp in tps))


def _start(committed: dict, starts: dict, tp) -> int:
    pos = committed.get(tp)
    return pos if pos is not None else starts[tp]
