"""The paper's Algorithm 1, our variant of it, and the properties we rely on."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kale_dagster import KaleConfigError, stabilize


@pytest.mark.parametrize(
    "plan, step, rho, tau, expected",
    [
        ([4, 4, 5, 6, 6, 6], 10, 1, 15, [4, 4, 6, 6, 6, 6]),  # the paper's example
        ([4, 4, 5, 6, 6, 6], 10, 1, 10, [4, 4, 5, 6, 6, 6]),  # 10 min is not shorter than tau
        ([6, 6, 4, 6, 6], 10, 1, 15, [6, 6, 6, 6, 6]),  # short dip filled
        ([6, 6, 4, 4, 6], 10, 1, 15, [6, 6, 4, 4, 6]),  # 20-min dip kept
        ([4, 4, 8, 4, 4], 10, 1, 15, [4, 4, 8, 4, 4]),  # short peak kept: never lower capacity
        ([8, 7, 8, 8], 10, 2, 0, [8, 8, 8, 8]),  # dip smaller than rho held
        ([8, 6, 6, 6], 10, 2, 0, [8, 6, 6, 6]),  # dip of rho made
        ([5, 5, 3], 10, 1, 60, [5, 5, 3]),  # last stretch runs past the horizon
        ([3, 5, 4, 7, 7, 7], 10, 1, 25, [3, 7, 7, 7, 7, 7]),  # cascading short levels
        ([], 10, 1, 10, []),
    ],
)
def test_table(plan, step, rho, tau, expected):
    assert stabilize(plan, step, rho=rho, tau_minutes=tau) == expected


@pytest.mark.parametrize(
    "plan, rho, tau, paper, ours",
    [
        # The paper's rule and ours, side by side (10-minute steps).
        ([4, 4, 5, 6, 6, 6], 1, 15, [4, 4, 6, 6, 6, 6], [4, 4, 6, 6, 6, 6]),  # the paper's example: both agree
        ([4, 4, 8, 4, 4], 1, 15, [4, 4, 4, 4, 4], [4, 4, 8, 4, 4]),  # a short peak: the paper lowers it, we keep it
        ([6, 6, 4, 6, 6], 1, 15, [6, 6, 6, 6, 6], [6, 6, 6, 6, 6]),  # a short dip: both fill it
        ([8, 7, 8, 8], 2, 0, [8, 7, 8, 8], [8, 8, 8, 8]),  # a dip under rho: the paper leaves it, we hold the level
        # One pass: the short 5 takes its higher neighbour 4, and the 20-minute level that makes is not judged again;
        # ours raises every short level until none is left.
        ([3, 5, 4, 7, 7, 7], 1, 25, [3, 4, 4, 7, 7, 7], [3, 7, 7, 7, 7, 7]),
        ([5, 5, 3], 1, 60, [5, 5, 3], [5, 5, 3]),  # the last stretch runs past the horizon: not judged
        # A level lasts while each step is within rho of its first (8, 9): 20 minutes, short, so the paper lowers
        # it to its higher neighbour, 4; ours keeps a short peak.
        ([4, 4, 8, 9, 4], 2, 25, [4, 4, 4, 4, 4], [4, 4, 9, 9, 4]),
    ],
)
def test_paper_mode_against_ours(plan, rho, tau, paper, ours):
    assert stabilize(plan, 10, rho=rho, tau_minutes=tau, mode="paper") == paper
    assert stabilize(plan, 10, rho=rho, tau_minutes=tau) == ours


def test_bad_settings_name_the_field():
    with pytest.raises(KaleConfigError, match="stabilizer"):
        stabilize([1, 2], 10, mode="exact")
    with pytest.raises(KaleConfigError, match="rho"):
        stabilize([1, 2], 10, rho=0)
    with pytest.raises(KaleConfigError, match="step_minutes"):
        stabilize([1, 2], 0)


@settings(max_examples=200, deadline=None)
@given(plan=st.lists(st.integers(0, 20), max_size=24), tau=st.sampled_from([0, 10, 15, 30, 60]), rho=st.integers(1, 3))
def test_never_lowers_capacity_and_removes_short_levels(plan, tau, rho):
    out = stabilize(plan, 10, rho=rho, tau_minutes=tau)
    assert len(out) == len(plan)
    assert all(o >= p for o, p in zip(out, plan))
    # Every inner level that is a dip below both neighbours lasts at least tau.
    runs = []
    for v in out:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    for k in range(1, len(runs) - 1):
        value, length = runs[k]
        if value < runs[k - 1][0] and value < runs[k + 1][0]:
            assert length * 10 >= tau
