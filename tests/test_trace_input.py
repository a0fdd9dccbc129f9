"""Traces at the door (forecast.history): epoch units told apart by magnitude or refused naming the unit
assumed, one rule for values (finite and >= 0; an empty cell names its line), and no grid larger than a bound."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kale_dagster.errors import InputDataError, KaleConfigError
from kale_dagster.forecast.history import MAX_GRID_POINTS, prepare_history, read_trace_csv
from kale_dagster.sim.trace import synth_trace

UNITS = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}


def _csv(tmp_path, stamps, values) -> str:
    path = tmp_path / "t.csv"
    pd.DataFrame({"timestamp": stamps, "value": values}).to_csv(path, index=False)
    return str(path)


@settings(max_examples=60, deadline=None)
@given(
    start=st.integers(int(pd.Timestamp("1995-01-01").timestamp()), int(pd.Timestamp("2090-01-01").timestamp())).map(
        lambda s: s - s % 1800  # on the grid every step here divides: the history is put on its step's grid
    ),
    step=st.sampled_from([1, 60, 300, 1800]),
    unit=st.sampled_from(sorted(UNITS)),
)
def test_epoch_timestamps_in_any_unit_read_as_the_same_times(tmp_path_factory, start, step, unit):
    path = _csv(tmp_path_factory.mktemp("t"), [(start + i * step) * UNITS[unit] for i in range(20)], [step] * 20)
    history = read_trace_csv(path)
    assert history["timestamp"].iloc[0] == pd.Timestamp(start, unit="s", tz="UTC")
    assert (history["timestamp"].diff().dropna() == pd.Timedelta(seconds=step)).all()
    assert history["rate"].eq(1.0).all()  # a value per interval over its step: 1/s


@pytest.mark.parametrize(
    "stamps, says",
    [
        ([5, 65, 125], "read as epoch s"),  # seconds after 1970: not a plausible trace
        ([4_200_000_000_000, 4_200_000_060_000], "read as epoch ms"),  # milliseconds in 2103
        ([1.7e9, float("inf")], "must be finite numbers"),  # pandas reads inf in a CSV as a number: refused too
    ],
)
def test_implausible_epochs_are_refused_naming_the_unit_assumed(tmp_path, stamps, says):
    with pytest.raises(InputDataError) as err:
        read_trace_csv(_csv(tmp_path, stamps, [1.0] * len(stamps)))
    assert str(tmp_path / "t.csv") in str(err.value)
    assert "\n" not in str(err.value) and says in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "values, says",
    [
        ([1.0, float("nan"), 1.0], "line 3"),  # an empty cell: the line to fix
        ([1.0, -1.0, 1.0], ">= 0"),
        ([1.0, float("inf"), 1.0], "finite"),
    ],
)
def test_values_follow_one_rule(tmp_path, values, says):
    with pytest.raises(InputDataError, match=says):
        read_trace_csv(_csv(tmp_path, ["2024-01-01T00:00:00Z", "2024-01-01T00:01:00Z", "2024-01-01T00:02:00Z"], values))


def test_a_grid_past_the_bound_is_refused_before_it_is_built():
    stamps = pd.to_datetime(["2024-01-01T00:00:00Z", "2024-01-01T00:00:01Z", "2026-01-01T00:00:00Z"], utc=True)
    frame = pd.DataFrame({"timestamp": stamps, "rate": [1.0, 1.0, 1.0]})
    with pytest.raises(InputDataError, match=f"over the {MAX_GRID_POINTS:,}"):
        prepare_history(frame)


def test_a_synthetic_trace_is_bounded_by_the_grid_a_history_may_have():
    with pytest.raises(KaleConfigError, match=f"over the {MAX_GRID_POINTS:,} a trace may have"):
        synth_trace(days=367, step_s=1.0)
