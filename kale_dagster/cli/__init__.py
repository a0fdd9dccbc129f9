"""The ``kale`` command line.

Each subcommand is a module of this package that registers itself through
a ``register(subparsers)`` function, so this file stays a table of
contents.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from kale_dagster.errors import CommandError, InputDataError, KaleConfigError
from kale_dagster.rules import Rule

# The module providing each subcommand, in the order `kale --help` lists them.
_COMMAND_MODULES = {
    "broker": "kale_dagster.cli.broker",
    "forecast": "kale_dagster.cli.forecast",
    "trace": "kale_dagster.cli.trace",
    "produce": "kale_dagster.cli.produce",
    "k8s": "kale_dagster.cli.k8s",
    "trainer": "kale_dagster.cli.trainer",
    "status": "kale_dagster.cli.status",
    "metrics": "kale_dagster.cli.metrics",
    "backtest": "kale_dagster.cli.backtest",
    "history": "kale_dagster.cli.history",
    "demo": "kale_dagster.cli.demo",
}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default after its help, unless there is none to show."""

    def _get_help_string(self, action):
        if action.default in (None, False, argparse.SUPPRESS) or isinstance(action, argparse._VersionAction):
            return action.help
        return super()._get_help_string(action)


class Bounded:
    """A numeric flag's type: a whole number (``int``) or a finite number (``float``) within declared bounds,
    else argparse's one-line error (exit 2) saying what the flag takes."""

    def __init__(self, kind: type, ge: float | None, gt: float | None, le: float | None, lt: float | None):
        self.kind, self.ge, self.gt, self.le, self.lt = kind, ge, gt, le, lt
        self.rule = Rule(ge=ge, gt=gt, le=le, lt=lt)  # the declarations' own check: whole, finite, within bounds
        self.__name__ = kind.__name__  # argparse names the type in its messages

    def describe(self) -> str:
        low = f">= {self.ge:g}" if self.ge is not None else f"> {self.gt:g}" if self.gt is not None else ""
        high = f"<= {self.le:g}" if self.le is not None else f"< {self.lt:g}" if self.lt is not None else ""
        what = "a whole number" if self.kind is int else "a finite number"
        return f"{what} {' and '.join(b for b in (low, high) if b)}".strip()

    def __call__(self, text: str):
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {self.describe()}, got {text!r}") from None
        if self.rule.problem(value, self.kind, optional=False):
            raise argparse.ArgumentTypeError(f"must be {self.describe()}, got {text!r}")
        return value


class Parser(argparse.ArgumentParser):
    """The parser of every command and subcommand: shows defaults, even of options declared without help, and
    takes a numeric flag only with its bounds (``ge``/``gt`` and ``le``/``lt``): NaN, infinities and values no
    run can afford are refused at the door, with the range in the flag's help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        bounds = {k: kwargs.pop(k, None) for k in ("ge", "gt", "le", "lt")}
        if kwargs.get("type") in (int, float):
            if (bounds["ge"] is None and bounds["gt"] is None) or (bounds["le"] is None and bounds["lt"] is None):
                raise TypeError(f"numeric flag {args[0]} needs a lower and an upper bound (ge/gt and le/lt)")
            kwargs["type"] = Bounded(kwargs["type"], **bounds)
            kwargs["help"] = f"{kwargs.get('help') or ''} ({kwargs['type'].describe()})".strip()
        if kwargs.get("help") is None and kwargs.get("default") not in (None, False, argparse.SUPPRESS):
            kwargs["help"] = "default: %(default)s"
        return super().add_argument(*args, **kwargs)

    def error(self, message: str):
        """One line, naming the command and what to fix (argparse's usage block is one --help away)."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``kale`` parser; with ``only``, just that subcommand's (its module alone is imported, so a command
    like ``kale status`` does not wait for every other command's imports)."""
    parser = Parser(
        prog="kale",
        description="Kale elastic GPU scheduling for online training, on Dagster.",
    )
    parser.add_argument("--version", action="version", version=f"kale-dagster {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in _COMMAND_MODULES.items():
        if only is None or name == only:
            importlib.import_module(module_name).register(subparsers)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kale-dagster")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(only=given[0] if given and given[0] in _COMMAND_MODULES else None)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (CommandError, KaleConfigError, InputDataError, FileNotFoundError) as exc:
        print(f"kale {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
