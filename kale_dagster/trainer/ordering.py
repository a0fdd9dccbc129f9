"""Arrival order across a rank's partitions: which partitions to hold back so a backlog is trained oldest first.

Why: the lag the SLO is written on is the age of the oldest unconsumed sample over all partitions, and
kafka-python hands out one partition's fetched records before the next one's.  A rank catching up after a
restart therefore trained its partitions one after another, and the last one's oldest sample went on aging
for the whole catch-up: in a live run the lag peaked at 17.6 minutes where the same backlog read as one
queue peaked at 12.7.  Holding back (pausing) the partitions whose delivered records are ahead of the
others' lets the laggards catch up first.  kafka-python parks a paused partition's fetched data and hands
it out on resume (KAFKA-7548), so pausing fetches nothing twice.

Pure: the worker reports what each poll delivered and which partitions still have records to read; this
says which to pause.  Times are record timestamps (ms, as Kafka stamps them) and a monotonic clock (s).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass
class ArrivalOrder:
    """Keeps every backlogged partition of a rank within ``lead_ms`` of the one furthest behind.

    ``lead_ms``: how far ahead a partition may run.  Offsets reach Kafka only at checkpoints, so order finer
    than a checkpoint interval cannot show in the lag; a lead also keeps a group that keeps up from pausing
    partitions over one fetch's jitter.
    ``stall_s``: when polls deliver nothing this long while partitions are held back, the partitions that
    were free to deliver and did not (a leader unreachable, say) stop holding the others back until they
    deliver again, so one bad partition cannot starve the rank.
    """

    lead_ms: int
    stall_s: float
    delivered_ms: dict[int, int] = field(default_factory=dict)  # newest record timestamp delivered, per partition
    held: frozenset[int] = frozenset()
    stalled: frozenset[int] = frozenset()
    empty_since_s: float | None = None  # start of the current run of polls that delivered nothing
    untimed: frozenset[int] = frozenset()  # partitions whose latest records carry no usable timestamp

    def __post_init__(self):
        if self.lead_ms < 0 or self.stall_s <= 0:
            raise ValueError(f"ArrivalOrder needs lead_ms >= 0 and stall_s > 0, got {self.lead_ms} and {self.stall_s}")

    def polled(self, delivered: Mapping[int, int | None], backlogged: Iterable[int], now_s: float) -> frozenset[int]:
        """After a poll: ``delivered`` maps each partition it handed out records of to the newest record's
        timestamp, None where it carries none that can be used (``stream.record_time``); ``backlogged`` are the
        partitions that still have records to read (position below the high watermark, or a high watermark not
        yet known).  Returns the partitions to pause now.

        A backlogged partition that has delivered nothing yet is the furthest behind: its records are as old
        as the backlog.  One whose records tell no time can be put in no order: it neither waits nor makes the
        others wait, until its records carry usable times again."""
        untimed = {p for p, ts in delivered.items() if ts is None}
        self.untimed = frozenset((self.untimed - delivered.keys()) | untimed)
        for p, ts in delivered.items():
            if ts is None:
                continue
            self.delivered_ms[p] = max(self.delivered_ms.get(p, ts), ts)
        if delivered:
            self.empty_since_s = None
            self.stalled = self.stalled - delivered.keys()
        elif self.empty_since_s is None:
            self.empty_since_s = now_s
        backlogged = set(backlogged)
        if self.held and self.empty_since_s is not None and now_s - self.empty_since_s >= self.stall_s:
            self.stalled = self.stalled | (backlogged - self.held)
        live = backlogged - self.stalled - self.untimed
        if not live:
            self.held = frozenset()
            return self.held
        frontier = min(self.delivered_ms.get(p, -1) for p in live)
        self.held = frozenset(p for p in live if self.delivered_ms.get(p, -1) > frontier + self.lead_ms)
        return self.held
