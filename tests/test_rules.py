"""Field rules: a declaration says each field's type, range, unit and meaning once; errors name the field and say
what to fix, word for word (the messages are what users read)."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import MISSING, dataclass

import pytest

from kale_dagster import KaleConfigError
from kale_dagster.rules import Rule, at, check, flag_arguments, problems_in, rule_of, setting


def _declare():
    """Declared here, not at import: the rules are built while the test runs."""

    @dataclass(frozen=True)
    class Sample:
        rate: float = setting(1.0, gt=0, le=100, unit="samples/s", description="how fast")
        count: int = setting(2, ge=1, lt=10, description="how many")
        mode: str = setting("a", choices=("a", "b"))
        name: str = setting("ok", pattern=r"[a-z]+", hint="must be lower-case letters")
        secret: str = setting("x", pattern=r"x+", echo=False)
        plain: str = setting("p", pattern=r"p")
        flag: bool = setting(False)
        limit: int | None = setting(None, ge=0)
        needed: str | None = setting(default_factory=lambda: "made")

        def __post_init__(self):
            check(self)

    return Sample


def test_a_bare_setting_has_an_empty_rule():
    Sample = _declare()
    assert rule_of(dataclasses.fields(Sample)[6]) == Rule()
    assert Rule() == Rule(None, None, None, None, "", "", None, None, "", True)


def test_each_option_lands_in_its_place():
    fields = {f.name: f for f in dataclasses.fields(_declare())}
    assert rule_of(fields["rate"]) == Rule(gt=0, le=100, unit="samples/s", description="how fast")
    assert rule_of(fields["count"]) == Rule(ge=1, lt=10, description="how many")
    assert rule_of(fields["mode"]) == Rule(choices=("a", "b"))
    assert rule_of(fields["name"]) == Rule(pattern=r"[a-z]+", hint="must be lower-case letters")
    assert rule_of(fields["secret"]) == Rule(pattern=r"x+", echo=False)
    assert fields["needed"].default is MISSING and fields["needed"].default_factory() == "made"  # type: ignore[misc]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({}, None),
        ({"rate": 0.0}, "rate: must be > 0 samples/s, got 0.0"),
        ({"rate": 100.5}, "rate: must be <= 100 samples/s, got 100.5"),
        ({"rate": float("nan")}, "rate: must be a finite number samples/s, got nan"),
        ({"rate": "fast"}, "rate: must be a number samples/s, got 'fast'"),
        ({"rate": True}, "rate: must be a number samples/s, got True"),
        ({"count": 0}, "count: must be >= 1, got 0"),
        ({"count": 10}, "count: must be < 10, got 10"),
        ({"count": 2.5}, "count: must be a whole number, got 2.5"),
        ({"mode": "c"}, "mode: unknown 'c'; choose one of a, b"),
        ({"mode": 3}, "mode: must be a str, got int"),
        ({"name": "Bad"}, "name: 'Bad' must be lower-case letters"),
        ({"secret": "hunter2"}, "secret: the value given (not repeated here) must match x+"),
        ({"plain": "q"}, "plain: 'q' must match p"),
        ({"flag": "yes"}, "flag: must be true or false, got 'yes'"),
        ({"limit": -1}, "limit: must be >= 0, got -1"),
        ({"limit": None}, None),
        ({"needed": None}, None),
        ({"count": 0, "mode": "c"}, "2 problems: count: must be >= 1, got 0; mode: unknown 'c'; choose one of a, b"),
    ],
)
def test_a_value_is_held_or_refused_in_words(changes, message):
    Sample = _declare()
    if message is None:
        Sample(**changes)
        return
    with pytest.raises(KaleConfigError) as err:
        Sample(**changes)
    assert str(err.value) == message


def test_a_required_field_left_empty_says_so():
    @dataclass(frozen=True)
    class Required:
        name: str = setting()

    assert [str(e) for e in problems_in(Required, {"name": None})] == ["name: is required"]
    assert problems_in(Required, {}) == []  # a field left out is not checked


def test_further_problems_join_the_field_rules():
    Sample = _declare()
    sample = Sample()
    with pytest.raises(KaleConfigError) as err:
        check(sample, KaleConfigError("x", "first"), [KaleConfigError("y", "second")], None)
    assert str(err.value) == "2 problems: x: first; y: second"
    check(sample, None, lambda: None)  # nothing wrong, nothing raised


def test_flags_are_derived_from_the_rule():
    fields = {f.name: f for f in dataclasses.fields(_declare())}
    assert flag_arguments(_declare(), fields["rate"]) == {
        "dest": "rate",
        "type": float,
        "required": False,
        "default": 1.0,
        "help": "how fast (samples/s)",
    }
    assert flag_arguments(_declare(), fields["count"])["help"] == "how many"

    @dataclass(frozen=True)
    class Required:
        name: str = setting(description="a name")

    spec = flag_arguments(Required, dataclasses.fields(Required)[0])
    assert spec == {"dest": "name", "type": str, "required": True, "default": None, "help": "a name"}
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", **spec)
    assert parser.parse_args(["--name", "n"]).name == "n"


def test_errors_are_placed_where_the_user_wrote_them():
    Sample = _declare()
    with pytest.raises(KaleConfigError) as err:
        at("pipelines[0].trainer", Sample, count=0, mode="c")
    assert [e.field for e in err.value.errors] == ["pipelines[0].trainer.count", "pipelines[0].trainer.mode"]
    assert at("here", Sample, count=3).count == 3
