"""What an aggregation keeps: its group-by keys, latest-value attributes and base aggregates.
Per bucket and group it keeps the base aggregates Siddhi keeps (AGG_SUM_x, AGG_COUNT, AGG_MIN_x,
AGG_MAX_x, AGG_SET_x) and the latest value of every plain expression; the outputs (avg,
distinctCount, ...) are computed from them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sp_dagster.engine.errors import app_error
from sp_dagster.engine.expressions import StreamScope, compile_expression
from sp_dagster.engine.schema import Schema
from sp_dagster.engine.values import java_int_div
from sp_dagster.siddhi import ast

INTEGRAL = ("int", "long")
#: The incremental aggregators and the base aggregates each needs.
FUNCTIONS = ("sum", "count", "avg", "min", "max", "distinctCount")


@dataclass(frozen=True)
class Base:
    """One base aggregate: its column, how an event starts it and how two are merged."""

    column: str  # AGG_SUM_price, AGG_COUNT, ...
    kind: str  # sum, count, min, max, set
    type: str  # the column's Siddhi type ('object' for a set)
    read: Callable | None  # the event's value (None for count)


def _merge_sum(a, b):
    return b if a is None else a if b is None else a + b


def _merge_min(a, b):
    return b if a is None else a if b is None else (b if b < a else a)


def _merge_max(a, b):
    return b if a is None else a if b is None else (b if b > a else a)


def _merge_set(a, b):
    return a | b


MERGE = {"sum": _merge_sum, "count": _merge_sum, "min": _merge_min, "max": _merge_max, "set": _merge_set}


@dataclass(frozen=True)
class Output:
    """One selected attribute: where its value comes from."""

    name: str
    type: str
    source: str  # 'group', 'last' or 'function'
    index: int  # into the group keys, the latest values, or -1
    compute: Callable | None = None  # bases -> value, for functions


class Plan:
    """The compiled selection of one aggregation definition."""

    def __init__(self, definition: ast.AggregationDefinition, schema: Schema, context):
        self.name = definition.name
        scope = StreamScope(schema, (definition.input.stream,), context)
        self.group_names: list[str] = []
        self.group_types: list[str] = []
        self.group_reads: list[Callable] = []
        for variable in definition.selector.group_by:
            executor = compile_expression(variable, scope)
            self.group_names.append(variable.name)
            self.group_types.append(executor.type)
            self.group_reads.append(executor.row)
        self.last_names: list[str] = []
        self.last_types: list[str] = []
        self.last_reads: list[Callable] = []
        self.bases: list[Base] = []
        self.outputs: list[Output] = []
        for attribute in definition.selector.attributes:
            self.outputs.append(self._output(attribute, scope))
        self.merges = [MERGE[b.kind] for b in self.bases]

    def _base(self, kind: str, variable: ast.Variable | None, executor) -> int:
        if kind == "count":
            column, kind_type, read = "AGG_COUNT", "long", None
        else:
            prefix = {"sum": "AGG_SUM_", "min": "AGG_MIN_", "max": "AGG_MAX_", "set": "AGG_SET_"}[kind]
            assert variable is not None  # every base but count reads an attribute
            column = prefix + variable.name
            if kind == "sum":
                kind_type = "long" if executor.type in INTEGRAL else "double"
                widen = int if kind_type == "long" else float
                source = executor.row
                read = lambda e, source=source, widen=widen: None if (v := source(e)) is None else widen(v)  # noqa: E731
            else:
                kind_type = "object" if kind == "set" else executor.type
                read = executor.row
        for index, base in enumerate(self.bases):
            if base.column == column:
                return index
        self.bases.append(Base(column, kind, kind_type, read))
        return len(self.bases) - 1

    def _output(self, attribute: ast.OutputAttribute, scope) -> Output:
        expression = attribute.expression
        name = attribute.name
        if isinstance(expression, ast.FunctionCall) and expression.namespace is None and expression.name in FUNCTIONS:
            return self._function(expression, name, scope)
        if isinstance(expression, ast.Variable) and expression.name in self.group_names and name is not None:
            index = self.group_names.index(expression.name)
            return Output(name, self.group_types[index], "group", index)
        executor = compile_expression(expression, scope)
        if name is None:
            raise app_error("an aggregation's selected expression needs a name ('as name')", attribute)
        self.last_names.append(name)
        self.last_types.append(executor.type)
        self.last_reads.append(executor.row)
        return Output(name, executor.type, "last", len(self.last_names) - 1)

    def _function(self, call: ast.FunctionCall, name: str | None, scope) -> Output:
        function = call.name
        if name is None:
            raise app_error(f"{function}() in an aggregation needs a name ('as name')", call)
        if function == "count":
            count = self._base("count", None, None)
            return Output(name, "long", "function", -1, lambda bases: bases[count])
        if len(call.args) != 1 or not isinstance(call.args[0], ast.Variable):
            raise app_error(f"Incremental aggregator {function}() takes one attribute of the input stream", call)
        variable = call.args[0]
        executor = compile_expression(variable, scope)
        kind = executor.type
        if function == "sum":
            index = self._base("sum", variable, executor)
            return Output(name, self.bases[index].type, "function", -1, lambda bases: bases[index])
        if function == "avg":
            total = self._base("sum", variable, executor)
            count = self._base("count", None, None)
            if kind in INTEGRAL:
                return Output(name, "long", "function", -1, lambda b: None if b[total] is None else java_int_div(b[total], b[count]))
            return Output(name, "double", "function", -1, lambda b: None if b[total] is None else b[total] / b[count])
        if function in ("min", "max"):
            index = self._base(function, variable, executor)
            return Output(name, kind, "function", -1, lambda bases: bases[index])
        index = self._base("set", variable, executor)  # distinctCount
        return Output(name, "int", "function", -1, lambda bases: len(bases[index]))

    # -- per event

    def start_bases(self, event) -> list:
        """The base aggregates of one event."""
        values = []
        for base in self.bases:
            if base.kind == "count":
                values.append(1)
            elif base.kind == "set":
                values.append(frozenset((base.read(event),)))  # pyright: ignore[reportOptionalCall]  # only count has no read
            else:
                values.append(base.read(event))  # pyright: ignore[reportOptionalCall]  # only count has no read
        return values

    def merge(self, into: list, other: list) -> None:
        """Fold the base aggregates `other` into `into`."""
        for index, merge in enumerate(self.merges):
            into[index] = merge(into[index], other[index])

    def output_row(self, timestamp: int, groups: tuple, lasts: tuple, bases: list) -> tuple:
        """The aggregation's attributes (AGG_TIMESTAMP first) of one bucket of one group."""
        row = [timestamp]
        for output in self.outputs:
            if output.source == "group":
                row.append(groups[output.index])
            elif output.source == "last":
                row.append(lasts[output.index])
            else:
                row.append(output.compute(bases))  # pyright: ignore[reportOptionalCall]  # every function output has one
        return tuple(row)

    @property
    def output_schema(self) -> Schema:
        """AGG_TIMESTAMP and the selected attributes, with their types."""
        return Schema(("AGG_TIMESTAMP", *(o.name for o in self.outputs)), ("long", *(o.type for o in self.outputs)))
