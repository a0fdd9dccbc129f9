"""Exceptions shared across kale_dagster."""

from __future__ import annotations


class KaleConfigError(ValueError):
    """A setting is invalid.  The message names the field and says what to fix."""

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class InputDataError(ValueError):
    """Input data (a trace, a history, measurements) cannot be used as given."""


class CommandError(RuntimeError):
    """A CLI subcommand failed in a way the user can fix; printed without a traceback."""
