"""The planner's lag projection is the simulator's FIFO backlog, played in closed form.

Reference: a copy of the starting backlog stepped tick by tick with ``FifoBacklog.step``, the
simulator's own model; the projection must give the same figures on any input.
"""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kale_dagster.model.backlog import FifoBacklog
from kale_dagster.model.projection import Option, project_options
from kale_dagster.model.throughput import ThroughputModel


def stepped(start_args, pre_steps, rates, step_s, capacity, slo_s, downtime_s, tick_s):
    """(accumulated lag-min, max lag s, violation min, whether a tick's lag sat on the SLO) by stepping FifoBacklog,
    as the simulator does."""
    queue = _start(start_args, pre_steps)
    acc = max_lag = violation = 0.0
    on_slo = False
    t = 0.0
    while t < len(rates) * step_s - 1e-9:
        rate = rates[min(int(t // step_s), len(rates) - 1)]
        queue.step(tick_s, rate * tick_s, 0.0 if t < downtime_s else capacity)
        lag = queue.time_lag()
        acc += lag / 60.0 * (tick_s / 60.0)
        max_lag = max(max_lag, lag)
        violation += tick_s / 60.0 if lag > slo_s else 0.0
        on_slo = on_slo or abs(lag - slo_s) < 1e-3
        t += tick_s
    return acc, max_lag, violation, on_slo


def _start(start_args, pre_steps):
    """A backlog as observed, then a few steps of history so it holds several partly consumed cohorts."""
    now, backlog, lag = start_args
    queue = FifoBacklog.from_observation(now, backlog, lag)
    for seconds, arrivals, capacity in pre_steps:
        queue.step(seconds, arrivals, capacity)
    return queue


@settings(max_examples=300, deadline=None)
@given(
    start=st.tuples(st.floats(0, 1e6), st.sampled_from([0.0, 1.0, 5e3, 2e5]), st.floats(0, 3600)),
    pre=st.lists(
        st.tuples(
            st.sampled_from([15.0, 60.0]), st.sampled_from([0.0, 10.0, 3e3]), st.sampled_from([0.0, 20.0, 500.0])
        ),
        max_size=4,
    ),
    rates=st.lists(st.sampled_from([0.0, 0.5, 20.0, 100.0, 333.3, 1500.0]), min_size=1, max_size=14),
    capacity=st.sampled_from([0.0, 10.0, 99.0, 400.0, 2500.0]),
    downtime=st.sampled_from([0.0, 60.0, 450.0, 600.0, 5000.0]),
    tick=st.sampled_from([60.0, 300.0, 450.0]),
)
# Found by hypothesis: samples that are never consumed are exactly the SLO's age at one tick, a rounding error
# either side of it in each model, while the maximum lag is far above.
@example(start=(0.99999, 0.0, 0.0), pre=[], rates=[0.0, 0.0, 0.5, 0.0, 0.0], capacity=0.0, downtime=0.0, tick=60.0)
def test_projection_equals_stepping_the_fifo_backlog(start, pre, rates, capacity, downtime, tick):
    step_s, slo_s = 600.0, 1200.0
    options = [Option(3, capacity, downtime), Option(1, capacity / 3, 0.0), Option(5, capacity * 2, downtime / 2)]
    together = project_options(_start(start, pre), np.array(rates), step_s, options, slo_s, tick_s=tick)
    # Each option alone gives what it gives beside the others.
    assert together == [
        project_options(_start(start, pre), np.array(rates), step_s, [o], slo_s, tick_s=tick)[0] for o in options
    ]
    p = together[0]
    acc, max_lag, violation, on_slo = stepped(start, pre, rates, step_s, capacity, slo_s, downtime, tick)
    assert p.accumulated_lag_min == pytest.approx(acc, rel=1e-7, abs=1e-6)
    assert p.max_lag_s == pytest.approx(max_lag, rel=1e-7, abs=1e-6)
    assert p.violation_min == pytest.approx(violation, abs=1e-9) or on_slo  # a lag on the SLO may round either way
    assert p.gpu_minutes == 3 * len(rates) * step_s / 60.0


def test_projection_of_a_restart_that_meets_a_backlog():
    """Worked by hand: 1,000 samples waiting for 10 minutes, a 10-minute restart, then 4/s against 2/s arrivals."""
    start = FifoBacklog.from_observation(now=6000.0, backlog=1000.0, time_lag_s=600.0)
    (p,) = project_options(start, np.array([2.0, 2.0, 2.0]), 600.0, [Option(1, 4.0, 600.0)], 1200.0, tick_s=600.0)
    # Tick 1 (restart): nothing consumed, lag 1,200 s.  Tick 2: 2,400 consumed of 3,400: the oldest left arrived
    # 200 / 1,200 of the way into tick 2, 500 s before its end.  Tick 3: 2,200 waiting, 2,400 consumed: caught up.
    assert p.max_lag_s == pytest.approx(1200.0)
    assert p.accumulated_lag_min == pytest.approx(20.0 * 10.0 + 500.0 / 60.0 * 10.0)
    assert p.violation_min == 0.0


@pytest.mark.parametrize(
    "model",
    [
        ThroughputModel.asynchronous((1e-3, 0.0, 2e-6)),
        ThroughputModel.sync(16384, (0.00035, 2.5726, 0.9824, 0.02786)),
        ThroughputModel.linear(150.0),
    ],
    ids=["async", "sync (peaks at 10)", "linear"],
)
@pytest.mark.parametrize("min_workers,max_workers", [(1, 32), (0, 6), (12, 16), (3, 3)])
def test_min_workers_for_each_equals_the_scan(model, min_workers, max_workers):
    """Each rate's count is the first w in [min_workers, peak] that covers it, as a scan over F(w) finds it."""
    cap = model.peak_workers(max_workers)
    rates = np.concatenate(
        [[0.0, -1.0], np.linspace(1.0, 1.2 * float(model.predict(cap)), 97), model.predict(np.arange(1, cap + 1))]
    )
    for rate, got in zip(rates, model.min_workers_for_each(rates, max_workers, min_workers)):
        if rate <= 0:
            want = min_workers
        elif max(min_workers, 1) >= cap:
            want = max(min_workers, 1)
        else:
            # F(w) of a count is the model's table (predict); evaluating one count alone may differ in the last bit.
            want = next((w for w in range(max(min_workers, 1), cap + 1) if model.predict(w) >= rate), cap)
        assert got == want == model.min_workers_for(rate, max_workers, min_workers), rate


def test_cached_capacities_are_the_curve():
    model = ThroughputModel.sync(16384, (0.00035, 2.5726, 0.9824, 0.02786))
    assert model.predict(0) == 0.0
    assert [model.predict(w) for w in (1, 10, 100)] == [model._evaluate(w) for w in (1, 10, 100)]
    assert model.predict(2.5) == model._evaluate(2.5)
    assert list(model.predict(np.array([1, 2]))) == [model._evaluate(1), model._evaluate(2)]
    with pytest.raises(ValueError):
        model.capacities(4)[1] = 0.0  # read-only: a caller cannot corrupt the cache
