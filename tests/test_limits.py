"""A pipeline's limits and the declared field rules: table tests, one row per input, success or failure."""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from kale_dagster import KaleConfigError, Limits
from kale_dagster.cli.declared import add_flags, from_flags
from kale_dagster.model.limits import MAX_WORKERS


@pytest.mark.parametrize(
    "kwargs, fields",
    [
        ({}, []),
        ({"min_workers": 2, "max_workers": 2}, []),
        ({"max_workers": MAX_WORKERS}, []),
        ({"slo_minutes": 0.5, "restart_minutes": 0}, []),
        ({"min_workers": 0}, []),
        ({"min_workers": 0, "activation_lag": 500}, []),
        ({"min_workers": -1}, ["min_workers"]),
        ({"activation_lag": 500}, ["activation_lag"]),  # scale-to-zero's threshold without min_workers 0
        ({"min_workers": 0, "activation_lag": -1}, ["activation_lag"]),
        ({"max_workers": 0}, ["max_workers"]),
        ({"max_workers": MAX_WORKERS + 1}, ["max_workers"]),
        ({"max_workers": 10**9}, ["max_workers"]),
        ({"max_workers": 8.0}, ["max_workers"]),
        ({"max_workers": True}, ["max_workers"]),
        ({"max_workers": "8"}, ["max_workers"]),
        ({"min_workers": 5, "max_workers": 4}, ["min_workers"]),
        ({"slo_minutes": 0}, ["slo_minutes"]),
        ({"slo_minutes": float("nan")}, ["slo_minutes"]),
        ({"slo_minutes": float("inf")}, ["slo_minutes"]),
        ({"restart_minutes": -1}, ["restart_minutes"]),
        ({"min_workers": 8, "max_workers": 32, "workers_per_pod": 8}, []),
        ({"min_workers": 0, "max_workers": 8, "workers_per_pod": 8}, []),
        ({"max_workers": 32, "workers_per_pod": 8}, ["min_workers"]),  # the default min_workers 1 is no whole pod
        ({"min_workers": 8, "max_workers": 36, "workers_per_pod": 8}, ["max_workers"]),
        ({"min_workers": 4, "max_workers": 12, "workers_per_pod": 8}, ["min_workers", "max_workers"]),
        ({"workers_per_pod": 0}, ["workers_per_pod"]),
        ({"workers_per_pod": 65, "max_workers": 65, "min_workers": 0}, ["workers_per_pod"]),
        # Every broken rule at once, in the declaration's order.
        (
            {"min_workers": -1, "max_workers": -1, "slo_minutes": -5, "restart_minutes": float("nan")},
            ["min_workers", "max_workers", "slo_minutes", "restart_minutes"],
        ),
    ],
)
def test_limits(kwargs, fields):
    if not fields:
        limits = Limits(**kwargs)
        assert limits.slo_s == limits.slo_minutes * 60 and limits.restart_s == limits.restart_minutes * 60
        return
    with pytest.raises(KaleConfigError) as err:
        Limits(**kwargs)
    assert [e.field for e in err.value.errors] == fields
    assert "\n" not in str(err.value)  # one line, every problem on it
    for name in fields:
        assert f"{name}: " in str(err.value)


@pytest.mark.parametrize(
    "kwargs, says",
    [
        (
            {"min_workers": 4, "max_workers": 12, "workers_per_pod": 8},
            "min_workers: must be a whole number of pods of "
            "8 workers (workers_per_pod): 0 or 8, not 4; max_workers: must be a whole number of pods of 8 workers "
            "(workers_per_pod): 8 or 16, not 12",
        ),
        (
            {"min_workers": 0, "max_workers": 4, "workers_per_pod": 8},
            "max_workers: must be a whole number of pods of 8 workers (workers_per_pod): 8, not 4",
        ),
    ],
)
def test_a_size_between_pods_names_the_whole_sizes_around_it(kwargs, says):
    with pytest.raises(KaleConfigError) as err:
        Limits(**kwargs)
    assert says in str(err.value)


def test_sizes_are_whole_pods_within_the_limits():
    limits = Limits(min_workers=0, max_workers=32, workers_per_pod=8)
    assert [limits.whole_pods(w) for w in (0, 1, 8, 9, 16, 31, 32, 40)] == [0, 8, 8, 16, 16, 32, 32, 32]
    assert limits.sizes().tolist() == [0, 8, 16, 24, 32]
    assert limits.sizes(3, 17).tolist() == [8, 16, 24]  # from the pod holding 3 to the one holding 17
    assert Limits(max_workers=5).sizes().tolist() == [1, 2, 3, 4, 5]


def test_a_joined_error_survives_pickling_and_a_process_pool():
    with pytest.raises(KaleConfigError) as err:
        Limits(min_workers=-1, slo_minutes=0)
    again = pickle.loads(pickle.dumps(err.value))
    assert str(again) == str(err.value) and [e.field for e in again.errors] == ["min_workers", "slo_minutes"]
    with ProcessPoolExecutor(1) as pool, pytest.raises(KaleConfigError, match="max_workers: must be <= 1024"):
        pool.submit(Limits, max_workers=2000).result()


@pytest.mark.parametrize(
    "argv, error",
    [
        ([], None),
        (["--max-workers", "4", "--slo-minutes", "5"], None),
        (["--min-workers", "3", "--max-workers", "2"], "--min-workers: must be <= max_workers (2)"),
    ],
)
def test_limit_flags_are_derived_from_the_declaration(argv, error):
    from kale_dagster.cli import Parser

    parser = Parser()
    add_flags(parser, Limits)
    args = parser.parse_args(argv)
    if error is None:
        assert from_flags(Limits, args) == Limits(**{k: v for k, v in vars(args).items()})
    else:
        with pytest.raises(KaleConfigError, match=error.replace("(", r"\(").replace(")", r"\)")):
            from_flags(Limits, args)
