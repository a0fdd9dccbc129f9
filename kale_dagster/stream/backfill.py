"""Rebuild a topic's arrival-rate history from the records Kafka retains: a warm start for the forecaster.

A new pipeline has no metrics history, and Prophet needs days of it; Kafka
usually retains a week of the topic.  The number of records that arrived in
a bucket [b, b') is, summed over partitions, the offset of the first record
stamped at or after b' minus that of the first stamped at or after b.  So
the history is rebuilt from one offset per partition per bucket boundary:

* ``TimestampIndexLookup``: Kafka's time index answers exactly that
  (ListOffsets by timestamp), one request per boundary for all partitions;
* ``FetchSearchLookup``: for brokers whose answer is wrong (the embedded
  Tansu broker returns the partition's first offset for any earlier
  timestamp), a search over offsets that reads records' timestamps with
  Fetch: each Fetch returns a run of records, boundaries inside the run are
  answered from it, the others recurse to the left or right of it; where
  boundaries outnumber the runs left to read, it reads them in order.

Which one is used is decided by probing (``choose_lookup``): the time index is
asked for a record whose offset and timestamp were just read, and trusted
only if its answer is that record or an earlier one stamped at the same time.

Counts are exact when offsets count records: not on compacted topics, and
transaction markers (offsets without a record) are counted as records.
Timestamps must not decrease within a partition, which holds for
LogAppendTime and for producers that stamp records as they send them.
Buckets older than what every partition still retains are left out.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from kale_dagster.errors import InputDataError
from kale_dagster.stream.record_time import Stamp, judge
from kale_dagster.stream.telemetry import topic_partitions

Run = list[tuple[int, int]]  # (offset, timestamp in ms) of consecutive records


class RecordReader:
    """Fetch-level reads of one consumer: the records from an offset on, and a partition's bounds."""

    def __init__(self, consumer, timeout_s: float = 10.0, run_records: int = 1000, now_s: float | None = None):
        self.consumer = consumer
        self.now_s = now_s  # the clock records' timestamps are judged against (stream.record_time); None: now
        self.timeout_s = timeout_s
        self.run_records = run_records
        self.fetches = 0
        self._assigned = None

    def run_at(self, tp, offset: int) -> tuple[Run, int | None]:
        """The records from ``offset`` on (up to ``run_records``) and the partition's high watermark."""
        if self._assigned != tp:
            self.consumer.assign([tp])
            self._assigned = tp
        self.consumer.seek(tp, offset)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            records = self.consumer.poll(timeout_ms=200, max_records=self.run_records).get(tp, [])
            self.fetches += 1
            highwater = self.consumer.highwater(tp)
            if records:
                now = self.now_s if self.now_s is not None else time.time()
                stamps = [(r.offset, judge(r.timestamp, now)) for r in records]
                bad = [(offset, why) for offset, why in stamps if why is not Stamp.USABLE]
                if bad:  # the same rule as telemetry's (stream.record_time)
                    raise InputDataError(
                        f"{tp.topic}[{tp.partition}] has {len(bad)} record(s) whose timestamp cannot be used, the "
                        f"first at offset {bad[0][0]} ({bad[0][1].value}); they cannot be bucketed by time"
                    )
                return [(r.offset, r.timestamp) for r in records], highwater
            if highwater is not None and offset >= highwater:
                return [], highwater
        raise TimeoutError(
            f"no answer from {tp.topic}[{tp.partition}] at offset {offset} within {self.timeout_s:.0f} s"
        )


@dataclass(frozen=True)
class PartitionSpan:
    """What a partition retains: offsets [start, end) and the first retained record's timestamp (ms)."""

    start: int
    end: int
    first_ms: int | None


class OffsetLookup(ABC):
    """For each partition, the offset of the first record stamped at or after each boundary (``end`` if none)."""

    method: str

    def __init__(self, reader: RecordReader, spans: dict):
        self.reader = reader
        self.spans = spans
        self.list_offsets = 0

    @property
    def requests(self) -> int:
        return self.list_offsets + self.reader.fetches

    @abstractmethod
    def offsets(self, boundaries_ms: Sequence[int], done: Callable[[int, int], None] | None = None) -> dict:
        """{tp: [offset per boundary]}; boundaries ascending; ``done(k, n)`` reports progress."""


class TimestampIndexLookup(OffsetLookup):
    """Kafka's time index: one ListOffsets request per boundary, for all partitions at once."""

    method = "list-offsets-by-timestamp"

    def offsets(self, boundaries_ms: Sequence[int], done: Callable[[int, int], None] | None = None) -> dict:
        out = {tp: [] for tp in self.spans}
        for k, b in enumerate(boundaries_ms):
            answers = self.reader.consumer.offsets_for_times({tp: int(b) for tp in self.spans})
            self.list_offsets += 1
            for tp, span in self.spans.items():
                found = answers.get(tp)
                out[tp].append(span.end if found is None else min(max(found.offset, span.start), span.end))
            if done:
                done(k + 1, len(boundaries_ms))
        return out


class FetchSearchLookup(OffsetLookup):
    """A search over offsets by the timestamps Fetch returns, for brokers whose time index cannot be trusted."""

    method = "fetch-search"

    def offsets(self, boundaries_ms: Sequence[int], done: Callable[[int, int], None] | None = None) -> dict:
        out = {}
        for k, (tp, span) in enumerate(self.spans.items()):
            found: dict[int, int] = {}
            self._search(tp, list(boundaries_ms), span.start, span.end, found)
            out[tp] = [found[b] for b in boundaries_ms]
            if done:
                done(k + 1, len(self.spans))
        return out

    def _search(self, tp, boundaries: list[int], lo: int, hi: int, found: dict) -> None:
        # Invariant: each boundary's answer lies in [lo, hi], hi meaning "no record in [lo, hi) is that late".
        if not boundaries:
            return
        if lo >= hi:
            found.update((b, hi) for b in boundaries)
            return
        if hi - lo <= len(boundaries) * self.reader.run_records:
            self._scan(tp, boundaries, lo, hi, found)  # more boundaries than runs to read: reading them all is cheaper
            return
        mid = (lo + hi) // 2
        run, _ = self.reader.run_at(tp, mid)
        run = [(offset, ts) for offset, ts in run if offset < hi]
        if not run:  # no record in [mid, hi): every answer is in [lo, mid), or hi itself
            sub: dict[int, int] = {}
            self._search(tp, boundaries, lo, mid, sub)
            found.update((b, hi if o == mid else o) for b, o in sub.items())
            return
        first_offset, first_ts = run[0]
        last_ts = run[-1][1]
        left = [b for b in boundaries if b <= first_ts]
        inside = [b for b in boundaries if first_ts < b <= last_ts]
        right = [b for b in boundaries if b > last_ts]
        for b in inside:
            found[b] = next(offset for offset, ts in run if ts >= b)
        self._search(tp, left, lo, first_offset, found)
        self._search(tp, right, run[-1][0] + 1, hi, found)

    def _scan(self, tp, boundaries: list[int], lo: int, hi: int, found: dict) -> None:
        pending = iter(boundaries)
        b = next(pending, None)
        offset = lo
        while b is not None and offset < hi:
            run, _ = self.reader.run_at(tp, offset)
            run = [(o, ts) for o, ts in run if o < hi]
            if not run:
                break
            for o, ts in run:
                while b is not None and ts >= b:
                    found[b] = o
                    b = next(pending, None)
            offset = run[-1][0] + 1
        while b is not None:
            found[b] = hi
            b = next(pending, None)


def partition_spans(reader: RecordReader, tps: Sequence) -> dict:
    """Each partition's retained offsets and first timestamp: one Fetch from its start (whose high watermark
    is exact, where ListOffsets(LATEST) may not be)."""
    starts = reader.consumer.beginning_offsets(list(tps))
    ends = reader.consumer.end_offsets(list(tps))
    spans = {}
    for tp in tps:
        run, highwater = reader.run_at(tp, starts[tp])
        end = max(ends[tp], highwater or 0, run[-1][0] + 1 if run else 0)
        spans[tp] = PartitionSpan(starts[tp], end, run[0][1] if run else None)
    return spans


def choose_lookup(reader: RecordReader, spans: dict) -> OffsetLookup:
    """The time index if it answers a probe right, else the Fetch search: chosen by behaviour, not by broker name."""
    index = TimestampIndexLookup(reader, spans)
    populated = [(tp, s) for tp, s in spans.items() if s.end - s.start >= 2]
    if not populated:
        return index  # nothing to tell them apart with, and nothing much to count
    tp, span = max(populated, key=lambda item: item[1].end - item[1].start)
    run, _ = reader.run_at(tp, (span.start + span.end) // 2)
    offset, ts = run[0]
    answer = reader.consumer.offsets_for_times({tp: ts}).get(tp)
    index.list_offsets += 1
    if answer is not None and answer.offset == offset:
        return index
    if answer is not None and span.start <= answer.offset < offset:
        # Right only if the answer holds a record stamped ts (and the one before it is earlier).
        at, _ = reader.run_at(tp, answer.offset)
        before, _ = reader.run_at(tp, answer.offset - 1) if answer.offset > span.start else ([(0, -1)], None)
        if at and at[0][1] >= ts and before[0][1] < ts:
            return index
    search = FetchSearchLookup(reader, spans)
    search.list_offsets = index.list_offsets
    return search


@dataclass(frozen=True)
class ArrivalBackfill:
    """Per-bucket arrivals rebuilt from Kafka: ``rows`` has ``ts`` (bucket end, epoch s), ``records`` and
    ``arrival_rate`` (samples/s); ``start``/``end`` the span covered; ``note`` why it is shorter than asked."""

    rows: pd.DataFrame
    method: str
    requests: int
    start: float
    end: float
    note: str = ""


def rebuild_arrivals(
    consumer,
    topics: Sequence[str],
    *,
    days: float,
    bucket_s: float,
    now: float | None = None,
    until: float | None = None,
    samples_per_record: int = 1,
    done: Callable[[int, int], None] | None = None,
) -> ArrivalBackfill:
    """The arrival rate per ``bucket_s`` over the last ``days`` (or up to ``until``), from retained records;
    ``done(k, n)`` reports progress (boundaries or partitions looked up)."""
    if days <= 0 or bucket_s <= 0:
        raise InputDataError(f"days and bucket_s must be > 0, got {days} and {bucket_s}")
    now = time.time() if now is None else now
    tps = topic_partitions(consumer, topics)
    reader = RecordReader(consumer, now_s=now)
    spans = partition_spans(reader, tps)
    end = math.floor(min(now, until if until is not None else now) / bucket_s) * bucket_s
    asked = end - days * 86_400
    firsts = [s.first_ms / 1000 for s in spans.values() if s.first_ms is not None]
    # Nothing is older than the topic's first record: its bucket is complete.  A partition whose log no longer
    # starts at 0 has lost older records: buckets before its first retained one are not.
    truncated = [s.first_ms / 1000 for s in spans.values() if s.first_ms is not None and s.start > 0]
    begins = math.floor(min(firsts, default=end) / bucket_s) * bucket_s
    retained = math.ceil(max(truncated) / bucket_s) * bucket_s if truncated else begins
    start = max(asked, begins, retained)
    note = ""
    if start > asked and firsts:
        note = (
            f"Kafka retains {max(0.0, (end - start) / 86_400):.2f} of the {days:g} days asked "
            f"({'retention' if retained > begins else 'the topic'} starts at "
            f"{pd.Timestamp(start, unit='s', tz='UTC'):%Y-%m-%d %H:%M} UTC)"
        )
    if start >= end:
        empty = pd.DataFrame(
            {"ts": pd.Series(dtype=float), "records": pd.Series(dtype=int), "arrival_rate": pd.Series(dtype=float)}
        )
        return ArrivalBackfill(empty, "none", reader.fetches, start, end, note or "no complete bucket retained")
    lookup = choose_lookup(reader, spans)
    boundaries = [int(round((start + k * bucket_s) * 1000)) for k in range(int(round((end - start) / bucket_s)) + 1)]
    per_partition = lookup.offsets(boundaries, done)
    totals = [sum(offsets[k] for offsets in per_partition.values()) for k in range(len(boundaries))]
    records = [b - a for a, b in zip(totals, totals[1:])]
    rows = pd.DataFrame(
        {
            "ts": [b / 1000 for b in boundaries[1:]],
            "records": records,
            "arrival_rate": [n * samples_per_record / bucket_s for n in records],
        }
    )
    return ArrivalBackfill(rows, lookup.method, lookup.requests, start, end, note)
