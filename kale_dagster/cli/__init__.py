"""The ``kale`` command line.

Each subcommand is a module of this package that registers itself through
a ``register(subparsers)`` function, so this file stays a table of
contents.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Collection, Sequence

from kale_dagster.errors import CommandError, InputDataError, KaleConfigError
from kale_dagster.rules import Rule

# Each subcommand: the module that provides it and its one-line summary, in the order a user needs them.
# `kale --help` reads the summaries here and imports no command module, so it answers at once.
COMMANDS = {
    "demo": (
        "kale_dagster.cli.demo",
        "live demo: embedded broker, compressed diurnal day, torch trainer on emulated GPUs kept sized by Kale "
        "through Dagster",
    ),
    "status": (
        "kale_dagster.cli.status",
        "where each pipeline stands: workers, lag against the SLO, forecast, last decision, health",
    ),
    "report": (
        "kale_dagster.cli.report",
        "the savings report: what ran beside what Kale and the tuned baselines would have run (from the history)",
    ),
    "trainer": ("kale_dagster.cli.trainer", "run a trainer's workers locally (the built-in demo's or yours)"),
    "k8s": ("kale_dagster.cli.k8s", "Kubernetes helpers (render manifests for review and GitOps)"),
    "metrics": ("kale_dagster.cli.metrics", "each pipeline's state as Prometheus metrics"),
    "history": ("kale_dagster.cli.history", "the metrics history (backfill it from Kafka)"),
    "forecast": (
        "kale_dagster.cli.forecast",
        "evaluate a traffic forecaster on a timestamp,value trace (rolling origin)",
    ),
    "backtest": (
        "kale_dagster.cli.backtest",
        "replay a trace through Kale, HPA, KEDA and static allocation; print the paper's metrics",
    ),
    "trace": ("kale_dagster.cli.trace", "make arrival traces (synthetic, seeded)"),
    "produce": ("kale_dagster.cli.produce", "replay a timestamp,value trace into a Kafka topic as CTR samples"),
    "broker": (
        "kale_dagster.cli.broker",
        "run the embedded Kafka-protocol broker (Tansu, memory only) in the foreground",
    ),
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


def build_parser(commands: Collection[str] = ()) -> argparse.ArgumentParser:
    """The ``kale`` parser.  The modules of ``commands`` alone are imported and register their flags (``kale
    status`` does not wait for every other command's imports); the others are listed by their summary."""
    parser = Parser(
        prog="kale",
        description="Kale elastic GPU scheduling for online training, on Dagster.",
    )
    parser.add_argument("--version", action="version", version=f"kale-dagster {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, summary) in COMMANDS.items():
        if name in commands:
            importlib.import_module(module_name).register(subparsers, summary)
        else:
            subparsers.add_parser(name, help=summary)
    return parser


JSON_SCHEMA_VERSION = 1  # raised when a --json field changes meaning or goes; new fields may appear without


def print_json(payload: dict, indent: int | None = None) -> None:
    """A command's ``--json`` output: one object, its ``schema_version`` first."""
    import json

    print(json.dumps({"schema_version": JSON_SCHEMA_VERSION, **payload}, indent=indent))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kale-dagster")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(commands=given[:1])
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (CommandError, KaleConfigError, InputDataError, FileNotFoundError) as exc:
        print(f"kale {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
