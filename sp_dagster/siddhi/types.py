"""Siddhi's type rules: the type of every expression, and the type errors in it.
The rules are Siddhi's own (docs/siddhiql.md, Types): arithmetic takes the wider numeric type,
so `int / int` stays an integer division.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from sp_dagster.siddhi import ast
from sp_dagster.siddhi.functions import AGGREGATORS, FUNCTIONS, Spec, accepts, suggestion
from sp_dagster.siddhi.render import render_expression
from sp_dagster.siddhi.scope import Scope, Source

#: The Java class Siddhi delivers for each attribute type (what the conformance cases record).
JAVA_CLASSES = {
    "int": "Integer",
    "long": "Long",
    "float": "Float",
    "double": "Double",
    "string": "String",
    "bool": "Boolean",
    "object": "Object",
}

Report = Callable[[str, ast.Node], None]


def java_class(type_: str) -> str:
    """The Java class name of a SiddhiQL type (`int` -> `Integer`)."""
    return JAVA_CLASSES[type_]


def widest(left: str, right: str) -> str:
    """The type of arithmetic between two numeric types."""
    return max(left, right, key=ast.NUMERIC_TYPES.index)


def is_aggregate(call: ast.FunctionCall) -> bool:
    """True for a call of an aggregator such as `sum(...)` or `count()`."""
    return call.namespace is None and call.name in AGGREGATORS


class ExpressionChecker:
    """Infers expression types against a Scope, reporting each mistake once.

    `tables` maps table names to their attributes (for `in Table`); `report(message, node)`
    receives every error.
    """

    def __init__(self, report: Report, tables: dict[str, tuple[ast.AttributeDef, ...]]) -> None:
        self.report = report
        self.tables = tables

    def check(self, expression: ast.Expression, scope: Scope, *, aggregates: bool = False) -> str | None:
        """The type of `expression` (None when unknown after an error); aggregates allowed or not."""
        return self._type(expression, scope, "allowed" if aggregates else "forbidden")

    def _type(self, node: ast.Expression, scope: Scope, aggregates: str) -> str | None:
        if isinstance(node, (ast.Constant, ast.TimeConstant)):
            return node.type
        if isinstance(node, ast.Variable):
            return self._variable(node, scope)
        if isinstance(node, ast.FunctionCall):
            return self._call(node, scope, aggregates)
        if isinstance(node, ast.BinaryOp):
            return self._binary(node, scope, aggregates)
        if isinstance(node, ast.Not):
            self._expect_bool(node.operand, scope, aggregates, "'not'")
            return "bool"
        if isinstance(node, ast.IsNull):
            self._null_operand(node.operand, scope, aggregates)
            return "bool"
        if isinstance(node, ast.In):
            return self._in(node, scope, aggregates)
        if isinstance(node, ast.StreamRef):
            self.report("A stream reference such as e1[0] can only be tested with 'is null'.", node)
            return None
        raise TypeError(f"unknown expression node {type(node).__name__}")

    def _variable(self, node: ast.Variable, scope: Scope) -> str | None:
        resolution = scope.resolve(node)
        if resolution.error:
            self.report(resolution.error, node)
        return resolution.type

    def _null_operand(self, operand: ast.Expression, scope: Scope, aggregates: str) -> None:
        if isinstance(operand, ast.StreamRef):
            if operand.stream not in scope.events and not scope.incomplete:
                self.report(f"'{operand.stream}' is not an event of this pattern or sequence.", operand)
        elif not (isinstance(operand, ast.Variable) and operand.stream is None and scope.is_event(operand.name)):
            self._type(operand, scope, aggregates)

    def _expect_bool(self, node: ast.Expression, scope: Scope, aggregates: str, what: str) -> None:
        found = self._type(node, scope, aggregates)
        if found is not None and found != "bool":
            self.report(f"The operand of {what} must be bool, not {found}.", node)

    def _binary(self, node: ast.BinaryOp, scope: Scope, aggregates: str) -> str | None:
        if node.op in ast.LOGICAL_OPERATORS:
            self._expect_bool(node.left, scope, aggregates, f"'{node.op}'")
            self._expect_bool(node.right, scope, aggregates, f"'{node.op}'")
            return "bool"
        left = self._type(node.left, scope, aggregates)
        right = self._type(node.right, scope, aggregates)
        if node.op in ast.ARITHMETIC_OPERATORS:
            if left is None or right is None:
                return None
            if left not in ast.NUMERIC_TYPES or right not in ast.NUMERIC_TYPES:
                self.report(f"Operator '{node.op}' needs numbers, not {left} and {right}.", _operator(node))
                return None
            return widest(left, right)
        if left is not None and right is not None and not _comparable(node.op, left, right):
            self.report(f"Operator '{node.op}' cannot compare {left} with {right}.", _operator(node))
        return "bool"

    def _in(self, node: ast.In, scope: Scope, aggregates: str) -> str:
        attributes = self.tables.get(node.table)
        if attributes is None:
            self.report(f"'{node.table}' is not a table; 'in' needs a table.", _operator(node))
            self._expect_bool(node.operand, replace(scope, incomplete=True), aggregates, "'in'")
        else:
            source = Source(frozenset({node.table}), attributes)
            self._expect_bool(node.operand, scope.with_source(source), aggregates, "'in'")
        return "bool"

    def _call(self, node: ast.FunctionCall, scope: Scope, aggregates: str) -> str | None:
        name = node.qualified_name
        spec = FUNCTIONS.get(name) or (AGGREGATORS.get(name) if node.namespace is None else None)
        if spec is None:
            hint = suggestion({**FUNCTIONS, **AGGREGATORS}, name)
            self.report(f"Function '{name}' is not defined" + (f"; did you mean '{hint}'?" if hint else "."), node)
            for arg in node.args:
                self._type(arg, scope, aggregates)
            return None
        inner = aggregates
        if spec.aggregate:
            if aggregates == "forbidden":
                self.report(f"Aggregate function '{name}' can only be used in select and having.", node)
            elif aggregates == "inside":
                self.report(f"Aggregate function '{name}' cannot be used inside another aggregate.", node)
            inner = "inside"
        types = [self._type(arg, scope, inner) for arg in node.args]
        if not self._arguments_ok(spec, node, types):
            return None
        return spec.returns(types, node.args) if spec.returns else None

    def _arguments_ok(self, spec: Spec, node: ast.FunctionCall, types: list[str | None]) -> bool:
        return check_arguments(spec, node.qualified_name, node.args, types, self.report, node)


def check_arguments(
    spec: Spec,
    name: str,
    args: tuple[ast.Expression, ...],
    types: list[str | None],
    report: Report,
    at: ast.Node,
) -> bool:
    """Report wrong argument counts and types of a call of `spec`; True when all is well."""
    if not spec.arity_ok(len(args)):
        report(f"'{name}' takes {_arity(spec)}, not {len(args)}.", at)
        return False
    ok = True
    for position, (arg, found) in enumerate(zip(args, types)):
        kind = spec.kind_of(position)
        if kind == "attribute" and not isinstance(arg, ast.Variable):
            report(f"Argument {position + 1} of '{name}' must be an attribute, not {render_expression(arg)}.", arg)
            ok = False
        elif kind == "same" and found is not None and types[position - 1] not in (None, found):
            report(f"Argument {position + 1} of '{name}' must be {types[position - 1]} like the one before, not {found}.", arg)
            ok = False
        elif found is not None and not accepts(kind, found):
            report(f"Argument {position + 1} of '{name}' must be {_kind_words(kind)}, not {found}.", arg)
            ok = False
    if name in ("cast", "convert") and ok and spec.returns is not None and spec.returns(types, args) is None:
        report(f"The second argument of '{name}' must name a type such as 'double'.", args[1])
        ok = False
    return ok


def _arity(spec: Spec) -> str:
    most = len(spec.args)
    if spec.rest is not None:
        count = f"at least {spec.required}"
    elif spec.required == most:
        count = str(most)
    else:
        count = f"{spec.required} to {most}"
    return f"{count} argument{'' if count == '1' else 's'}"


def _kind_words(kind: object) -> str:
    if kind == "number":
        return "a number"
    if kind == "time":
        return "a time or an int/long"
    if isinstance(kind, tuple):
        return " or ".join(kind)
    return str(kind)


def _comparable(op: str, left: str, right: str) -> bool:
    if left in ast.NUMERIC_TYPES and right in ast.NUMERIC_TYPES:
        return True
    return op in ("==", "!=") and left == right


def _operator(node: ast.BinaryOp | ast.In) -> ast.Node:
    """Where the operator of `node` stands, for errors about the operation itself."""
    return ast.Node(line=node.op_line, column=node.op_column)
