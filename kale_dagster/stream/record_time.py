"""When a record entered the topic, if its timestamp can say: one rule for telemetry, backfill and the trainer.

Kafka stamps every record (CreateTime by the producer, or LogAppendTime by the broker), but not every stamp
can stand for when the record arrived:

* missing, or -1: ``NO_TIMESTAMP``, what a pre-0.10 message format carries;
* 0 or below, or more than ten years before the reader's clock: a producer that set no time (the epoch),
  seconds written where milliseconds belong, or a corrupt stamp;
* far ahead of the reader's clock: a producer's clock or code gone wrong (skew between hosts is seconds).

Such a stamp would make a time lag of decades, or of nothing while a backlog waits.  It is excluded from
every time lag and counted, and the reading says its time lag is incomplete; backfill cannot put the
record in a time bucket and says so; the trainer does not order by it.
"""

from __future__ import annotations

from enum import Enum

#: A stamp further ahead of the reader's clock than this is not trusted.
MAX_AHEAD_S = 300.0
#: A stamp older than this, before the reader's clock, is a unit or sentinel mistake, not a time.
MAX_AGE_S = 10 * 365 * 86_400.0


class Stamp(Enum):
    """Why a record's timestamp cannot be used (``USABLE`` when it can)."""

    USABLE = "usable"
    MISSING = "missing (no timestamp: a pre-0.10 message format)"
    NOT_POSITIVE = "zero or negative"
    ANCIENT = "more than ten years before the reader's clock"
    AHEAD = f"more than {MAX_AHEAD_S:.0f} s ahead of the reader's clock"


def judge(timestamp_ms: int | None, now_s: float) -> Stamp:
    """Whether a record's timestamp (ms, as Kafka carries it) can stand for when it entered the topic."""
    if timestamp_ms is None or timestamp_ms == -1:
        return Stamp.MISSING
    if timestamp_ms <= 0:
        return Stamp.NOT_POSITIVE
    if timestamp_ms / 1000.0 < now_s - MAX_AGE_S:
        return Stamp.ANCIENT
    if timestamp_ms / 1000.0 > now_s + MAX_AHEAD_S:
        return Stamp.AHEAD
    return Stamp.USABLE


def usable_ms(timestamp_ms: int | None, now_s: float) -> int | None:
    """The timestamp when it is usable, else None."""
    return timestamp_ms if judge(timestamp_ms, now_s) is Stamp.USABLE else None
