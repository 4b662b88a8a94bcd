"""Built-in functions, found by name: Siddhi's core functions plus common math: and str: ones.
Each entry compiles a call from its argument executors into an Executor. What a function accepts
and returns is the parser's table (sp_dagster.siddhi.functions), checked by validation, so entries
here only implement.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable

import pyarrow.compute as pc

from sp_dagster.engine.errors import app_error
from sp_dagster.engine.executor import Executor, Scope, converter
from sp_dagster.engine.values import INT_MAX, INT_MIN, f32, java_class, java_float_to_int, java_str
from sp_dagster.siddhi import ast

Compiler = Callable[[ast.FunctionCall, list, "str | None", Scope], Executor]
#: Aggregators (sum, count, ...) are not here: they keep state and live in aggregators.py, and the
#: compiler (expressions.compile_call) hands them to the scope's aggregation context.
FUNCTIONS: dict[str, Compiler] = {}


def function(*names: str):
    """Register the engine's implementation of the functions called `names` (`str:concat`)."""

    def register(compiler: Compiler) -> Compiler:
        for name in names:
            FUNCTIONS[name] = compiler
        return compiler

    return register


def _simple(kind: str, fn: Callable, args: list, vector=None) -> Executor:
    """An executor applying `fn` to the evaluated arguments (no null short-circuit)."""
    rows = [a.row for a in args]
    if len(rows) == 1:
        only = rows[0]
        return Executor(kind, lambda e: fn(only(e)), vector)
    return Executor(kind, lambda e: fn(*[r(e) for r in rows]), vector)


def _null_safe(kind: str | None, fn: Callable, args: list) -> Executor:
    """An executor that yields null when any argument is null, else `fn(*values)`."""
    assert kind is not None  # the specs of these functions give a type for checked arguments
    rows = [a.row for a in args]

    def row(e):
        values = [r(e) for r in rows]
        if any(v is None for v in values):
            return None
        return fn(*values)

    return Executor(kind, row)


def _type_name(node: ast.FunctionCall, kind: str | None) -> str:
    if kind not in _TYPE_NAMES:
        raise app_error(f"2nd argument of {node.name}() must be one of {', '.join(_TYPE_NAMES)}", node)
    return kind


# --------------------------------------------------------------------------- core functions

_TYPE_NAMES = ("string", "int", "long", "float", "double", "bool")


@function("convert")
def _convert(node, args, kind, scope):
    target = _type_name(node, kind)
    fn = _converter(args[0].type, target)
    inner = args[0].row

    def row(e):
        value = inner(e)
        if value is None:
            return None
        try:
            return fn(value)
        except (ValueError, OverflowError):
            return None

    return Executor(target, row)


def _parse_java_int(text: str, bits: int) -> int:
    if not re.fullmatch(r"[+-]?\d+", text):
        raise ValueError(text)
    value = int(text)
    low, high = (INT_MIN, INT_MAX) if bits == 32 else (-(2**63), 2**63 - 1)
    if not low <= value <= high:
        raise ValueError(text)
    return value


def _parse_java_double(text: str) -> float:
    stripped = text.strip()
    if stripped[-1:] in ("d", "D", "f", "F"):
        stripped = stripped[:-1]
    if re.fullmatch(r"[+-]?(NaN|Infinity)", stripped):
        return float(stripped.replace("Infinity", "inf"))
    if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", stripped):
        raise ValueError(text)
    return float(stripped)


def _converter(source: str, target: str) -> Callable:
    """Siddhi's convert(): how a non-null `source` value becomes `target` (Java's rules)."""
    if target == "string":
        return lambda v: java_str(v, source)
    if source == "object":
        return lambda v: None
    if target == source:
        return lambda v: v
    if target in ("int", "long"):
        bits = 32 if target == "int" else 64
        if source == "string":
            return lambda v: _parse_java_int(v, bits)
        if source == "bool":
            return lambda v: 1 if v else 0
        if source in ("float", "double"):
            return lambda v: java_float_to_int(v, bits)
        if target == "int":  # long -> int keeps the low 32 bits
            return lambda v: ((v + 2**31) & 0xFFFFFFFF) - 2**31
        return lambda v: v
    if target in ("float", "double"):
        rnd = f32 if target == "float" else float
        if source == "string":
            return lambda v: rnd(_parse_java_double(v))
        if source == "bool":
            return lambda v: 1.0 if v else 0.0
        return lambda v: rnd(float(v))
    if source == "string":  # target bool
        return lambda v: v.lower() == "true"
    return lambda v: v == 1


@function("cast")
def _cast(node, args, kind, scope):
    target = _type_name(node, kind)
    inner = args[0].row
    # the value is only relabelled (Integer -> Long is the one conversion, and a no-op here)
    return Executor(target, inner)


@function("coalesce")
def _coalesce(node, args, kind, scope):
    rows = [a.row for a in args]

    def row(e):
        for r in rows:
            value = r(e)
            if value is not None:
                return value
        return None

    vector = None
    if all(a.arrow for a in args):
        vectors = [a.arrow for a in args]
        vector = lambda c: pc.coalesce(*[v(c) for v in vectors])  # noqa: E731  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes it at import
    return Executor(kind, row, vector)


@function("ifThenElse")
def _if_then_else(node, args, kind, scope):
    condition, then, otherwise = args
    c, t, o = condition.row, then.row, otherwise.row
    vector = None
    if condition.arrow and then.arrow and otherwise.arrow:
        cv, tv, ov = condition.arrow, then.arrow, otherwise.arrow
        vector = lambda chunk: pc.if_else(pc.fill_null(cv(chunk), False), tv(chunk), ov(chunk))  # noqa: E731  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes it at import
    return Executor(kind, lambda e: t(e) if c(e) is True else o(e), vector)


def _instance_of(java_type: str) -> Compiler:
    def compile_instance_of(node, args, kind, scope):
        source, inner = args[0].type, args[0].row
        return Executor("bool", lambda e: (v := inner(e)) is not None and java_class(v, source) == java_type)

    return compile_instance_of


for _java, _name in (
    ("Boolean", "instanceOfBoolean"),
    ("Double", "instanceOfDouble"),
    ("Float", "instanceOfFloat"),
    ("Integer", "instanceOfInteger"),
    ("Long", "instanceOfLong"),
    ("String", "instanceOfString"),
):
    FUNCTIONS[_name] = _instance_of(_java)


@function("default")
def _default(node, args, kind, scope):
    v, d = args[0].row, args[1].row
    return Executor(kind, lambda e: d(e) if (x := v(e)) is None else x)


def _extreme(largest: bool) -> Compiler:
    def compile_extreme(node, args, kind, scope):
        if len(args) == 1:
            return Executor(kind, args[0].row)
        rows = [a.row for a in args]
        # Siddhi starts from Double.MIN_VALUE (the smallest positive double) or MAX_VALUE
        start = 5e-324 if largest else 1.7976931348623157e308
        to_kind = _converter("double", kind)

        def row(e):
            best = start
            for r in rows:
                value = r(e)
                value = start if value is None else float(value)
                if (value > best) if largest else (value < best):
                    best = value
            return to_kind(best)

        return Executor(kind, row)

    return compile_extreme


FUNCTIONS["maximum"] = _extreme(True)
FUNCTIONS["minimum"] = _extreme(False)


@function("UUID")
def _uuid(node, args, kind, scope):
    return Executor(kind, lambda e: str(uuid.uuid4()))


@function("currentTimeMillis")
def _current_time(node, args, kind, scope):
    clock = scope.context.clock
    return Executor(kind, lambda e: clock.now())


@function("eventTimestamp")
def _event_timestamp(node, args, kind, scope):
    if args:
        raise app_error("eventTimestamp(event) is only valid in patterns and sequences", node)
    return Executor(kind, lambda e: e.timestamp)


# --------------------------------------------------------------------------- str: functions


@function("str:concat")
def _concat(node, args, kind, scope):
    kinds = [a.type for a in args]
    return _simple(kind, lambda *vs: "".join(java_str(v, k) for v, k in zip(vs, kinds) if v is not None), args)


def _strings(fn: Callable) -> Compiler:
    """A str: function that is null when any argument is null, else `fn(*values)`."""
    return lambda node, args, kind, scope: _null_safe(kind, fn, args)


FUNCTIONS.update(
    {
        "str:length": _strings(len),
        "str:upper": _strings(str.upper),
        "str:lower": _strings(str.lower),
        "str:trim": _strings(lambda s: s.strip(" \t\n\r\x0b\x0c\x00")),
        "str:reverse": _strings(lambda s: s[::-1]),
        "str:contains": _strings(lambda s, sub: sub in s),
        "str:equalsIgnoreCase": _strings(lambda a, b: a.lower() == b.lower()),
        "str:regexp": _strings(lambda s, rx: re.fullmatch(rx, s) is not None),
        "str:replaceAll": _strings(lambda s, rx, rep: re.sub(rx, rep.replace("$", "\\"), s)),
        "str:replaceFirst": _strings(lambda s, rx, rep: re.sub(rx, rep.replace("$", "\\"), s, count=1)),
        "str:substr": _strings(lambda s, start, length=None: s[start:] if length is None else s[start : start + length]),
        "str:charAt": _strings(lambda s, i: s[i]),
        "str:repeat": _strings(lambda s, n: s * n),
    }
)


# --------------------------------------------------------------------------- math: functions


def _doubles(fn: Callable) -> Compiler:
    """A math: function of doubles (NaN where Java's Math gives NaN)."""

    def safe(*values):
        try:
            return fn(*[float(v) for v in values])
        except (ValueError, OverflowError):
            return math.nan

    return lambda node, args, kind, scope: _null_safe(kind, safe, args)


FUNCTIONS.update(
    {
        "math:sqrt": _doubles(math.sqrt),
        "math:ln": _doubles(math.log),
        "math:log": _doubles(math.log),
        "math:log10": _doubles(math.log10),
        "math:exp": _doubles(math.exp),
        "math:sin": _doubles(math.sin),
        "math:cos": _doubles(math.cos),
        "math:tan": _doubles(math.tan),
        "math:ceil": _doubles(math.ceil),
        "math:floor": _doubles(math.floor),
        "math:power": _doubles(math.pow),
        "math:abs": lambda node, args, kind, scope: _null_safe(kind, abs, args),
    }
)


@function("math:round")
def _round(node, args, kind, scope):
    bits = 32 if kind == "int" else 64
    return _null_safe(kind, lambda v: java_float_to_int(math.floor(float(v) + 0.5), bits), args)


@function("math:max", "math:min")
def _math_extreme(node, args, kind, scope):
    lc = converter(args[0].type, kind) or (lambda v: v)
    rc = converter(args[1].type, kind) or (lambda v: v)
    pick = max if node.name == "max" else min
    return _null_safe(kind, lambda a, b: pick(lc(a), rc(b)), args)
