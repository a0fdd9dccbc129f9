"""Throughput model: the paper's worked example, NNLS fitting, peak handling."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kale_dagster import InputDataError, KaleConfigError, ThroughputModel
from kale_dagster.model.throughput import estimate_throughput

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


# Each refusal, word for word: the message is what a user reads to fix the call.
@pytest.mark.parametrize(
    "call, error, message",
    [
        (
            lambda: ThroughputModel("sync", (1, 1, 1, 1), global_batch=0.0),
            KaleConfigError,
            "global_batch: the synchronous form needs the global batch size M > 0",
        ),
        (
            lambda: ThroughputModel("async", (0.0, 0.0, 0.0)),
            KaleConfigError,
            "theta: all coefficients are zero, so throughput would be infinite",
        ),
        (
            lambda: ThroughputModel("async", (1.0, float("inf"), 0.0)),
            KaleConfigError,
            "theta: coefficients must be finite and non-negative, got (1.0, inf, 0.0)",
        ),
        (
            lambda: ThroughputModel("sync", (1, 1, 1), global_batch=8.0),
            KaleConfigError,
            "theta: the sync form takes 4 coefficients, got 3",
        ),
        (
            lambda: ThroughputModel.fit([1, 2, 3], [1, 2, 3], form="poly"),
            KaleConfigError,  # type: ignore[arg-type]
            "form: must be 'sync' or 'async', got 'poly'",
        ),
        (
            lambda: ThroughputModel.fit([1, 2, 3], [1, 2], form="async"),
            InputDataError,
            "workers and rates must be equal-length lists, got (3,) and (2,)",
        ),
        (
            lambda: ThroughputModel.fit([[1, 2, 3]], [[1, 2, 3]], form="async"),
            InputDataError,
            "workers and rates must be equal-length lists, got (1, 3) and (1, 3)",
        ),
        (
            lambda: ThroughputModel.fit([1, 2, 3], [1.0, float("nan"), 3.0], form="async"),
            InputDataError,
            "measurements need workers >= 1 and a finite rate > 0 samples/s",
        ),
        (
            lambda: ThroughputModel.fit([1, 2, float("inf")], [1.0, 2.0, 3.0], form="async"),
            InputDataError,
            "measurements need workers >= 1 and a finite rate > 0 samples/s",
        ),
        (
            lambda: ThroughputModel.fit([0.5, 2, 3], [1.0, 2.0, 3.0], form="async"),
            InputDataError,
            "measurements need workers >= 1 and a finite rate > 0 samples/s",
        ),
        (
            lambda: ThroughputModel.fit([1, 2, 3], [1.0, 0.0, 3.0], form="async"),
            InputDataError,
            "measurements need workers >= 1 and a finite rate > 0 samples/s",
        ),
        (
            lambda: ThroughputModel.fit([1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0], form="sync"),
            KaleConfigError,
            "global_batch: fitting the synchronous form needs the global batch size M > 0",
        ),
        (
            lambda: ThroughputModel.fit([1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0], form="sync", global_batch=-8.0),
            KaleConfigError,
            "global_batch: fitting the synchronous form needs the global batch size M > 0",
        ),
        (
            lambda: ThroughputModel.fit([1, 2, 2], [1.0, 2.0, 2.0], form="async"),
            InputDataError,
            "the async model has 3 coefficients and needs measurements at >= 3 distinct worker counts; got 2 (1, 2). "
            "Run the trainer at more parallelism levels first.",
        ),
        (lambda: PAPER.peak_workers(0), KaleConfigError, "max_workers: must be >= 1, got 0"),
        (
            lambda: ThroughputModel.linear(10.0).min_workers_for(5.0, max_workers=4, min_workers=5),
            KaleConfigError,
            "min_workers: must be in [0, max_workers=4], got 5",
        ),
        (
            lambda: ThroughputModel.linear(10.0).min_workers_for(5.0, max_workers=4, min_workers=-1),
            KaleConfigError,
            "min_workers: must be in [0, max_workers=4], got -1",
        ),
    ],
)
def test_each_refusal_says_what_to_fix(call, error, message):
    with pytest.raises(error) as err:
        call()
    assert str(err.value) == message


@pytest.mark.parametrize("batch", [0.5, 1.0])
def test_any_positive_global_batch_is_a_batch(batch):
    assert ThroughputModel("sync", (1, 1, 1, 1), global_batch=batch).predict(1) == pytest.approx(batch / 4)
    fitted = ThroughputModel.fit([1, 2, 3, 4], [0.1, 0.15, 0.17, 0.18], form="sync", global_batch=batch)
    assert fitted.global_batch == batch


def test_a_curve_with_one_coefficient_left_is_a_curve():
    # Coefficients summing to 1 are as good as any others.
    assert ThroughputModel.asynchronous((1.0, 0.0, 0.0)).predict(3) == pytest.approx(3.0)


def test_a_linear_model_serves_its_rate_per_worker():
    model = ThroughputModel.linear(250.0)
    assert model.predict(4) == pytest.approx(1000.0)
    assert model.theta == (1 / 250.0, 0.0, 0.0)


@pytest.mark.parametrize(
    "model, text",
    [
        (PAPER, "F(w) = 16384 / (t0 + t1/w + t2/w^2 + t3*w); t0=0.00035, t1=2.573, t2=0.9824, t3=0.02786"),
        (ThroughputModel.asynchronous((0.5, 0.25, 0.0)), "F(w) = w / (t0 + t1/w + t2*w); t0=0.5, t1=0.25, t2=0"),
    ],
)
def test_describe_writes_the_curve_out(model, text):
    assert model.describe() == text


def test_each_form_evaluates_its_own_curve():
    sync = ThroughputModel.sync(100.0, (1.0, 2.0, 3.0, 4.0))
    for w in (1, 2, 5):
        assert sync.iteration_time(w)[0] == pytest.approx(1 + 2 / w + 3 / w**2 + 4 * w)
        assert sync.predict(w) == pytest.approx(100.0 / (1 + 2 / w + 3 / w**2 + 4 * w))
    asynchronous = ThroughputModel.asynchronous((1.0, 2.0, 3.0))
    for w in (1, 2, 5):
        assert asynchronous.predict(w) == pytest.approx(w / (1 + 2 / w + 3 * w))


@pytest.mark.parametrize("workers", [0, 1, 7, 40, 4095, 4096, 5000])
def test_every_way_of_asking_gives_the_same_throughput(workers):
    model = ThroughputModel.asynchronous((0.001, 0.0005, 0.00001))
    exact = 0.0 if workers == 0 else workers / (0.001 + 0.0005 / workers + 0.00001 * workers)
    assert model.predict(workers) == pytest.approx(exact)
    assert model.predict(float(workers)) == pytest.approx(exact)
    assert model.predict(np.int64(workers)) == pytest.approx(exact)
    assert model.predict(np.array([workers]))[0] == pytest.approx(exact)
    assert model.capacities(workers)[workers] == pytest.approx(exact)
    assert isinstance(model.predict(workers), float) and isinstance(model.predict(float(workers)), float)


def test_the_cached_table_grows_to_what_is_asked_and_stays_read_only():
    model = ThroughputModel.linear(10.0)
    assert len(model.capacities(5)) == 33  # one small table for the common counts
    assert model.predict(33) == pytest.approx(330.0)  # past the table: it grows
    grown = model.capacities(40)
    assert len(grown) == 66 and grown[40] == pytest.approx(400.0)  # doubled, not one count at a time
    assert len(model.capacities(200)) == 201
    with pytest.raises(ValueError):
        grown[1] = 0.0
    assert model.predict(2.5) == pytest.approx(25.0)  # a fractional count is evaluated, not looked up


def test_the_smallest_count_that_serves_a_rate():
    model = ThroughputModel.linear(10.0)
    assert model.min_workers_for(5.0, max_workers=8) == 1  # the default floor is one worker
    assert model.min_workers_for(0.0, max_workers=8) == 1
    assert model.min_workers_for(0.0, max_workers=8, min_workers=0) == 0  # scale to zero when nothing comes
    assert model.min_workers_for(35.0, max_workers=8) == 4
    assert model.min_workers_for(80.0, max_workers=8) == 8  # F(8) = 80: the last count serves it
    assert model.min_workers_for(81.0, max_workers=8) == 8  # none suffices: the peak
    assert model.min_workers_for(5.0, max_workers=8, min_workers=8) == 8  # the floor is the peak
    assert list(model.min_workers_for_each(np.array([0.0, 15.0, 25.0, 1e9]), 8, 2)) == [2, 2, 3, 8]
    assert model.min_workers_for(15.0, max_workers=8, min_workers=2) == 2  # its own cache entry
    assert model.peak_workers(8) == 8 and model.peak_workers(3) == 3


def test_a_dict_without_measurements_is_a_declared_curve():
    data = {"form": "async", "theta": [1.0, 0.0, 0.0]}
    model = ThroughputModel.from_dict(data)
    assert model.samples == 0 and model.fit_mape is None and model.holdout_mape is None


def test_fit_errors_are_percentages_of_each_measurement():
    # An exact sync curve measured with +10% at one count: its error, in percent, is what the fit misses there.
    fitted = ThroughputModel.fit([1, 2, 3, 4, 5], [9.0, 16.0, 20.0, 22.0, 30.0], form="async")
    predicted = np.asarray(fitted.predict(np.array([1, 2, 3, 4, 5])))
    actual = np.array([9.0, 16.0, 20.0, 22.0, 30.0])
    assert fitted.fit_mape == pytest.approx(float(np.mean(np.abs(predicted - actual) / actual) * 100))
    held_out = []
    for left_out in range(5):
        mask = np.arange(5) != left_out
        sub = ThroughputModel.fit(np.arange(1, 6)[mask], actual[mask], form="async")
        held_out.append(abs(sub.predict(left_out + 1) - actual[left_out]) / actual[left_out])
    assert fitted.holdout_mape == pytest.approx(float(np.mean(held_out) * 100))


def test_with_just_enough_counts_there_is_no_holdout_error():
    fitted = ThroughputModel.fit([1, 2, 3], [9.0, 16.0, 20.0], form="async")
    assert fitted.holdout_mape is None and fitted.fit_mape is not None and fitted.samples == 3
    assert fitted.global_batch is None


@pytest.mark.parametrize(
    "workers, rates, form, batch, source",
    [
        ([1, 2], [100.0, 190.0], "async", None, "prior"),
        ([1, 2, 4], [100.0, 190.0, 350.0], "async", None, "fitted"),
        ([1, 2, 4], [100.0, 190.0, 350.0], "sync", 256.0, "prior"),
        ([1, 2, 4, 8], [100.0, 190.0, 350.0, 600.0], "sync", 256.0, "fitted"),
    ],
)
def test_the_prior_serves_until_the_measurements_can_be_fitted(workers, rates, form, batch, source):
    prior = ThroughputModel.linear(100.0)
    model, said = estimate_throughput(workers, rates, prior, form=form, global_batch=batch)
    assert said == source
    if source == "prior":
        assert model is prior
    else:
        assert model.form == form and model.global_batch == batch and model.samples == len(workers)


def test_the_estimate_fits_the_asynchronous_form_unless_told():
    model, _ = estimate_throughput([1, 2, 4], [100.0, 190.0, 350.0], ThroughputModel.linear(100.0))
    assert model.form == "async"


def test_a_window_with_a_stalled_member_is_not_fitted():
    # 80/s per worker; at 3 workers a member stalled in three windows of seven.
    workers = [1] * 4 + [2] * 3 + [3] * 7
    rates = [80.0] * 4 + [160.0] * 3 + [240.0] * 4 + [80.0] * 3
    model, source = estimate_throughput(workers, rates, ThroughputModel.linear(1.0))
    assert source == "fitted" and model.samples == 11
    assert [round(float(model.predict(w))) for w in (1, 2, 3)] == [80, 160, 240]
    # Fitted on every window, the stalled ones bend the curve flat above 2.
    assert float(ThroughputModel.fit(workers, rates, form="async").predict(3)) < 0.8 * 240


def test_measurement_noise_is_fitted_whole():
    # The simulator's 5% noise (and any like it) leaves out nothing: the fit is the fit of every measurement.
    rng = np.random.default_rng(0)
    workers = np.repeat([1, 2, 3, 4], 50)
    truth = ThroughputModel.asynchronous((0.0005, 0.002, 0.00001))
    rates = truth.predict(workers) * (1 + 0.05 * rng.standard_normal(len(workers)))
    model, _ = estimate_throughput(workers, rates, truth)
    assert model == ThroughputModel.fit(workers, rates, form="async")
