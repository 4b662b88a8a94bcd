"""What compiled expressions are: an Executor per expression, and the Scopes that resolve attribute names.
These types sit below the expression compiler (expressions.py) and the modules it calls into
(functions.py, aggregators.py), so those modules never import the compiler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sp_dagster.engine.errors import app_error
from sp_dagster.engine.schema import Schema
from sp_dagster.engine.values import ARROW_TYPES, f32
from sp_dagster.siddhi import ast

Row = Callable[[Any], Any]
Vector = Callable[[Any], Any]


class Executor:
    """One compiled expression: its Siddhi type, a row function and maybe a vector function.

    `row(event)` works on one StreamEvent and is always there; `arrow(chunk)` evaluates a whole
    ArrowChunk with pyarrow.compute and is there only where the vectorised form is exactly equal
    to the row form (otherwise None, and the query runs row by row).
    """

    __slots__ = ("type", "row", "arrow", "constant", "value", "aggregators", "reads")

    def __init__(self, type: str, row: Row, arrow: Vector | None = None, *, constant: bool = False, value: Any = None):
        self.type = type
        self.row = row
        self.arrow = arrow
        self.constant = constant
        self.value = value
        self.aggregators: tuple = ()
        #: what `row` does when it only reads: ("data", i) is e.data[i], ("values", i) an
        #: aggregator's latest value (compilers of rows inline these reads); None otherwise
        self.reads: tuple[str, int] | None = None


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
            raise app_error(f"stream {self.names[0]} has no attribute '{node.name}'; it has {', '.join(self.schema.names)}", node)
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
    executor = Executor(kind, lambda e: e.data[index], vector)
    executor.reads = ("data", index)
    return executor


def converter(source: str, target: str) -> Callable[[Any], Any] | None:
    """How a non-null value of numeric type `source` becomes `target` in Java (None: as is)."""
    if source == target:
        return None
    if target == "float":
        return lambda v: f32(float(v))
    if target == "double":
        return float
    return None  # int -> long


def materialize(value, length: int, kind: str) -> pa.Array:
    """An Arrow array of `length` rows from an executor's vector result (array or scalar)."""
    if isinstance(value, pa.Scalar):
        return pa.array([value.as_py()] * length, type=ARROW_TYPES[kind])
    if isinstance(value, pa.ChunkedArray):
        return value.combine_chunks()
    return value
