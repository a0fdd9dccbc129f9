"""Every numeric flag of every subcommand, walked from the argparse definition, fed NaN, infinities, -1, 0
and huge values: a value within the flag's declared range is taken, anything else is exit 2 with one line
that names the flag and its range.  No flag is left unbounded."""

from __future__ import annotations

import argparse
import math
import operator
import subprocess
import sys

import pytest

from kale_dagster.cli import COMMANDS, Bounded, build_parser

HOSTILE = ["nan", "NaN", "inf", "-inf", "-1", "0", "1e30", "1e400", "2.5", "abc"]


def _leaves(parser: argparse.ArgumentParser, path=()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, sub in subs[0].choices.items():
        yield from _leaves(sub, (*path, name))


def _required(parser: argparse.ArgumentParser, skip: argparse.Action) -> list[str]:
    argv = []
    for action in parser._actions:
        if action.required and action is not skip and action.option_strings:
            argv += [action.option_strings[0], _valid(action)]
    return argv


def _valid(action: argparse.Action) -> str:
    """A value the flag takes: a name, or a number (a count, a bounded figure)."""
    for value in ("x", "1"):
        try:
            (action.type or str)(value)
            return value
        except (argparse.ArgumentTypeError, ValueError, TypeError):
            continue
    raise AssertionError(f"{action.option_strings[0]} takes neither 'x' nor '1'")


def _flags():
    for path, parser in _leaves(build_parser(COMMANDS)):
        for action in parser._actions:
            if action.type in (int, float):
                pytest.fail(f"kale {' '.join(path)} {action.option_strings[0]} is numeric without bounds")
            if isinstance(action.type, Bounded):
                yield path, parser, action


FLAGS = list(_flags())


def test_every_flag_says_what_it_does_and_kale_help_lists_commands_in_order():
    undocumented = [
        f"kale {' '.join(path)} {action.option_strings[0]}"
        for path, parser in _leaves(build_parser(COMMANDS))
        for action in parser._actions
        if action.option_strings and action.dest not in ("help", "version") and not action.help
    ]
    assert not undocumented, undocumented
    listed = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert list(listed)[:4] == ["demo", "status", "report", "trainer"]  # what a user needs first, first


def test_every_numeric_flag_is_bounded_and_there_are_many():
    assert len(FLAGS) >= 30


@pytest.mark.parametrize(
    "path, parser, action", FLAGS, ids=[f"{' '.join(p)} {a.option_strings[0]}" for p, _, a in FLAGS]
)
def test_hostile_values(path, parser, action, capsys):
    bounded: Bounded = action.type
    for text in HOSTILE:
        argv = [*_required(parser, action), f"{action.option_strings[0]}={text}"]  # "=": "-1" is no option
        try:
            value = bounded.kind(text)
            ok = math.isfinite(value) and all(
                b is None or cmp(value, b)
                for b, cmp in (
                    (bounded.ge, operator.ge),
                    (bounded.gt, operator.gt),
                    (bounded.le, operator.le),
                    (bounded.lt, operator.lt),
                )
            )
        except (ValueError, OverflowError):
            ok = False
        if ok:  # documented acceptance: within the range the help states
            assert getattr(parser.parse_args(argv), action.dest) == value
            continue
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2
        assert err.count("\n") == 1 and action.option_strings[0] in err and "must be" in err, err


def test_a_refused_value_is_one_line_from_the_command(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "kale_dagster.cli", "trace", "synth", "--days", "nan", "--out", str(tmp_path / "t.csv")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "kale trace synth: error: argument --days: must be a finite number > 0 and <= 366, got 'nan' "
        "(see kale trace synth --help)"
    ]


@pytest.mark.integration
def test_produce_answers_within_max_seconds_when_the_broker_cannot_be_reached(tmp_path):
    import time

    from kale_dagster.stream.broker import free_loopback_port

    trace = tmp_path / "t.csv"
    synth = [sys.executable, "-m", "kale_dagster.cli", "trace", "synth", "--days", "1", "--out", str(trace)]
    subprocess.run(synth, check=True, capture_output=True, timeout=120)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "kale_dagster.cli", "produce", "--trace", str(trace), "--topic", "x"]
        + ["--bootstrap-servers", f"127.0.0.1:{free_loopback_port()}", "--max-seconds", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - started
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("kale produce: error: could not produce to 127.0.0.1:")
    assert took < 20  # 2 s to reach the broker, plus the interpreter's start (kafka-python's own wait was 30 s)
