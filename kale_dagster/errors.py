"""Exceptions shared across kale_dagster."""

from __future__ import annotations

from collections.abc import Sequence


class KaleConfigError(ValueError):
    """A setting is invalid.  The message names the field and says what to fix.

    One error may carry several problems (``join``): ``errors`` lists them, one per field, and the
    message has one line each.  ``field`` and ``problem`` are the first's.  Picklable, so a process pool
    hands it on as it is."""

    def __init__(self, field: str, problem: str):
        self.field = field
        # One line whatever a problem quotes (a key or a value with a line break in it, an exception's text).
        self.problem = problem.replace("\r", "\\r").replace("\n", "\\n")
        self.errors: list[KaleConfigError] = [self]
        super().__init__(f"{field}: {self.problem}")

    @classmethod
    def join(cls, errors: Sequence[KaleConfigError]) -> KaleConfigError:
        """One error for all of ``errors`` (each flattened to its own problems), in their order."""
        flat = [e for error in errors for e in error.errors]
        if len(flat) == 1:
            return flat[0]
        joined = cls(flat[0].field, flat[0].problem)
        joined.errors = flat
        joined.args = (f"{len(flat)} problems: " + "; ".join(f"{e.field}: {e.problem}" for e in flat),)
        return joined

    def __reduce__(self):
        return _rebuild, ([(e.field, e.problem) for e in self.errors],)


def _rebuild(pairs: list[tuple[str, str]]) -> KaleConfigError:
    return KaleConfigError.join([KaleConfigError(field, problem) for field, problem in pairs])


class InputDataError(ValueError):
    """Input data (a trace, a history, measurements) cannot be used as given."""


class CommandError(RuntimeError):
    """A CLI subcommand failed in a way the user can fix; printed without a traceback."""


def require_extra(module: str, extra: str, needed_by: str) -> None:
    """Fail in one line naming the extra to install when ``module`` is absent (the core install leaves out torch,
    the UI and the embedded broker: a code server needs none of them)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise CommandError(f"{needed_by} needs {module}, which is not installed: pip install 'kale-dagster[{extra}]'")
