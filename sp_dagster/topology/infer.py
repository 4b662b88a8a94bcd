"""The attributes of streams that no `define stream` declares, as Siddhi infers them.

WORKAROUND: sp_dagster.siddhi's validation and type-inference pass (issue 3) has not landed;
when it does, take the attribute types from it and delete this module. Partial apps need
these definitions only for inferred streams that travel between groups (to carry @source and
@sink). The rules are Siddhi's common ones; an unknown function gives `object`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sp_dagster.siddhi import ast

_FIXED_TYPES = {
    "count": "long", "distinctcount": "long", "avg": "double", "stddev": "double", "and": "bool", "or": "bool",
    "eventtimestamp": "long", "currenttimemillis": "long", "uuid": "string", "unionset": "object",
    "createset": "object", "sizeofset": "int", "instanceofboolean": "bool", "instanceofdouble": "bool",
    "instanceoffloat": "bool", "instanceofinteger": "bool", "instanceoflong": "bool", "instanceofstring": "bool",
}  # fmt: skip
_TYPE_OF_FIRST_ARGUMENT = {"max", "min", "maxforever", "minforever", "coalesce", "default"}
_NAMESPACE_TYPES = {"str": "string", "math": "double"}
_NAMESPACED_TYPES = {
    ("str", "length"): "int", ("str", "contains"): "bool", ("str", "equalsignorecase"): "bool",
    ("str", "regexp"): "bool", ("math", "round"): "long", ("math", "floor"): "double",
}  # fmt: skip


class Unknown(Exception):
    """An attribute or type that cannot be worked out from the app."""


def infer_attributes(app: ast.App) -> dict[str, tuple[ast.AttributeDef, ...]]:
    """The attributes of every defined stream, table, window, trigger and aggregation, and of
    every inferred stream whose producing query can be typed."""
    known: dict[str, tuple[ast.AttributeDef, ...]] = {}
    for definition in app.definitions:
        if isinstance(definition, (ast.StreamDefinition, ast.TableDefinition, ast.WindowDefinition)):
            known[definition.name] = definition.attributes
        elif isinstance(definition, ast.TriggerDefinition):
            known[definition.name] = (ast.AttributeDef("triggered_time", "long"),)
    aggregations = [d for d in app.definitions if isinstance(d, ast.AggregationDefinition)]
    queries = list(app.queries())
    inner: dict[int, dict[str, tuple[ast.AttributeDef, ...]]] = {}
    for _ in range(len(queries) + len(aggregations) + 1):
        changed = False
        for aggregation in aggregations:
            if aggregation.name not in known:
                changed |= _learn(known, aggregation.name, lambda a=aggregation: _aggregation_attributes(a, known))
        for query, partition in queries:
            if not isinstance(query.output, ast.InsertInto):
                continue
            scope = inner.setdefault(id(partition), {}) if partition is not None else {}
            target = scope if query.output.inner else known
            if query.output.target not in target:
                attributes = _try(lambda q=query, s=scope: output_attributes(q.selector, q.input, known, s))
                if attributes is not None:
                    target[query.output.target] = attributes
                    changed = True
        if not changed:
            break
    return known


def _learn(known: dict, name: str, compute) -> bool:
    attributes = _try(compute)
    if attributes is None:
        return False
    known[name] = attributes
    return True


def _try(compute):
    try:
        return compute()
    except Unknown:
        return None


def _aggregation_attributes(aggregation: ast.AggregationDefinition, known: dict) -> tuple[ast.AttributeDef, ...]:
    selected = output_attributes(aggregation.selector, aggregation.input, known, {})
    return (ast.AttributeDef("AGG_TIMESTAMP", "long"), *selected)


@dataclass(frozen=True)
class _Scope:
    """The attributes a selector can see: per stream id, alias and pattern event, and in order."""

    references: dict[str, tuple[ast.AttributeDef, ...]]
    ordered: tuple[tuple[ast.AttributeDef, ...], ...]

    def attribute(self, stream: str | None, name: str) -> str:
        candidates = (self.references.get(stream, ()),) if stream is not None else self.ordered
        for attributes in candidates:
            for attribute in attributes:
                if attribute.name == name:
                    return attribute.type
        raise Unknown(name)


def output_attributes(selector: ast.Selector, source: ast.Node, known: dict, inner: dict) -> tuple[ast.AttributeDef, ...]:
    """The attributes a selector produces over a query input (raises Unknown when it cannot tell)."""
    scope = _scope(source, known, inner)
    if selector.star:
        seen: dict[str, ast.AttributeDef] = {}
        for attributes in scope.ordered:
            for attribute in attributes:
                seen.setdefault(attribute.name, ast.AttributeDef(attribute.name, attribute.type))
        return tuple(seen.values())
    result = []
    for attribute in selector.attributes:
        if attribute.name is None:
            raise Unknown("an unnamed expression")
        result.append(ast.AttributeDef(attribute.name, expression_type(attribute.expression, scope)))
    return tuple(result)


def _scope(source: ast.Node, known: dict, inner: dict) -> _Scope:
    references: dict[str, tuple[ast.AttributeDef, ...]] = {}
    ordered = []

    def add(stream_input: ast.StreamInput, *names: str | None) -> None:
        table = inner if stream_input.inner else known
        if stream_input.stream not in table:
            raise Unknown(stream_input.stream)
        attributes = table[stream_input.stream]
        ordered.append(attributes)
        for name in (stream_input.stream, *names):
            if name is not None:
                references.setdefault(name, attributes)

    if isinstance(source, ast.StreamInput):
        add(source)
    elif isinstance(source, ast.JoinInput):
        add(source.left.stream, source.left.alias)
        add(source.right.stream, source.right.alias)
    elif isinstance(source, ast.StateInput):
        for state in source.states():
            add(state.stream, getattr(state, "event", None))
    return _Scope(references, tuple(ordered))


def expression_type(expression: ast.Expression, scope: _Scope) -> str:
    """The SiddhiQL type of an expression."""
    if isinstance(expression, (ast.Constant, ast.TimeConstant)):
        return expression.type
    if isinstance(expression, ast.Variable):
        return scope.attribute(expression.stream, expression.name)
    if isinstance(expression, ast.BinaryOp):
        if expression.op not in ast.ARITHMETIC_OPERATORS:
            return "bool"
        return _wider(expression_type(expression.left, scope), expression_type(expression.right, scope))
    if isinstance(expression, (ast.Not, ast.IsNull, ast.In)):
        return "bool"
    if isinstance(expression, ast.FunctionCall):
        return _function_type(expression, scope)
    return "object"


def _wider(left: str, right: str) -> str:
    if left not in ast.NUMERIC_TYPES or right not in ast.NUMERIC_TYPES:
        raise Unknown(f"{left} and {right} arithmetic")
    return max(left, right, key=ast.NUMERIC_TYPES.index)


def _function_type(call: ast.FunctionCall, scope: _Scope) -> str:
    name = call.name.lower()
    if call.namespace is not None:
        namespace = call.namespace.lower()
        return _NAMESPACED_TYPES.get((namespace, name), _NAMESPACE_TYPES.get(namespace, "object"))
    if name in _FIXED_TYPES:
        return _FIXED_TYPES[name]
    arguments = [expression_type(argument, scope) for argument in call.args]
    if name == "sum" and arguments:
        return "long" if arguments[0] in ("int", "long") else "double"
    if name in _TYPE_OF_FIRST_ARGUMENT and arguments:
        return arguments[0]
    if name == "ifthenelse" and len(arguments) == 3:
        return arguments[1]
    if name in ("maximum", "minimum") and arguments:
        return max(arguments, key=lambda t: ast.NUMERIC_TYPES.index(t) if t in ast.NUMERIC_TYPES else -1)
    if name in ("cast", "convert") and len(call.args) == 2 and isinstance(call.args[1], ast.Constant):
        return str(call.args[1].value).lower()
    return "object"
