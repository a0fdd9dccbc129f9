"""YAML attribute models derived from the declarations' field rules (``kale_dagster.rules``).

``declared_model(KafkaSource)`` is a pydantic model with one attribute per
ruled field of the dataclass: the same name, type, default, range,
choices, pattern and description.  ``dg check yaml`` checks its JSON
schema, pydantic reports every bad attribute at once with its location
(Dagster turns that into the YAML line), and ``build()`` makes the
dataclass, whose own checks then run (what one field's rule cannot say,
such as ``min_workers <= max_workers``).  Nothing is mirrored by hand: a
field added to a declaration is an attribute of its YAML.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from dagster import Model
from pydantic import (
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    ValidatorFunctionWrapHandler,
    WrapSerializer,
    WrapValidator,
    create_model,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from kale_dagster.rules import at, field_types, rule_of


def is_template(value: Any) -> bool:
    return isinstance(value, str) and "{{" in value


def _template_or_rule(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    return value if is_template(value) else handler(value)


class _TemplateOrRuleSchema:
    """The JSON schema of a templatable attribute: if a string holding ``{{``, a template; else the rule.

    if/then/else rather than anyOf, so that ``dg check yaml`` still says what a bad literal breaks ("0 is less
    than the minimum of 1") instead of "not valid under any of the given schemas"."""

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {"if": {"type": "string", "pattern": r"\{\{"}, "then": {"type": "string"}, "else": handler(schema)}


T = TypeVar("T")
Templatable = Annotated[
    T,
    WrapValidator(_template_or_rule),
    WrapSerializer(lambda value, handler: value if is_template(value) else handler(value)),
    _TemplateOrRuleSchema(),
]
"""An attribute of type T that also takes a template, rendered when the component loads."""


class DeclaredModel(Model):
    """Attributes of one declaration (``declares``); ``build()`` makes it, errors prefixed with ``path``."""

    # A literal password written by mistake must not come back in an error message.
    model_config = ConfigDict(hide_input_in_errors=True)
    declares: ClassVar[type]
    path: ClassVar[str]

    def build(self) -> Any:
        values = {}
        kinds = field_types(self.declares)
        for name in type(self).model_fields:
            if name not in kinds:
                continue  # the YAML's own (a launcher's kind)
            value = getattr(self, name)
            if value is None and not kinds[name][1]:
                continue  # an attribute left out whose field takes no None: the declaration's default
            if isinstance(value, DeclaredModel):
                value = value.build()
            elif isinstance(value, list) and kinds[name][0] is tuple:
                value = tuple(value)
            values[name] = value
        return at(self.path, self.declares, **values)


def _yaml_type(hint: Any, choices: Any) -> Any:
    """The attribute's type: the field's, with tuples as YAML lists and choices as a Literal.

    An optional field's attribute is its plain type with the default None: ``dg check yaml`` then says what a
    written value must be, where a nullable schema says only "not valid under any of the given schemas"."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(args) == 1 and len(args) < len(typing.get_args(hint)):
        hint = args[0]
    if choices is not None:
        return Literal[tuple(choices)]  # type: ignore[valid-type]
    if typing.get_origin(hint) is tuple:
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return list[args[0]] if args else list[Any]
    return hint


def declared_model(
    cls: type,
    *,
    path: str,
    exclude: tuple[str, ...] = (),
    attributes: dict[str, tuple[Any, Any]] | None = None,
    doc: str | None = None,
) -> type[DeclaredModel]:
    """The YAML model of dataclass ``cls``: its ruled fields, less ``exclude``, with ``attributes`` (name ->
    (type, default or ``Field``)) in place of fields whose YAML shape differs (a nested declaration)."""
    hints = typing.get_type_hints(cls)
    attributes = attributes or {}
    definitions: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        rule = rule_of(f)
        if f.name in attributes:
            definitions[f.name] = attributes[f.name]
            continue
        if rule is None or f.name in exclude:
            continue
        unit = f" ({rule.unit})" if rule.unit else ""
        default: dict[str, Any] = {}
        if f.default is not dataclasses.MISSING:
            default["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default["default_factory"] = f.default_factory
        default_value = default.get("default")
        if isinstance(default_value, tuple):
            default = {"default_factory": lambda value=default_value: list(value)}
        constraints = Field(
            ge=rule.ge,
            gt=rule.gt,
            le=rule.le,
            lt=rule.lt,
            pattern=rule.pattern and f"^(?:{rule.pattern})$",
        )
        definitions[f.name] = (
            Templatable[Annotated[_yaml_type(hints[f.name], rule.allowed()), constraints]],
            Field(**default, description=(rule.description + unit) or None),
        )
    model = create_model(f"{cls.__name__}Attributes", __base__=DeclaredModel, __doc__=doc or cls.__doc__, **definitions)
    model.declares = cls
    model.path = path
    return model
