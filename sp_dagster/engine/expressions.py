"""Compile SiddhiQL expressions into executors (executor.py) with Java's semantics.
Apps reach the compiler validated by sp_dagster.siddhi (names and types are right), so it only
decides how to compute, with the parser's type rules; names are resolved by a Scope, so one
compiler serves streams, selectors, joins and patterns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sp_dagster.engine.aggregators import AGGREGATORS
from sp_dagster.engine.errors import app_error

# The executor and scope types are the compiler's vocabulary: re-exported, so a module compiling
# expressions imports one place.
from sp_dagster.engine.executor import Executor as Executor
from sp_dagster.engine.executor import JoinedScope as JoinedScope
from sp_dagster.engine.executor import OutputScope as OutputScope
from sp_dagster.engine.executor import Row as Row
from sp_dagster.engine.executor import Scope as Scope
from sp_dagster.engine.executor import StreamScope as StreamScope
from sp_dagster.engine.executor import Vector as Vector
from sp_dagster.engine.executor import attribute as attribute
from sp_dagster.engine.executor import constant as constant
from sp_dagster.engine.executor import converter as converter
from sp_dagster.engine.executor import locate as locate
from sp_dagster.engine.executor import materialize as materialize
from sp_dagster.engine.executor import sides_of as sides_of
from sp_dagster.engine.functions import FUNCTIONS
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
from sp_dagster.siddhi.functions import FUNCTIONS as FUNCTION_SPECS
from sp_dagster.siddhi.types import widest

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
        result = Executor("bool", lambda e: row(e) is None, (lambda c: pc.is_null(vector(c))) if vector else None)  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes it at import
        result.aggregators = operand.aggregators
        return result
    if isinstance(node, ast.FunctionCall):
        return compile_call(node, scope)
    if isinstance(node, ast.In):
        return compile_in(node, scope)
    if isinstance(node, ast.StreamRef):
        raise app_error("event references are only valid in patterns and sequences", node)
    raise app_error(f"unsupported expression {type(node).__name__}", node)


def compile_call(node: ast.FunctionCall, scope: Scope) -> Executor:
    """Compile a function or aggregator call (argument types were checked by validation)."""
    name = node.qualified_name  # support.check_supported has rejected what is not implemented
    if node.namespace is None and name in AGGREGATORS:
        if scope.aggregation is None:
            raise app_error(f"aggregator {name}() is only allowed in select and having", node)
        args = [compile_expression(arg, scope) for arg in node.args]
        return scope.aggregation.compile(node, args)
    compiler = FUNCTIONS[name]
    args = [compile_expression(arg, scope) for arg in node.args]
    spec = FUNCTION_SPECS.get(name)
    returns = spec.returns if spec is not None else None
    kind = returns([a.type for a in args], node.args) if returns is not None else None
    result = compiler(node, args, kind, scope)
    result.aggregators = tuple(a for arg in args for a in arg.aggregators)
    return result


def compile_in(node: ast.In, scope) -> Executor:
    """`condition in T`: true when some row of table T satisfies the condition."""
    tables = getattr(scope.context, "tables", {})
    if node.table not in tables:
        raise app_error(f"'{node.table}' is not a table", node)
    table = tables[node.table]
    sides = sides_of(scope)
    width = max((offset + len(schema) for _, schema, offset in sides), default=0)
    joined = JoinedScope([*sides, ((table.name,), table.schema, width)], scope.context)
    condition = table.compile_condition(node.operand, joined, width)
    contains = table.contains

    def row(event):
        data = event.data
        if len(data) != width:
            data = tuple(data[:width]) + (None,) * (width - len(data))
        return contains(condition, data, event.timestamp)

    return Executor("bool", row)


def _is_stream_ref(node: ast.Variable, scope: Scope) -> bool:
    names = getattr(scope, "names", ())
    schema = getattr(scope, "schema", None)
    return node.name in names and (schema is None or schema.index(node.name) is None)


def _constant(node: ast.Constant) -> Executor:
    return constant(coerce(node.value, node.type), node.type)


# --------------------------------------------------------------------------- arithmetic


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
        vector = _arrow_arithmetic(node.op, kind, left.arrow, right.arrow)
    result = Executor(kind, row, vector)
    if left.constant and right.constant:
        value = row(None)
        result = constant(value, kind)
    return result


def _arrow_arithmetic(op: str, kind: str, lvec: Vector, rvec: Vector) -> Vector:
    target = ARROW_TYPES[kind]
    function = getattr(pc, _ARROW_OPS[op])

    def vector(chunk):
        a = pc.cast(lvec(chunk), target)
        b = pc.cast(rvec(chunk), target)
        if op == "/":
            b = pc.if_else(pc.equal(b, pa.scalar(0, target)), pa.scalar(None, target), b)  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes it at import
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
    "==": pc.equal,  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes it at import
    "!=": pc.not_equal,  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes it at import
    ">": pc.greater,  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes it at import
    "<": pc.less,  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes it at import
    ">=": pc.greater_equal,  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes it at import
    "<=": pc.less_equal,  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes it at import
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

    vector: Vector | None = None
    if left.arrow and right.arrow:
        function = _ARROW_COMPARE[node.op]
        target = ARROW_TYPES[kind]
        lvec, rvec = left.arrow, right.arrow

        def compare_vector(chunk):
            return pc.fill_null(function(pc.cast(lvec(chunk), target), pc.cast(rvec(chunk), target)), False)

        vector = compare_vector
    return Executor("bool", row, vector)


def _logical(node: ast.BinaryOp, left: Executor, right: Executor) -> Executor:
    lrow, rrow = left.row, right.row
    if node.op == "and":
        row = lambda e: lrow(e) is True and rrow(e) is True  # noqa: E731
        arrow_function = pc.and_  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes it at import
    else:
        row = lambda e: lrow(e) is True or rrow(e) is True  # noqa: E731
        arrow_function = pc.or_  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes it at import
    vector: Vector | None = None
    if left.arrow and right.arrow:
        lvec, rvec = left.arrow, right.arrow

        def logical_vector(chunk):
            return arrow_function(pc.fill_null(lvec(chunk), False), pc.fill_null(rvec(chunk), False))

        vector = logical_vector
    return Executor("bool", row, vector)


def _not(operand: Executor) -> Executor:
    inner = operand.row
    vector: Vector | None = None
    if operand.arrow:
        ivec = operand.arrow

        def not_vector(chunk):
            return pc.invert(pc.fill_null(ivec(chunk), False))  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes it at import

        vector = not_vector
    # Siddhi's not: anything but TRUE (false or null) gives true
    return Executor("bool", lambda e: inner(e) is not True, vector)
