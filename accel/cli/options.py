"""Command-line options generated from a config class (as vLLM's `EngineArgs` generates its flags): one option per
field, its help the field's docstring, its default the field's own. A command never restates a setting.

    @config_options(RuntimeConfig, dest="runtime")
    def serve(model: str, runtime: dict | None = None) -> None:
        config = RuntimeConfig(**runtime)   # only the options given; the class fills in the rest

An option left out is not passed (the class's default applies); a bad value fails in the class's own validation,
which names the field, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import types
import typing
from typing import Annotated, Any, Callable, Literal, Optional, Union

import typer
from pydantic import TypeAdapter, ValidationError


def _option_type(annotation: Any) -> type:
    """The click-parsable type of a field: int / float / bool / str (Literals and unions parse as str and are
    checked by the class)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _option_type(args[0])
    if origin in (Union, types.UnionType):
        inner = [_option_type(a) for a in args]
        return inner[0] if len(set(inner)) == 1 else str
    if origin is Literal:
        kinds = {type(a) for a in args}
        return kinds.pop() if len(kinds) == 1 else str
    return annotation if annotation in (int, float, bool, str) else str


def config_fields(config: type) -> list[tuple[str, Any, Any, str]]:
    """(name, annotation, default, description) of each field of a pydantic model or a dataclass that pydantic
    validates: the description is the field's docstring, as in the recipe's JSON schema."""
    props = TypeAdapter(config).json_schema().get("properties", {})
    if dataclasses.is_dataclass(config):
        hints = typing.get_type_hints(config, include_extras=True)
        items = [(f.name, hints[f.name], f.default if f.default is not dataclasses.MISSING else None)
                 for f in dataclasses.fields(config)]
    else:
        items = [(name, f.annotation, f.default) for name, f in config.model_fields.items()]
    return [(name, ann, default, props.get(name, {}).get("description", "")) for name, ann, default in items]


def _shown(default: Any) -> str:
    return "none" if default is None else str(default).lower() if isinstance(default, bool) else str(default)


def config_options(config: type, dest: str, exclude: tuple[str, ...] = (),
                   rename: dict[str, str] | None = None) -> Callable:
    """Decorate a typer command with one `--field-name` option per field of `config` (but `exclude`); the command
    receives the options given as a dict in its `dest` parameter. `rename` maps a field to another option name
    where a command already uses the field's (e.g. `device`)."""
    rename = rename or {}

    def decorate(func: Callable) -> Callable:
        sig = inspect.signature(func, eval_str=True)
        params = [p for p in sig.parameters.values() if p.name != dest]
        taken = {p.name for p in params}
        fields = {}
        for name, annotation, default, description in config_fields(config):
            if name in exclude:
                continue
            param = rename.get(name, name)
            if param in taken:
                raise TypeError(f"{func.__name__} already has a parameter {param!r}; exclude or rename {name!r}")
            kind = _option_type(annotation)
            flag = "--" + param.replace("_", "-")
            decls = [f"{flag}/--no-{flag[2:]}"] if kind is bool else [flag]
            option = typer.Option(*decls, help=description, show_default=_shown(default),
                                  rich_help_panel=config.__name__)
            params.append(inspect.Parameter(param, inspect.Parameter.KEYWORD_ONLY, default=None,
                                            annotation=Annotated[Optional[kind], option]))
            fields[param] = name

        @functools.wraps(func)
        def command(*args, **kwargs):
            given = {fields[p]: kwargs.pop(p) for p in list(kwargs) if p in fields}
            return func(*args, **kwargs, **{dest: {k: v for k, v in given.items() if v is not None}})

        command.__signature__ = sig.replace(parameters=params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


def build_config(config: type, values: dict, prefix: str = "--") -> Any:
    """`config(**values)`, a validation failure raised as ValueError naming each option, its value and the rule."""
    try:
        return TypeAdapter(config).validate_python(values)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"])
            reason = err["msg"].removeprefix("Value error, ")
            named = re.match(r"(\w+)=", reason)  # a dataclass's own check names its field
            if loc:
                problems.append(f"{prefix}{loc.replace('_', '-')} {err.get('input')!r}: {reason}")
            else:
                problems.append(f"{prefix}{named.group(1).replace('_', '-')}: {reason}" if named else reason)
        raise ValueError("; ".join(problems)) from None
