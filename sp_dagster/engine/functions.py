"""Built-in functions, found by name: Siddhi's core functions plus common math: and str: ones.

Each entry compiles a call from its argument executors into an Executor, checking argument
types at load time like Siddhi does. Aggregators (sum, count, ...) are not here: they keep
state and live in aggregators.py; compile_call hands them to the scope's aggregation context.
"""

from __future__ import annotations

import math
import re
import uuid
from typing import Callable

import pyarrow.compute as pc

from sp_dagster.engine import typeinfer
from sp_dagster.engine.errors import app_error
from sp_dagster.engine.expressions import Executor, Scope, compile_expression, constant, converter
from sp_dagster.engine.values import (
    JAVA_CLASS,
    INT_MAX,
    INT_MIN,
    NUMERIC,
    f32,
    java_class,
    java_float_to_int,
    java_str,
)
from sp_dagster.siddhi import ast

Compiler = Callable[[ast.FunctionCall, list, Scope], Executor]
FUNCTIONS: dict[str, Compiler] = {}


def function(*names: str):
    """Register a compiler for the functions called `names` (qualified: `str:concat`)."""

    def register(compiler: Compiler) -> Compiler:
        for name in names:
            FUNCTIONS[name] = compiler
        return compiler

    return register


def compile_call(node: ast.FunctionCall, scope: Scope) -> Executor:
    """Compile a function or aggregator call."""
    from sp_dagster.engine.aggregators import AGGREGATORS

    if node.namespace is None and node.name in AGGREGATORS:
        if scope.aggregation is None:
            raise app_error(f"aggregator {node.name}() is only allowed in select and having", node)
        args = [compile_expression(arg, scope) for arg in node.args]
        return scope.aggregation.compile(node, args)
    compiler = FUNCTIONS.get(node.qualified_name)
    if compiler is None:
        raise app_error(f"unknown function '{node.qualified_name}'", node)
    args = [compile_expression(arg, scope) for arg in node.args]
    result = compiler(node, args, scope)
    result.aggregators = tuple(a for arg in args for a in arg.aggregators)
    return result


def _arity(node: ast.FunctionCall, args: list, low: int, high: int | None = None) -> None:
    high = low if high is None else high
    if not low <= len(args) <= high:
        wanted = str(low) if low == high else f"{low} to {high}" if high < 99 else f"at least {low}"
        raise app_error(f"{node.qualified_name}() takes {wanted} argument(s), but found {len(args)}", node)


def _const_string(node: ast.FunctionCall, executor: Executor, position: int) -> str:
    if not executor.constant or not isinstance(executor.value, str):
        raise app_error(f"argument {position} of {node.qualified_name}() must be a string constant", node)
    return executor.value


def _simple(kind: str, fn: Callable, args: list, vector=None) -> Executor:
    """An executor applying `fn` to the evaluated arguments (no null short-circuit)."""
    rows = [a.row for a in args]
    if len(rows) == 1:
        only = rows[0]
        return Executor(kind, lambda e: fn(only(e)), vector)
    return Executor(kind, lambda e: fn(*[r(e) for r in rows]), vector)


def _null_safe(kind: str, fn: Callable, args: list) -> Executor:
    """An executor that yields null when any argument is null, else `fn(*values)`."""
    rows = [a.row for a in args]

    def row(e):
        values = [r(e) for r in rows]
        if any(v is None for v in values):
            return None
        return fn(*values)

    return Executor(kind, row)


# --------------------------------------------------------------------------- core functions

_TYPE_NAMES = ("string", "int", "long", "float", "double", "bool")


@function("convert")
def _convert(node, args, scope):
    _arity(node, args, 2)
    target = _const_string(node, args[1], 2).lower()
    if target not in _TYPE_NAMES:
        raise app_error("2nd argument of convert() must be one of string, int, long, float, double, bool", node)
    source = args[0].type
    fn = _converter(source, target)
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
    stripped = text.strip().rstrip("dDfF") if text.strip()[-1:] in "dDfF" else text.strip()
    if re.fullmatch(r"[+-]?(NaN|Infinity)", stripped):
        return float(stripped.replace("Infinity", "inf"))
    if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", stripped):
        raise ValueError(text)
    return float(stripped)


def _converter(source: str, target: str) -> Callable:
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
    # target bool
    if source == "string":
        return lambda v: v.lower() == "true"
    return lambda v: v == 1


@function("cast")
def _cast(node, args, scope):
    _arity(node, args, 2)
    target = _const_string(node, args[1], 2).lower()
    if target not in _TYPE_NAMES:
        raise app_error("2nd argument of cast() must be one of int, long, float, double, bool, string", node)
    inner = args[0].row
    # cast() only relabels the value (Integer -> Long is its one conversion)
    return Executor(target, inner)


@function("coalesce")
def _coalesce(node, args, scope):
    _arity(node, args, 1, 99)
    kind = args[0].type
    if any(a.type != kind for a in args):
        raise app_error("all arguments of coalesce() must have the same type", node)
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
        vector = lambda c: pc.coalesce(*[v(c) for v in vectors])  # noqa: E731
    return Executor(kind, row, vector)


@function("ifThenElse")
def _if_then_else(node, args, scope):
    _arity(node, args, 3)
    condition, then, otherwise = args
    if condition.type != "bool":
        raise app_error("1st argument of ifThenElse() must be a bool condition", node)
    if then.type != otherwise.type:
        raise app_error(
            f"2nd and 3rd arguments of ifThenElse() must have the same type, but found {then.type} and {otherwise.type}",
            node,
        )
    c, t, o = condition.row, then.row, otherwise.row
    vector = None
    if condition.arrow and then.arrow and otherwise.arrow:
        cv, tv, ov = condition.arrow, then.arrow, otherwise.arrow
        vector = lambda chunk: pc.if_else(pc.fill_null(cv(chunk), False), tv(chunk), ov(chunk))  # noqa: E731
    return Executor(then.type, lambda e: t(e) if c(e) is True else o(e), vector)


def _instance_of(java_type: str):
    def compile_instance_of(node, args, scope):
        _arity(node, args, 1)
        kind = args[0].type
        inner = args[0].row

        def test(value):
            if value is None:
                return False
            if kind == "object":
                return java_class(value, kind) == java_type
            return JAVA_CLASS[kind] == java_type

        return Executor("bool", lambda e: test(inner(e)))

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
def _default(node, args, scope):
    _arity(node, args, 2)
    value, fallback = args
    if value.type != fallback.type:
        raise app_error(
            f"2nd argument of default() must have the type of the 1st ({value.type}), but found {fallback.type}", node
        )
    v, d = value.row, fallback.row
    return Executor(value.type, lambda e: d(e) if (x := v(e)) is None else x)


def _extreme(largest: bool):
    def compile_extreme(node, args, scope):
        _arity(node, args, 1, 99)
        kind = args[0].type
        if kind not in NUMERIC or any(a.type != kind for a in args):
            raise app_error(f"all arguments of {node.name}() must have the same numeric type", node)
        if len(args) == 1:
            return Executor(kind, args[0].row)
        rows = [a.row for a in args]
        # Siddhi starts from Double.MIN_VALUE (the smallest positive double) or MAX_VALUE
        start = 5e-324 if largest else 1.7976931348623157e308
        to_kind = _converter("double", kind) if kind != "double" else (lambda v: v)

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
def _uuid(node, args, scope):
    _arity(node, args, 0)
    return Executor("string", lambda e: str(uuid.uuid4()))


@function("currentTimeMillis")
def _current_time(node, args, scope):
    _arity(node, args, 0)
    clock = scope.context.clock
    return Executor("long", lambda e: clock.now())


@function("eventTimestamp")
def _event_timestamp(node, args, scope):
    _arity(node, args, 0, 1)
    if args:
        raise app_error("eventTimestamp(event) is only valid in patterns and sequences (issue 9)", node)
    return Executor("long", lambda e: e.timestamp)


# --------------------------------------------------------------------------- str: functions


def _strings(node, args, count: int | None = None):
    for i, a in enumerate(args):
        if a.type != "string" and (count is None or i < count):
            raise app_error(f"argument {i + 1} of {node.qualified_name}() must be a string, but found {a.type}", node)


@function("str:concat")
def _concat(node, args, scope):
    _arity(node, args, 1, 99)
    kinds = [a.type for a in args]
    return _simple("string", lambda *vs: "".join(java_str(v, k) for v, k in zip(vs, kinds) if v is not None), args)


def _string_unary(kind: str, fn: Callable):
    def compile_unary(node, args, scope):
        _arity(node, args, 1)
        _strings(node, args)
        return _null_safe(kind, fn, args)

    return compile_unary


FUNCTIONS["str:length"] = _string_unary("int", len)
FUNCTIONS["str:upper"] = _string_unary("string", str.upper)
FUNCTIONS["str:lower"] = _string_unary("string", str.lower)
FUNCTIONS["str:trim"] = _string_unary("string", lambda s: s.strip(" \t\n\r\x0b\x0c\x00"))
FUNCTIONS["str:reverse"] = _string_unary("string", lambda s: s[::-1])
FUNCTIONS["str:isEmpty"] = _string_unary("bool", lambda s: s == "")


def _string_binary(kind: str, fn: Callable):
    def compile_binary(node, args, scope):
        _arity(node, args, 2)
        _strings(node, args)
        return _null_safe(kind, fn, args)

    return compile_binary


FUNCTIONS["str:contains"] = _string_binary("bool", lambda s, sub: sub in s)
FUNCTIONS["str:equalsIgnoreCase"] = _string_binary("bool", lambda a, b: a.lower() == b.lower())
FUNCTIONS["str:startsWith"] = _string_binary("bool", lambda s, p: s.startswith(p))
FUNCTIONS["str:endsWith"] = _string_binary("bool", lambda s, p: s.endswith(p))
FUNCTIONS["str:regexp"] = _string_binary("bool", lambda s, rx: re.fullmatch(rx, s) is not None)


@function("str:replaceAll", "str:replaceFirst")
def _replace(node, args, scope):
    _arity(node, args, 3)
    _strings(node, args)
    count = 0 if node.name == "replaceAll" else 1
    return _null_safe("string", lambda s, rx, rep: re.sub(rx, rep.replace("$", "\\"), s, count=count), args)


@function("str:substr")
def _substr(node, args, scope):
    _arity(node, args, 2, 3)
    _strings(node, args, 1)
    if any(a.type != "int" for a in args[1:]):
        raise app_error("start and length of str:substr() must be int", node)
    return _null_safe("string", lambda s, start, length=None: s[start:] if length is None else s[start : start + length], args)


@function("str:charAt")
def _char_at(node, args, scope):
    _arity(node, args, 2)
    _strings(node, args, 1)
    return _null_safe("string", lambda s, i: s[i], args)


# --------------------------------------------------------------------------- math: functions


def _numbers(node, args):
    for i, a in enumerate(args):
        if a.type not in NUMERIC:
            raise app_error(f"argument {i + 1} of {node.qualified_name}() must be numeric, but found {a.type}", node)


def _math_double(fn: Callable, arity: int = 1):
    def compile_math(node, args, scope):
        _arity(node, args, arity)
        _numbers(node, args)

        def safe(*values):
            try:
                return fn(*[float(v) for v in values])
            except (ValueError, OverflowError):
                return math.nan

        return _null_safe("double", safe, args)

    return compile_math


FUNCTIONS["math:sqrt"] = _math_double(math.sqrt)
FUNCTIONS["math:ln"] = _math_double(math.log)
FUNCTIONS["math:log10"] = _math_double(math.log10)
FUNCTIONS["math:exp"] = _math_double(math.exp)
FUNCTIONS["math:sin"] = _math_double(math.sin)
FUNCTIONS["math:cos"] = _math_double(math.cos)
FUNCTIONS["math:tan"] = _math_double(math.tan)
FUNCTIONS["math:ceil"] = _math_double(math.ceil)
FUNCTIONS["math:floor"] = _math_double(math.floor)
FUNCTIONS["math:power"] = _math_double(math.pow, 2)


@function("math:abs")
def _abs(node, args, scope):
    _arity(node, args, 1)
    _numbers(node, args)
    return _null_safe(args[0].type, abs, args)


@function("math:round")
def _round(node, args, scope):
    _arity(node, args, 1)
    _numbers(node, args)
    kind = "int" if args[0].type in ("int", "float") else "long"
    bits = 32 if kind == "int" else 64
    return _null_safe(kind, lambda v: java_float_to_int(math.floor(float(v) + 0.5), bits), args)


@function("math:max", "math:min")
def _math_extreme(node, args, scope):
    _arity(node, args, 2)
    _numbers(node, args)
    kind = typeinfer.widest(args[0].type, args[1].type)
    lc = converter(args[0].type, kind) or (lambda v: v)
    rc = converter(args[1].type, kind) or (lambda v: v)
    pick = max if node.name == "max" else min
    return _null_safe(kind, lambda a, b: pick(lc(a), rc(b)), args)


@function("math:pi")
def _pi(node, args, scope):
    _arity(node, args, 0)
    return constant(math.pi, "double")
