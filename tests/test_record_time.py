"""One rule for record timestamps (stream.record_time), as telemetry, the controller and the trainer apply it.

Property-based: whatever stamps the lagging partitions' oldest records carry (missing, -1, 0, negative, far
in the future, or usable), the time lag is read from the usable ones only, the reading says when it is
incomplete and counts the unusable ones, and no decision takes a made-up lag for a real one.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kale_dagster.control.controller import StreamReading, completed_time_lag
from kale_dagster.model.types import PartitionOffsets
from kale_dagster.stream.record_time import MAX_AHEAD_S, Stamp, judge, usable_ms
from kale_dagster.stream.telemetry import RawOffsets, build_snapshot
from kale_dagster.trainer.ordering import ArrivalOrder

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    "stamp_ms, expected",
    [
        (None, Stamp.MISSING),
        (-1, Stamp.MISSING),  # NO_TIMESTAMP
        (0, Stamp.NOT_POSITIVE),
        (-5_000, Stamp.NOT_POSITIVE),
        (1, Stamp.ANCIENT),  # a millisecond after the epoch: a sentinel
        (int(NOW), Stamp.ANCIENT),  # epoch seconds where milliseconds belong
        (int(NOW * 1000) - 60_000, Stamp.USABLE),
        (int(NOW * 1000), Stamp.USABLE),
        (int((NOW + MAX_AHEAD_S) * 1000), Stamp.USABLE),  # clock skew between hosts
        (int((NOW + MAX_AHEAD_S + 1) * 1000), Stamp.AHEAD),
        (int((NOW + 86_400 * 365) * 1000), Stamp.AHEAD),
    ],
)
def test_the_rule(stamp_ms, expected):
    assert judge(stamp_ms, NOW) is expected
    assert (usable_ms(stamp_ms, NOW) is None) == (expected is not Stamp.USABLE)


good = st.integers(int((NOW - 86_400) * 1000), int(NOW * 1000))
bad = st.one_of(
    st.none(),
    st.just(-1),
    st.integers(-(2**40), int((NOW - 11 * 365 * 86_400) * 1000)),
    st.integers(int((NOW + MAX_AHEAD_S + 1) * 1000), int((NOW + 10**9) * 1000)),
)
partition = st.tuples(st.integers(0, 1000), st.one_of(good, bad))  # (lag in records, oldest record's stamp)


@settings(max_examples=300, deadline=None)
@given(st.lists(partition, min_size=1, max_size=8))
def test_the_time_lag_reads_only_usable_stamps(parts):
    raw = RawOffsets(
        NOW,
        tuple(PartitionOffsets(i, 1000, 1000 - lag) for i, (lag, _) in enumerate(parts)),
        ("t",) * len(parts),
        tuple(stamp for _, stamp in parts),
    )
    snap = build_snapshot(raw)
    usable = [NOW - s / 1000 for lag, s in parts if lag > 0 and usable_ms(s, NOW) is not None]
    assert snap.time_lag_s == pytest.approx(max(usable, default=0.0))
    assert 0 <= snap.time_lag_s <= 86_400 + 1  # never decades, never negative
    lagging_unusable = [s for lag, s in parts if lag > 0 and usable_ms(s, NOW) is None]
    assert snap.time_lag_complete == (not lagging_unusable)
    assert snap.unusable_stamps == sum(s is not None for s in lagging_unusable)  # a record read, its stamp bad


@pytest.mark.parametrize(
    "reading, workers_say",
    [
        # complete: as read
        (StreamReading(0.0, 100.0, 100.0, 6000.0, 30.0), ("as read", 30.0)),
        # incomplete: the backlog at the arrival rate (60 s) is more than the usable partitions' 30 s
        (StreamReading(0.0, 100.0, 100.0, 6000.0, 30.0, time_lag_complete=False), ("estimated", 60.0)),
        # incomplete, but the usable partitions already say more
        (StreamReading(0.0, 100.0, 100.0, 6000.0, 90.0, time_lag_complete=False), ("estimated", 90.0)),
        # incomplete and empty: nothing waits
        (StreamReading(0.0, 100.0, 100.0, 0.0, 0.0, time_lag_complete=False), ("as read", 0.0)),
        # incomplete with nothing arriving: no lag to decide on
        (StreamReading(0.0, 0.0, 0.0, 6000.0, 0.0, time_lag_complete=False), ("hold", None)),
    ],
)
def test_no_decision_takes_a_made_up_lag_for_a_real_one(reading, workers_say):
    completed, note = completed_time_lag(reading)
    kind, lag = workers_say
    if kind == "hold":
        assert completed is None and "unknown" in note
        return
    assert completed is not None and completed.time_lag_s == pytest.approx(lag)
    assert bool(note) == (kind == "estimated")


def test_a_partition_without_usable_stamps_neither_waits_nor_holds_the_others_back():
    order = ArrivalOrder(lead_ms=500, stall_s=2.0)
    # Partition 0 carries NO_TIMESTAMP records: were -1 read as a time, it would hold 1 and 2 back.
    assert order.polled({0: None, 1: 1_000, 2: 1_200}, [0, 1, 2], 0.0) == frozenset()
    assert order.polled({0: None, 1: 1_000, 2: 9_000}, [0, 1, 2], 0.1) == frozenset({2})  # 1 and 2 still ordered
    assert order.polled({0: 100}, [0, 1, 2], 0.2) == frozenset({1, 2})  # usable again: ordered again
