"""Throughput model: the paper's worked example, NNLS fitting, peak handling."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kale_dagster import InputDataError, KaleConfigError, ThroughputModel

PAPER = ThroughputModel.sync(16384, (0.00035, 2.5726, 0.9824, 0.02786))


def test_paper_worked_example():
    assert PAPER.predict(10) == pytest.approx(30005, abs=1)
    assert PAPER.predict(12) == pytest.approx(29474, abs=1)
    assert PAPER.peak_workers(32) == 10
    assert PAPER.min_workers_for(30_000, max_workers=32) == 10


def test_never_more_workers_than_the_peak():
    # 31,000/s is beyond the peak (30,005 at 10): more workers would be slower.
    assert PAPER.min_workers_for(31_000, max_workers=32) == 10
    assert PAPER.min_workers_for(31_000, max_workers=8) == 8


@pytest.mark.parametrize(
    "form, truth, batch",
    [
        ("sync", (0.00035, 2.5726, 0.9824, 0.02786), 16384.0),
        ("async", (0.0005, 0.002, 0.00001), None),
    ],
)
def test_fit_recovers_known_curve(form, truth, batch):
    model = ThroughputModel(form, truth, global_batch=batch)
    workers = np.array([1, 2, 4, 6, 8, 12, 16])
    rates = model.predict(workers)
    fitted = ThroughputModel.fit(workers, rates, form=form, global_batch=batch)
    assert np.allclose(fitted.predict(workers), rates, rtol=1e-6)
    assert fitted.fit_mape < 1e-4
    assert fitted.holdout_mape is not None and fitted.holdout_mape < 1e-3


def test_fit_reports_holdout_error_on_noisy_measurements():
    rng = np.random.default_rng(7)
    workers = np.repeat([1, 2, 4, 8, 12, 16], 3)
    rates = PAPER.predict(workers) * rng.normal(1.0, 0.03, size=len(workers))
    fitted = ThroughputModel.fit(workers, rates, global_batch=16384)
    assert 0.5 < fitted.fit_mape < 6
    assert fitted.holdout_mape >= fitted.fit_mape * 0.5
    assert all(t >= 0 for t in fitted.theta)


def test_fit_refuses_too_few_worker_counts():
    with pytest.raises(InputDataError, match="distinct worker counts; got 3"):
        ThroughputModel.fit([1, 2, 4, 4], [100, 190, 350, 360], global_batch=256)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(form="sync", theta=(1, 1, 1, 1)), "global_batch"),
        (dict(form="async", theta=(1, 1)), "theta"),
        (dict(form="async", theta=(-1, 1, 1)), "theta"),
        (dict(form="poly", theta=(1,)), "form"),
    ],
)
def test_bad_models_name_the_field(kwargs, field):
    with pytest.raises(KaleConfigError) as err:
        ThroughputModel(**kwargs)
    assert err.value.field == field


def test_round_trip_dict():
    assert ThroughputModel.from_dict(PAPER.to_dict()) == PAPER
    fitted = ThroughputModel.fit([1, 2, 4, 8, 16], [900, 1700, 3100, 5200, 7600], form="async")
    assert fitted.fit_mape is not None and fitted.holdout_mape is not None and fitted.samples == 5
    assert ThroughputModel.from_dict(fitted.to_dict()) == fitted  # what it was fitted on, and how well, too


@pytest.mark.parametrize("rate", [0.0, -1.0])
def test_a_linear_model_needs_a_positive_rate(rate):
    with pytest.raises(KaleConfigError, match="per_worker_rate: must be > 0"):
        ThroughputModel.linear(rate)


@settings(max_examples=60, deadline=None)
@given(a=st.floats(0, 40_000), b=st.floats(0, 40_000), lo=st.integers(0, 6), hi=st.integers(6, 32))
def test_min_workers_is_monotone_bounded_and_below_peak(a, b, lo, hi):
    small, large = sorted((a, b))
    w_small = PAPER.min_workers_for(small, max_workers=hi, min_workers=lo)
    w_large = PAPER.min_workers_for(large, max_workers=hi, min_workers=lo)
    assert w_small <= w_large
    assert lo <= w_small and w_large <= max(hi, lo)
    assert w_large <= max(PAPER.peak_workers(hi), lo)
