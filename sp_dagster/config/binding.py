"""Bind located YAML values to typed, frozen dataclasses, with one-line errors.
A field's YAML key, documentation and constraints sit in its metadata (see `setting`), so
the classes in `model.py` are the single description of every configuration key.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable
from typing import Any

from sp_dagster.config.yamlsource import LocatedDict, LocatedList, Mark
from sp_dagster.errors import ConfigError

_MISSING = dataclasses.MISSING


def setting(
    key: str,
    default: Any = _MISSING,
    *,
    doc: str = "",
    unit: str = "",
    shown: str | None = None,
    choices: tuple[str, ...] | None = None,
    minimum: float | None = None,
    parse: Callable[[Any, Context], Any] | None = None,
    factory: Callable[[], Any] | None = None,
    aliases: tuple[str, ...] = (),
    secret: bool = False,
) -> Any:
    """Declare a configuration field: its YAML key (and older names, aliases), default, description (doc), unit and constraints;
    a `secret` one is left out of the config's repr."""
    metadata = {"key": key, "doc": doc, "unit": unit, "shown": shown, "choices": choices, "minimum": minimum, "parse": parse, "aliases": aliases}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata, repr=not secret)
    return dataclasses.field(default=default, metadata=metadata, repr=not secret)


@dataclasses.dataclass(frozen=True)
class Context:
    """Where a value sits: the file, its key path and its position."""

    filename: str
    path: str
    mark: Mark | None

    def child(self, key: str | int, mark: Mark | None) -> Context:
        """The context of a value one level down."""
        path = f"{self.path}[{key}]" if isinstance(key, int) else (f"{self.path}.{key}" if self.path else key)
        return Context(self.filename, path, mark or self.mark)

    def error(self, message: str) -> ConfigError:
        """An error naming the file, position and key path."""
        position = f":{self.mark.line}:{self.mark.column}" if self.mark else ""
        return ConfigError(f"{self.filename}{position}: {self.path}: {message}")


def describe(value: Any) -> str:
    """A short rendering of a found value for error messages."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing"
    return repr(value)


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def bind_value(hint: Any, value: Any, ctx: Context, meta: dict | None = None) -> Any:
    """Convert one YAML value to the type hint's type, or raise a ConfigError at ctx."""
    meta = meta or {}
    if meta.get("parse"):
        return meta["parse"](value, ctx)
    hint, optional = _unwrap_optional(hint)
    if value is None:
        if optional:
            return None
        raise ctx.error(f"expected {_expected(hint, meta)}, got nothing")
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return bind_dataclass(hint, value, ctx)
    origin = typing.get_origin(hint)
    if origin is tuple:
        (item_hint, _ellipsis) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ctx.error(f"expected a list, got {describe(value)}")
        marks = value.marks if isinstance(value, LocatedList) else {}
        return tuple(bind_value(item_hint, item, ctx.child(i, marks.get(i))) for i, item in enumerate(value))
    if origin is dict:
        _key_hint, item_hint = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ctx.error(f"expected a mapping, got {describe(value)}")
        marks = value.marks if isinstance(value, LocatedDict) else {}
        return {str(k): bind_value(item_hint, v, ctx.child(str(k), marks.get(k))) for k, v in value.items()}
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ctx.error(f"expected true or false, got {describe(value)}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return _check_minimum(value, ctx, meta)
        raise ctx.error(f"expected {_expected(hint, meta)}, got {describe(value)}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _check_minimum(float(value), ctx, meta)
        raise ctx.error(f"expected {_expected(hint, meta)}, got {describe(value)}")
    if hint is str:
        if isinstance(value, (dict, list)):
            raise ctx.error(f"expected {_expected(hint, meta)}, got {describe(value)}")
        text = str(value).lower() if isinstance(value, bool) else str(value)
        choices = meta.get("choices")
        if choices and text not in choices:
            raise ctx.error(f"expected {_expected(hint, meta)}, got {describe(value)}")
        return text
    if hint is Any:
        return value
    raise TypeError(f"unsupported configuration type {hint!r}")  # a programming error, not a user's


def _check_minimum(value: float, ctx: Context, meta: dict) -> Any:
    minimum = meta.get("minimum")
    if minimum is not None and value < minimum:
        raise ctx.error(f"expected {_expected(type(value), meta)}, got {value!r}")
    return value


def _expected(hint: Any, meta: dict) -> str:
    if meta.get("choices"):
        return "one of " + ", ".join(repr(c) for c in meta["choices"])
    noun = {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}.get(hint, "a value")
    if hint in (int, float) and meta.get("minimum") is not None:
        minimum = meta["minimum"]
        noun += " greater than 0" if minimum > 0 and hint is float else f" of at least {minimum:g}"
    if meta.get("unit"):
        noun += f" ({meta['unit']})"
    return noun


def bind_dataclass(cls: type, value: Any, ctx: Context) -> Any:
    """Build dataclass cls from a mapping: unknown keys, wrong types and missing values are errors."""
    if not isinstance(value, dict):
        raise ctx.error(f"expected a mapping with keys such as {', '.join(known_keys(cls)[:4])}, got {describe(value)}")
    hints = typing.get_type_hints(cls)
    marks = value.marks if isinstance(value, LocatedDict) else {}
    by_key = {f.metadata["key"]: f for f in dataclasses.fields(cls) if "key" in f.metadata}
    aliases = {alias: key for key, f in by_key.items() for alias in f.metadata.get("aliases", ())}
    for key in value:
        key_mark = value.key_marks.get(key) if isinstance(value, LocatedDict) else None
        if key not in by_key and key not in aliases:
            raise ctx.child(key, key_mark).error(unknown_key_message(key, list(by_key)))
        if key in aliases and aliases[key] in value:
            raise ctx.child(key, key_mark).error(f"an older name of '{aliases[key]}', which is also given; keep one")
    kwargs = {}
    for key, field in by_key.items():
        given = next((name for name in (key, *field.metadata.get("aliases", ())) if name in value), None)
        if given is not None:
            kwargs[field.name] = bind_value(hints[field.name], value[given], ctx.child(given, marks.get(given)), dict(field.metadata))
        elif field.default is _MISSING and field.default_factory is _MISSING:
            raise ctx.child(key, None).error(f"is required: expected {_expected(_unwrap_optional(hints[field.name])[0], dict(field.metadata))}")
    return cls(**kwargs)


def known_keys(cls: type) -> list[str]:
    """The YAML keys a configuration class accepts."""
    return [f.metadata["key"] for f in dataclasses.fields(cls) if "key" in f.metadata]


def unknown_key_message(key: str, known: list[str]) -> str:
    """Say a key is unknown, suggesting the closest known one."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6) or [k for k in known if k.lower() == key.lower()]
    hint = f"did you mean '{close[0]}'?" if close else f"expected one of: {', '.join(known)}"
    return f"unknown key '{key}'; {hint}"
