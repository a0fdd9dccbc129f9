"""The ``kale`` command line.

Each subcommand lives in the module that owns its feature and registers
itself here through a ``register(subparsers)`` function, so this file stays
a table of contents.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

from .errors import CommandError, InputDataError, KaleConfigError

# Modules providing subcommands, in the order `kale --help` lists them.
_COMMAND_MODULES = (
    "kale_dagster.commands.broker",
    "kale_dagster.commands.forecast",
    "kale_dagster.commands.trace",
    "kale_dagster.commands.produce",
    "kale_dagster.commands.k8s",
    "kale_dagster.commands.trainer",
    "kale_dagster.commands.backtest",
    "kale_dagster.commands.demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kale",
        description="Kale elastic GPU scheduling for online training, on Dagster.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in _COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (CommandError, KaleConfigError, InputDataError, FileNotFoundError) as exc:
        print(f"kale {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
