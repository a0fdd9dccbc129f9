"""Field rules, declared once on a dataclass field and checked together.

As KEDA's ``typed_config.go``: each field says its type, range, unit and
meaning where it is declared; one function checks them all and joins every
error, so a declaration with three mistakes is reported once, with three
lines, each naming its field.  The YAML component's schema is derived from
the same rules (``definitions/schema.py``), so Python, YAML and the CLI
cannot disagree.

    @dataclass(frozen=True)
    class Limits:
        max_workers: int = setting(32, ge=1, le=MAX_WORKERS, description="the most workers the pipeline may run")

        def __post_init__(self):
            check(self)

Types come from the annotation: ``int`` accepts integers only (not
``True``, not ``2.5``), ``float`` any finite real number; ``Optional[...]``
also ``None``.  What one field cannot say (``min_workers <= max_workers``)
is passed to ``check`` as a further problem, and joins the others.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import operator
import re
import types
import typing
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import MISSING
from typing import Any, Union

from kale_dagster.errors import KaleConfigError

RULE = "kale_rule"

Choices = Collection[str] | Callable[[], Collection[str]]
Problems = KaleConfigError | Iterable[KaleConfigError] | None


@dataclasses.dataclass(frozen=True)
class Rule:
    """What a field may hold and what it means; ``problem`` says what is wrong with a value, or None."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    unit: str = ""
    description: str = ""
    choices: Choices | None = None  # a collection, or a function of one for registries filled after import
    pattern: str | None = None
    hint: str = ""  # appended to a pattern's error: what the field must look like
    echo: bool = True  # False: an error never repeats the value (a password pasted where a name belongs)

    def allowed(self) -> Collection[str] | None:
        return self.choices() if callable(self.choices) else self.choices

    def problem(self, value: Any, kind: type | None, optional: bool) -> str | None:
        if value is None:
            return None if optional else "is required"
        unit = f" {self.unit}" if self.unit else ""
        if kind is int:
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                return f"must be a whole number, got {value!r}"
        elif kind is float:
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                return f"must be a number{unit}, got {value!r}"
            if not math.isfinite(value):
                return f"must be a finite number{unit}, got {value!r}"
        elif kind is bool:
            if not isinstance(value, bool):
                return f"must be true or false, got {value!r}"
        elif kind is not None and not isinstance(value, kind):
            return f"must be a {kind.__name__}, got {type(value).__name__}"
        for bound, holds, word in (
            (self.ge, operator.ge, ">="),
            (self.gt, operator.gt, ">"),
            (self.le, operator.le, "<="),
            (self.lt, operator.lt, "<"),
        ):
            if bound is not None and not holds(value, bound):
                return f"must be {word} {bound:g}{unit}, got {value!r}"
        allowed = self.allowed()
        if allowed is not None and value not in allowed:
            return f"unknown {value!r}; choose one of {', '.join(map(str, allowed))}"
        if self.pattern is not None and not re.fullmatch(self.pattern, str(value)):
            shown = f"{value!r} " if self.echo else "the value given (not repeated here) "
            return f"{shown}{self.hint or f'must match {self.pattern}'}"
        return None


def setting(
    default: Any = MISSING,
    *,
    default_factory: Callable[[], Any] | Any = MISSING,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    unit: str = "",
    description: str = "",
    choices: Choices | None = None,
    pattern: str | None = None,
    hint: str = "",
    echo: bool = True,
) -> Any:
    """A dataclass field with its rule (see the module docstring)."""
    rule = Rule(ge, gt, le, lt, unit, description, choices, pattern, hint, echo)
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={RULE: rule})
    return dataclasses.field(default=default, metadata={RULE: rule})


def rule_of(f: dataclasses.Field) -> Rule | None:
    return f.metadata.get(RULE)


@functools.cache
def field_types(cls: type) -> dict[str, tuple[type | None, bool]]:
    """Each field's class (``int`` for ``int``, ``Mapping`` for ``Mapping[str, Any]``; None for a ``Literal`` or a
    union of several) and whether it may be None."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        hint, optional = hints[f.name], False
        if typing.get_origin(hint) in (Union, types.UnionType):
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            optional = len(args) < len(typing.get_args(hint))
            hint = args[0] if len(args) == 1 else None
        plain = hint if isinstance(hint, type) else typing.get_origin(hint)
        out[f.name] = (plain if isinstance(plain, type) else None, optional)
    return out


def problems(obj: Any) -> list[KaleConfigError]:
    """Every field of the dataclass ``obj`` that breaks its rule, as errors naming the field."""
    return problems_in(type(obj), {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if rule_of(f)})


def problems_in(cls: type, values: Mapping[str, Any]) -> list[KaleConfigError]:
    """The broken rules of ``cls``'s fields among ``values`` (a field left out is not checked)."""
    kinds = field_types(cls)
    found = []
    for f in dataclasses.fields(cls):
        rule = rule_of(f)
        if rule is not None and f.name in values:
            problem = rule.problem(values[f.name], *kinds[f.name])
            if problem:
                found.append(KaleConfigError(f.name, problem))
    return found


def check(obj: Any, *more: Problems | Callable[[], Problems]) -> None:
    """Raise every broken field rule of ``obj`` and every further problem in ``more``, joined in one error.

    ``more`` may hold callables' results that only make sense once the fields are valid: pass them as a
    function of no arguments (``lambda: ...``), which runs only when no field rule is broken."""
    found = problems(obj)
    for extra in more:
        if callable(extra):
            if found:
                continue
            extra = extra()
        if isinstance(extra, KaleConfigError):
            found.append(extra)
        elif extra is not None:
            found.extend(extra)
    if found:
        raise KaleConfigError.join(found)


def need(ok: bool, name: str, problem: str) -> KaleConfigError | None:
    """A further problem for ``check``: an error naming ``name`` when ``ok`` is false."""
    return None if ok else KaleConfigError(name, problem)


def ordered(obj: Any, low: str, high: str) -> KaleConfigError | None:
    """A further problem for ``check`` when field ``low`` is above field ``high`` (``min_workers`` and
    ``max_workers``, say), naming ``low``."""
    lo, hi = getattr(obj, low), getattr(obj, high)
    return need(lo <= hi, low, f"must be <= {high} ({hi}), got {lo}")


def flag(name: str) -> str:
    """A field's command-line flag: ``batch_size`` -> ``--batch-size``."""
    return "--" + name.replace("_", "-")


def flag_arguments(cls: type, f: dataclasses.Field) -> dict[str, Any]:
    """What ``argparse``'s ``add_argument`` takes for the ruled field ``f`` of ``cls``, beside its ``flag``: where
    the value goes, its type, whether it is required, its default and its help (the rule's description and unit)."""
    rule = rule_of(f)
    assert rule is not None, f"{cls.__name__}.{f.name} has no rule"
    required = f.default is MISSING and f.default_factory is MISSING
    unit = f" ({rule.unit})" if rule.unit else ""
    return {
        "dest": f.name,
        "type": field_types(cls)[f.name][0] or str,
        "required": required,
        "default": None if required else f.default,
        "help": f"{rule.description}{unit}",
    }


def renamed(rename: Callable[[str], str], build: Callable[..., Any], /, **kwargs) -> Any:
    """``build(**kwargs)``, each configuration error's field renamed by ``rename`` (where the user wrote it)."""
    try:
        return build(**kwargs)
    except KaleConfigError as exc:
        raise KaleConfigError.join([KaleConfigError(rename(e.field), e.problem) for e in exc.errors]) from None


def at(path: str, build: Callable[..., Any], /, **kwargs) -> Any:
    """``build(**kwargs)``, each configuration error's field prefixed with ``path`` (a YAML location)."""
    return renamed(lambda field: f"{path}.{field}", build, **kwargs)
