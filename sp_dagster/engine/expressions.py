"""Compile SiddhiQL expressions into executors with Java's semantics.

Apps reach the compiler validated by sp_dagster.siddhi (names and types are right), so the
compiler only decides how to compute, with the parser's type rules. An Executor evaluates one
expression. `row(event)` works on one StreamEvent and is always
there; `arrow(chunk)` evaluates a whole ArrowChunk with pyarrow.compute and is there only
where the vectorised form is exactly equal to the row form (otherwise None, and the query
runs row by row). Names are resolved by a Scope, so the same compiler serves plain
streams, selectors (output attributes) and, later, joins and patterns.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from sp_dagster.engine.errors import app_error
from sp_dagster.engine.schema import Schema
from sp_dagster.engine.values import (
    ARROW_TYPES,
    NUMERIC,
    coerce,
    f32,
    java_int_div,
    java_int_rem,
    wrap_int,
    wrap_long,
)
from sp_dagster.siddhi import ast
from sp_dagster.siddhi.types import widest

Row = Callable[[Any], Any]
Vector = Callable[[Any], Any]


class Executor:
    """One compiled expression: its Siddhi type, a row function and maybe a vector function."""

    __slots__ = ("type", "row", "arrow", "constant", "value", "aggregators")

    def __init__(self, type: str, row: Row, arrow: Vector | None = None, *, constant: bool = False, value=None):
        self.type = type
        self.row = row
        self.arrow = arrow
        self.constant = constant
        self.value = value
        self.aggregators: tuple = ()


def constant(value, kind: str) -> Executor:
    """An executor that always yields `value` (already in the engine's representation)."""
    arrow_type = ARROW_TYPES.get(kind)
    scalar = pa.scalar(value, type=arrow_type) if arrow_type is not None else None
    return Executor(kind, lambda e: value, (lambda c: scalar) if scalar is not None else None, constant=True, value=value)


# --------------------------------------------------------------------------- scopes


class Scope:
    """Resolves attribute names; decides whether aggregators and which functions are allowed."""

    def __init__(self, context=None, aggregation=None):
        self.context = context  # the runtime context: clock, function registry extras
        self.aggregation = aggregation  # an AggregationContext where aggregators may appear

    def variable(self, node: ast.Variable) -> Executor:
        """The executor reading attribute `node`."""
        raise NotImplementedError


class StreamScope(Scope):
    """Attributes of one stream, referred to bare or qualified by the stream id (or alias)."""

    def __init__(self, schema: Schema, names: tuple[str, ...], context=None, aggregation=None, inner: bool = False):
        super().__init__(context, aggregation)
        self.schema = schema
        self.names = names
        self.inner = inner

    def variable(self, node: ast.Variable) -> Executor:
        if node.index is not None:
            raise app_error("indexed event references (e[0].x) are only valid in patterns and sequences", node)
        if node.stream is not None and (node.stream not in self.names or node.inner != self.inner):
            shown = ("#" if node.inner else "") + node.stream
            raise app_error(f"'{shown}' is not an input of this query", node)
        index = self.schema.index(node.name)
        if index is None:
            raise app_error(
                f"stream {self.names[0]} has no attribute '{node.name}'; it has {', '.join(self.schema.names)}", node
            )
        return attribute(index, self.schema.types[index])


class JoinedScope(Scope):
    """Attributes of several inputs laid side by side in one event (joins, tables' `on` and `in`).

    Each side is (names it is qualified by, schema, offset of its first attribute in the
    joined data); an unqualified name is the first side's that has it.
    """

    def __init__(self, sides: list[tuple[tuple[str, ...], Schema, int]], context=None, aggregation=None):
        super().__init__(context, aggregation)
        self.sides = sides

    def variable(self, node: ast.Variable) -> Executor:
        if node.index is not None:
            raise app_error("indexed event references (e[0].x) are only valid in patterns and sequences", node)
        found = locate(node, self.sides)
        if found is None:
            where = node.stream or "the inputs of this query"
            raise app_error(f"{where} has no attribute '{node.name}'", node)
        side, index = found
        _names, schema, offset = self.sides[side]
        return attribute(offset + index, schema.types[index])


def locate(node: ast.Variable, sides: list[tuple[tuple[str, ...], Schema, int]]) -> tuple[int, int] | None:
    """(side, attribute index in that side) a variable reads: the first side that has it, or None."""
    for side, (names, schema, _offset) in enumerate(sides):
        if node.stream is not None and node.stream not in names:
            continue
        index = schema.index(node.name)
        if index is not None:
            return side, index
    return None


def sides_of(scope: Scope) -> list[tuple[tuple[str, ...], Schema, int]]:
    """The sides of `scope` (a stream scope is one side), for scopes that add a table."""
    if isinstance(scope, JoinedScope):
        return list(scope.sides)
    if isinstance(scope, StreamScope):
        return [(scope.names, scope.schema, 0)]
    if isinstance(scope, OutputScope):
        return sides_of(scope.inner)
    raise TypeError(f"no sides in {type(scope).__name__}")


class OutputScope(Scope):
    """A selector's output attributes first (having, order by), then the input attributes."""

    def __init__(self, output: Schema, inner: Scope, aggregation=None):
        super().__init__(inner.context, aggregation)
        self.output = output
        self.inner = inner

    def variable(self, node: ast.Variable) -> Executor:
        index = self.output.index(node.name)
        if node.stream is None and index is not None:
            kind = self.output.types[index]
            return Executor(kind, lambda e: e.output[index])
        return self.inner.variable(node)


def attribute(index: int, kind: str) -> Executor:
    """The executor reading attribute `index` of the input data."""
    vector = (lambda c: c.batch.column(index)) if kind in ARROW_TYPES else None
    return Executor(kind, lambda e: e.data[index], vector)


# --------------------------------------------------------------------------- compiler


def compile_expression(node: ast.Expression, scope: Scope) -> Executor:
    """Compile `node` against `scope`; raise SiddhiQLError at the node for any mistake."""
    if isinstance(node, ast.Constant):
        return _constant(node)
    if isinstance(node, ast.TimeConstant):
        return constant(node.millis, "long")
    if isinstance(node, ast.Variable):
        return scope.variable(node)
    if isinstance(node, ast.BinaryOp):
        left = compile_expression(node.left, scope)
        right = compile_expression(node.right, scope)
        if node.op in ast.ARITHMETIC_OPERATORS:
            result = _arithmetic(node, left, right)
        elif node.op in ast.COMPARISON_OPERATORS:
            result = _compare(node, left, right)
        else:
            result = _logical(node, left, right)
        result.aggregators = left.aggregators + right.aggregators
        return result
    if isinstance(node, ast.Not):
        operand = compile_expression(node.operand, scope)
        result = _not(operand)
        result.aggregators = operand.aggregators
        return result
    if isinstance(node, ast.IsNull):
        event_ref = getattr(scope, "event_ref", None)
        reference = event_ref(node.operand) if event_ref is not None else None
        if reference is not None:
            read = reference.row
            return Executor("bool", lambda e: read(e) is None)
        if isinstance(node.operand, ast.Variable) and node.operand.stream is None and _is_stream_ref(node.operand, scope):
            raise app_error("'<event> is null' is only valid in patterns and sequences", node)
        operand = compile_expression(node.operand, scope)
        row = operand.row
        vector = operand.arrow
        result = Executor("bool", lambda e: row(e) is None, (lambda c: pc.is_null(vector(c))) if vector else None)
        result.aggregators = operand.aggregators
        return result
    if isinstance(node, ast.FunctionCall):
        from sp_dagster.engine.functions import compile_call

        return compile_call(node, scope)
    if isinstance(node, ast.In):
        from sp_dagster.engine.tables import compile_in

        return compile_in(node, scope)
    if isinstance(node, ast.StreamRef):
        raise app_error("event references are only valid in patterns and sequences", node)
    raise app_error(f"unsupported expression {type(node).__name__}", node)


def _is_stream_ref(node: ast.Variable, scope: Scope) -> bool:
    names = getattr(scope, "names", ())
    schema = getattr(scope, "schema", None)
    return node.name in names and (schema is None or schema.index(node.name) is None)


def _constant(node: ast.Constant) -> Executor:
    return constant(coerce(node.value, node.type), node.type)


# --------------------------------------------------------------------------- arithmetic


def converter(source: str, target: str) -> Callable[[Any], Any] | None:
    """How a non-null value of numeric type `source` becomes `target` in Java (None: as is)."""
    if source == target:
        return None
    if target == "float":
        return lambda v: f32(float(v))
    if target == "double":
        return float
    return None  # int -> long


def _numeric_op(op: str, kind: str) -> Callable[[Any, Any], Any]:
    if kind in ("int", "long"):
        wrap = wrap_int if kind == "int" else wrap_long
        if op == "+":
            return lambda a, b: wrap(a + b)
        if op == "-":
            return lambda a, b: wrap(a - b)
        if op == "*":
            return lambda a, b: wrap(a * b)
        if op == "/":
            return lambda a, b: None if b == 0 else wrap(java_int_div(a, b))
        return lambda a, b: None if b == 0 else java_int_rem(a, b)
    # double arithmetic rounded once to 32 bits equals float arithmetic (53 >= 2*24+2 bits)
    rnd = f32 if kind == "float" else (lambda v: v)
    if op == "+":
        return lambda a, b: rnd(a + b)
    if op == "-":
        return lambda a, b: rnd(a - b)
    if op == "*":
        return lambda a, b: rnd(a * b)
    if op == "/":
        return lambda a, b: None if b == 0 else rnd(a / b)
    return lambda a, b: None if b == 0 else rnd(_fmod(a, b))


def _fmod(a: float, b: float) -> float:
    try:
        return math.fmod(a, b)
    except ValueError:  # inf % x is NaN in Java
        return math.nan


_ARROW_OPS = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide"}


def _arithmetic(node: ast.BinaryOp, left: Executor, right: Executor) -> Executor:
    kind = widest(left.type, right.type)
    op = _numeric_op(node.op, kind)
    lconv, rconv = converter(left.type, kind), converter(right.type, kind)
    lrow, rrow = left.row, right.row
    if right.constant:
        c = right.value if right.value is None or rconv is None else rconv(right.value)
        if c is None:
            row = lambda e: None  # noqa: E731
        elif lconv is None:
            row = lambda e: None if (a := lrow(e)) is None else op(a, c)  # noqa: E731
        else:
            row = lambda e: None if (a := lrow(e)) is None else op(lconv(a), c)  # noqa: E731
    else:
        lc = lconv or (lambda v: v)
        rc = rconv or (lambda v: v)

        def row(e):
            a = lrow(e)
            if a is None:
                return None
            b = rrow(e)
            if b is None:
                return None
            return op(lc(a), rc(b))

    vector = None
    if left.arrow and right.arrow and (node.op in ("+", "-", "*") or (node.op == "/" and kind in ("float", "double"))):
        vector = _arrow_arithmetic(node.op, kind, left, right)
    result = Executor(kind, row, vector)
    if left.constant and right.constant:
        value = row(None)
        result = constant(value, kind)
    return result


def _arrow_arithmetic(op: str, kind: str, left: Executor, right: Executor) -> Vector:
    target = ARROW_TYPES[kind]
    function = getattr(pc, _ARROW_OPS[op])
    lvec, rvec = left.arrow, right.arrow

    def vector(chunk):
        a = pc.cast(lvec(chunk), target)
        b = pc.cast(rvec(chunk), target)
        if op == "/":
            b = pc.if_else(pc.equal(b, pa.scalar(0, target)), pa.scalar(None, target), b)
        return function(a, b)

    return vector


# --------------------------------------------------------------------------- comparison and logic

_PY_COMPARE = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
}
_ARROW_COMPARE = {
    "==": pc.equal,
    "!=": pc.not_equal,
    ">": pc.greater,
    "<": pc.less,
    ">=": pc.greater_equal,
    "<=": pc.less_equal,
}


def _compare(node: ast.BinaryOp, left: Executor, right: Executor) -> Executor:
    test = _PY_COMPARE[node.op]
    if left.type in NUMERIC and right.type in NUMERIC:
        kind = widest(left.type, right.type)
        lc = converter(left.type, kind) or (lambda v: v)
        rc = converter(right.type, kind) or (lambda v: v)
    else:
        kind = left.type
        lc = rc = lambda v: v  # noqa: E731
    lrow, rrow = left.row, right.row
    if right.constant:
        c = None if right.value is None else rc(right.value)

        def row(e):
            a = lrow(e)
            return a is not None and c is not None and test(lc(a), c)

    else:

        def row(e):
            a = lrow(e)
            if a is None:
                return False
            b = rrow(e)
            return b is not None and test(lc(a), rc(b))

    vector = None
    if left.arrow and right.arrow:
        function = _ARROW_COMPARE[node.op]
        target = ARROW_TYPES[kind]
        lvec, rvec = left.arrow, right.arrow

        def vector(chunk):
            return pc.fill_null(function(pc.cast(lvec(chunk), target), pc.cast(rvec(chunk), target)), False)

    return Executor("bool", row, vector)


def _logical(node: ast.BinaryOp, left: Executor, right: Executor) -> Executor:
    lrow, rrow = left.row, right.row
    if node.op == "and":
        row = lambda e: lrow(e) is True and rrow(e) is True  # noqa: E731
        arrow_function = pc.and_
    else:
        row = lambda e: lrow(e) is True or rrow(e) is True  # noqa: E731
        arrow_function = pc.or_
    vector = None
    if left.arrow and right.arrow:
        lvec, rvec = left.arrow, right.arrow

        def vector(chunk):
            return arrow_function(pc.fill_null(lvec(chunk), False), pc.fill_null(rvec(chunk), False))

    return Executor("bool", row, vector)


def _not(operand: Executor) -> Executor:
    inner = operand.row
    vector = None
    if operand.arrow:
        ivec = operand.arrow

        def vector(chunk):
            return pc.invert(pc.fill_null(ivec(chunk), False))

    # Siddhi's not: anything but TRUE (false or null) gives true
    return Executor("bool", lambda e: inner(e) is not True, vector)


def materialize(value, length: int, kind: str) -> pa.Array:
    """An Arrow array of `length` rows from an executor's vector result (array or scalar)."""
    if isinstance(value, pa.Scalar):
        return pa.array([value.as_py()] * length, type=ARROW_TYPES[kind])
    if isinstance(value, pa.ChunkedArray):
        return value.combine_chunks()
    return value
