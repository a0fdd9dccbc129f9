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

# Modules providing subcommands, in the order `kale --help` lists them.
_COMMAND_MODULES = (
    "kale_dagster.cli.broker",
    "kale_dagster.cli.forecast",
    "kale_dagster.cli.trace",
    "kale_dagster.cli.produce",
    "kale_dagster.cli.k8s",
    "kale_dagster.cli.trainer",
    "kale_dagster.cli.backtest",
    "kale_dagster.cli.history",
    "kale_dagster.cli.demo",
)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default after its help, unless there is none to show."""

    def _get_help_string(self, action):
        if action.default in (None, False, argparse.SUPPRESS) or isinstance(action, argparse._VersionAction):
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """The parser of every command and subcommand: shows defaults, even of options declared without help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        if kwargs.get("help") is None and kwargs.get("default") not in (None, False, argparse.SUPPRESS):
            kwargs["help"] = "default: %(default)s"
        return super().add_argument(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kale",
        description="Kale elastic GPU scheduling for online training, on Dagster.",
    )
    parser.add_argument("--version", action="version", version=f"kale-dagster {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in _COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kale-dagster")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (CommandError, KaleConfigError, InputDataError, FileNotFoundError) as exc:
        print(f"kale {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
