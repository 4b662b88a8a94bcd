"""Render the AST as canonical SiddhiQL: `parse(render(app)) == app` for every parsed app.
Canonical means: app annotations first, one element per paragraph, one clause per line,
keywords in lower case, the fewest parentheses that keep the tree, names back-quoted only
where a keyword would otherwise be read.
"""

from __future__ import annotations

import re

from sp_dagster.siddhi import ast

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z_0-9]*\Z")
_DOTTED_KEY = re.compile(r"[A-Za-z_][A-Za-z_0-9]*(?:[.\-:][A-Za-z_][A-Za-z_0-9]*)*\Z")
# Keywords a bare name could be mistaken for (time units are only read after a number).
_KEYWORDS = frozenset(
    """define stream table window trigger aggregation aggregate function at partition with
    begin end of from select as group by having order asc desc limit offset output snapshot
    all first last events current expired insert into delete update set return for on within
    per unidirectional join inner outer left right full every not and or in is null true false
    string int long float double bool object""".split()
)
# At an operand, only these keywords are read as keywords (so `and(x)` is a function call).
_OPERAND_KEYWORDS = frozenset({"not", "true", "false"})
_PRECEDENCE = {op: level for level, ops in enumerate(ast.BINARY_PRECEDENCE, start=1) for op in ops}
_IN_LEVEL = _PRECEDENCE["and"] + 0.5  # `in` binds between `and` and `==`
_NOT_LEVEL = len(ast.BINARY_PRECEDENCE) + 1
_PRIMARY_LEVEL = _NOT_LEVEL + 1
_JOIN_WORDS = {"inner": "join", "left_outer": "left outer join", "right_outer": "right outer join", "full_outer": "full outer join"}
_UNIT_WORDS = {"year": "year", "month": "month", "week": "week", "day": "day", "hour": "hour",
               "minute": "min", "second": "sec", "millisecond": "millisec"}  # fmt: skip
_INDENT = "    "


def render(app: ast.App) -> str:
    """The whole app as SiddhiQL text."""
    head = "".join(render_annotation(a) + "\n" for a in app.annotations)
    body = "\n\n".join(render_element(e) + ";" for e in app.elements)
    return (head + ("\n" if head and body else "") + body + "\n") if head or body else ""


def render_element(element: ast.Element, indent: str = "") -> str:
    """One definition, query or partition, with its annotations (no trailing `;`)."""
    lines = [indent + render_annotation(a) for a in element.annotations]
    body = _RENDERERS[type(element)](element)
    lines += [indent + line if line else line for line in body.split("\n")]
    return "\n".join(lines)


def render_annotation(annotation: ast.Annotation) -> str:
    """`@name(key = 'value', ..., @nested(...))`."""
    items = [_annotation_element(e) for e in annotation.elements]
    items += [render_annotation(a) for a in annotation.annotations]
    name = ":".join(part if _IDENTIFIER.match(part) else f"`{part}`" for part in annotation.name.split(":"))
    return f"@{name}({', '.join(items)})" if items else f"@{name}"


def _annotation_element(element: ast.AnnotationElement) -> str:
    if element.key is None:
        return quote(element.value)
    key = element.key if _DOTTED_KEY.match(element.key) else quote(element.key)
    return f"{key} = {quote(element.value)}"


def quote(value: str) -> str:
    """A string literal for `value`: single quotes where possible, else double, else triple."""
    if "\n" not in value and "\r" not in value:
        if "'" not in value:
            return f"'{value}'"
        if '"' not in value:
            return f'"{value}"'
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"""{escaped}"""'


def name(text: str) -> str:
    """A name as written in SiddhiQL: back-quoted when it is a keyword or not an identifier."""
    if _IDENTIFIER.match(text) and text.lower() not in _KEYWORDS:
        return text
    return f"`{text}`"


def _operand_name(text: str) -> str:
    if _IDENTIFIER.match(text) and text.lower() not in _OPERAND_KEYWORDS:
        return text
    return f"`{text}`"


# --------------------------------------------------------------------------- expressions


def render_expression(expression: ast.Expression) -> str:
    """An expression with the fewest parentheses that keep its tree."""
    return _expression(expression, 0)


def _expression(node: ast.Expression, outer: float) -> str:
    if isinstance(node, ast.BinaryOp):
        level = _PRECEDENCE[node.op]
        text = f"{_expression(node.left, level)} {node.op} {_expression(node.right, level + 1)}"
    elif isinstance(node, ast.In):
        level = _IN_LEVEL
        text = f"{_expression(node.operand, level)} in {name(node.table)}"
    elif isinstance(node, ast.Not):
        level = _NOT_LEVEL
        text = f"not {_expression(node.operand, level)}"
    else:
        return _primary(node)
    return f"({text})" if level < outer else text


def _primary(node: ast.Expression) -> str:
    if isinstance(node, ast.Constant):
        return render_constant(node)
    if isinstance(node, ast.TimeConstant):
        return render_time(node)
    if isinstance(node, ast.Variable):
        prefix = _stream_prefix(node.stream, node.index, node.inner)
        return f"{prefix}.{name(node.name)}" if prefix else _operand_name(node.name)
    if isinstance(node, ast.StreamRef):
        return _stream_prefix(node.stream, node.index, node.inner)
    if isinstance(node, ast.FunctionCall):
        return _call(node.namespace, node.name, node.args)
    if isinstance(node, ast.IsNull):
        return f"{_primary(node.operand)} is null"
    raise TypeError(f"cannot render {type(node).__name__} as an expression")


def _stream_prefix(stream: str | None, index: ast.EventIndex | None, inner: bool) -> str:
    if stream is None:
        return ""
    text = ("#" if inner else "") + _operand_name(stream)
    if index is None:
        return text
    if isinstance(index, ast.Last):
        return f"{text}[last{f' - {index.offset}' if index.offset else ''}]"
    return f"{text}[{index}]"


def _call(namespace: str | None, function: str, args: tuple[ast.Expression, ...]) -> str:
    prefix = f"{name(namespace)}:" if namespace else ""
    return f"{prefix}{_operand_name(function)}({', '.join(render_expression(a) for a in args)})"


def render_constant(constant: ast.Constant) -> str:
    """A literal: `5`, `5L`, `5.0f`, `5.0`, `'text'`, `true`."""
    value, type_ = constant.value, constant.type
    if type_ == "string":
        assert isinstance(value, str)  # a string constant's value
        return quote(value)
    if type_ == "bool":
        return "true" if value else "false"
    if type_ == "long":
        return f"{value}L"
    if type_ == "float":
        return f"{float(value)!r}f"
    if type_ == "double":
        return repr(float(value))
    return str(value)


def render_time(time: ast.TimeConstant) -> str:
    """A time literal such as `1 hour 30 min`."""
    return " ".join(f"{amount} {_time_word(unit, amount)}" for amount, unit in time.parts)


def _time_word(unit: str, amount: int) -> str:
    word = _UNIT_WORDS[unit]
    return word + "s" if amount != 1 and word == unit else word


# --------------------------------------------------------------------------- query inputs


def render_stream_input(stream: ast.StreamInput) -> str:
    """`S[filter]#fn()#window.w()` (with `#` for inner and `!` for fault streams)."""
    text = ("#" if stream.inner else "!" if stream.fault else "") + name(stream.stream)
    for handler in stream.handlers:
        if isinstance(handler, ast.Filter):
            text += f"[{render_expression(handler.condition)}]"
        elif isinstance(handler, ast.Window):
            text += "#window." + _call(handler.namespace, handler.name, handler.args)
        else:
            text += "#" + _call(handler.namespace, handler.name, handler.args)
    return text


def _query_input(query_input: ast.QueryInput) -> str:
    if isinstance(query_input, ast.StreamInput):
        return render_stream_input(query_input)
    if isinstance(query_input, ast.JoinInput):
        return _join(query_input)
    within = f" within {render_time(query_input.within)}" if query_input.within else ""
    separator = " -> " if query_input.kind == "pattern" else ", "
    return _state(query_input.element, separator) + within


def _join_source(source: ast.JoinSource) -> str:
    alias = f" as {name(source.alias)}" if source.alias else ""
    return render_stream_input(source.stream) + alias


def _join(join: ast.JoinInput) -> str:
    left, right = _join_source(join.left), _join_source(join.right)
    if join.unidirectional == "left":
        left += " unidirectional"
    elif join.unidirectional == "right":
        right += " unidirectional"
    text = f"{left} {_JOIN_WORDS[join.join_type]} {right}"
    return text + _on_within_per(join.on, join.within, join.per)


def _on_within_per(on: ast.Expression | None, within: tuple[ast.Expression, ...], per: ast.Expression | None) -> str:
    text = f"\n{_INDENT}on {render_expression(on)}" if on is not None else ""
    if within:
        text += f"\n{_INDENT}within {', '.join(render_expression(w) for w in within)}"
        text += f" per {render_expression(per)}" if per is not None else ""
    return text


def _state(element: ast.StateElement, separator: str) -> str:
    if isinstance(element, ast.StreamState):
        event = f"{name(element.event)}=" if element.event else ""
        return event + render_stream_input(element.stream) + _quantifier(element.quantifier)
    if isinstance(element, ast.AbsentState):
        waiting = f" for {render_time(element.waiting)}" if element.waiting else ""
        return f"not {render_stream_input(element.stream)}{waiting}"
    if isinstance(element, ast.LogicalState):
        return f"{_state_unit(element.left, separator)} {element.op} {_state_unit(element.right, separator)}"
    if isinstance(element, ast.EveryState):
        inner = element.element
        wrapped = isinstance(inner, (ast.StateChain, ast.EveryState))
        return "every " + (f"({_state(inner, separator)})" if wrapped else _state(inner, separator))
    return separator.join(f"({_state(e, separator)})" if isinstance(e, ast.StateChain) else _state(e, separator) for e in element.elements)


def _state_unit(element: ast.StateElement, separator: str) -> str:
    if isinstance(element, (ast.StreamState, ast.AbsentState)):
        return _state(element, separator)
    return f"({_state(element, separator)})"


def _quantifier(quantifier: ast.Quantifier | None) -> str:
    if quantifier is None:
        return ""
    if quantifier.symbol:
        return quantifier.symbol
    if quantifier.min is not None and quantifier.min == quantifier.max:
        return f"<{quantifier.min}>"
    low = "" if quantifier.min is None else quantifier.min
    high = "" if quantifier.max is None else quantifier.max
    return f"<{low}:{high}>"


# --------------------------------------------------------------------------- queries


def render_selector(selector: ast.Selector) -> str:
    """The `select ...` clause and the `group by`/`having`/... lines after it."""
    if selector.star:
        lines = ["select *"]
    else:
        lines = ["select " + ", ".join(_output_attribute(a) for a in selector.attributes)]
    if selector.group_by:
        lines.append("group by " + ", ".join(_primary(v) for v in selector.group_by))
    if selector.having is not None:
        lines.append(f"having {render_expression(selector.having)}")
    if selector.order_by:
        lines.append("order by " + ", ".join(_order(o) for o in selector.order_by))
    if selector.limit is not None:
        lines.append(f"limit {render_expression(selector.limit)}")
    if selector.offset is not None:
        lines.append(f"offset {render_expression(selector.offset)}")
    return "\n".join(lines)


def _output_attribute(attribute: ast.OutputAttribute) -> str:
    text = render_expression(attribute.expression)
    return f"{text} as {name(attribute.rename)}" if attribute.rename is not None else text


def _order(order: ast.OrderBy) -> str:
    return _primary(order.variable) + (" desc" if order.order == "desc" else "")


def _rate(rate: ast.OutputRate) -> str:
    if rate.kind == "snapshot":
        return f"output snapshot every {render_time(rate.period)}"
    kind = "" if rate.type == "all" else f"{rate.type} "
    every = f"{rate.value} events" if rate.kind == "events" else render_time(rate.period)
    return f"output {kind}every {every}"


def _events(event_type: str, prefix: str = "") -> str:
    return "" if event_type == "current" else f"{prefix}{event_type} events "


def render_output(output: ast.QueryOutput) -> str:
    """`insert into T`, `delete T on ...`, `update T set ... on ...`, `return`, ..."""
    if isinstance(output, ast.InsertInto):
        return f"insert {_events(output.event_type)}into {'#' if output.inner else ''}{name(output.target)}"
    if isinstance(output, ast.Return):
        return f"return {_events(output.event_type)}".rstrip()
    target = name(output.target)
    for_events = f" {_events(output.event_type, 'for ')}".rstrip()
    if isinstance(output, ast.Delete):
        on = f" on {render_expression(output.on)}" if output.on is not None else ""
        return f"delete {target}{for_events}{on}"
    keyword = "update or insert into" if isinstance(output, ast.UpdateOrInsert) else "update"
    assignments = ", ".join(f"{_primary(s.variable)} = {render_expression(s.value)}" for s in output.set)
    set_clause = f"\n{_INDENT}set {assignments}" if assignments else ""
    return f"{keyword} {target}{for_events}{set_clause}\n{_INDENT}on {render_expression(output.on)}"


def render_query(query: ast.Query) -> str:
    """A query without its annotations: `from ... select ... insert into ...`."""
    lines = [f"from {_query_input(query.input)}", render_selector(query.selector)]
    if query.rate is not None:
        lines.append(_rate(query.rate))
    lines.append(render_output(query.output))
    return "\n".join(lines)


def _partition_key(key: ast.PartitionKey) -> str:
    if isinstance(key, ast.ValuePartition):
        return f"{render_expression(key.expression)} of {name(key.stream)}"
    ranges = " or ".join(f"{render_expression(r.condition)} as {quote(r.label)}" for r in key.ranges)
    return f"{ranges} of {name(key.stream)}"


def render_partition(partition: ast.Partition) -> str:
    """A partition without its own annotations, its queries indented."""
    keys = ", ".join(_partition_key(k) for k in partition.keys)
    queries = ";\n\n".join(render_element(q, _INDENT) for q in partition.queries)
    return f"partition with ({keys})\nbegin\n{queries};\nend"


# --------------------------------------------------------------------------- definitions


def _attributes(attributes: tuple[ast.AttributeDef, ...]) -> str:
    return "(" + ", ".join(f"{name(a.name)} {a.type}" for a in attributes) + ")"


def _stream(definition: ast.StreamDefinition) -> str:
    return f"define stream {name(definition.name)} {_attributes(definition.attributes)}"


def _table(definition: ast.TableDefinition) -> str:
    return f"define table {name(definition.name)} {_attributes(definition.attributes)}"


def _window(definition: ast.WindowDefinition) -> str:
    window = definition.window
    text = f"define window {name(definition.name)} {_attributes(definition.attributes)} "
    text += _call(window.namespace, window.name, window.args)
    if definition.output_event_type:
        text += f" output {definition.output_event_type} events"
    return text


def _trigger(definition: ast.TriggerDefinition) -> str:
    at = f"every {render_time(definition.every)}" if definition.every else quote(definition.at or "")
    return f"define trigger {name(definition.name)} at {at}"


def _aggregation(definition: ast.AggregationDefinition) -> str:
    by = f"by {_primary(definition.aggregate_by)} " if definition.aggregate_by else ""
    words = [_UNIT_WORDS[d] for d in definition.durations]
    every = " ... ".join(words) if definition.duration_range else ", ".join(words)
    return "\n".join(
        [
            f"define aggregation {name(definition.name)}",
            f"from {render_stream_input(definition.input)}",
            render_selector(definition.selector),
            f"aggregate {by}every {every}",
        ]
    )


def _function(definition: ast.FunctionDefinition) -> str:
    return f"define function {name(definition.name)}[{name(definition.language)}] return {definition.return_type} {{{definition.body}}}"


_RENDERERS = {
    ast.StreamDefinition: _stream,
    ast.TableDefinition: _table,
    ast.WindowDefinition: _window,
    ast.TriggerDefinition: _trigger,
    ast.AggregationDefinition: _aggregation,
    ast.FunctionDefinition: _function,
    ast.Query: render_query,
    ast.Partition: render_partition,
}


def render_on_demand_query(query: ast.OnDemandQuery) -> str:
    """An on-demand query: `from T on ... select ...`, or a selection and its output."""
    lines = []
    if query.input is not None:
        store = query.input
        alias = f" as {name(store.alias)}" if store.alias else ""
        lines.append(f"from {name(store.store)}{alias}{_on_within_per(store.on, store.within, store.per)}")
    if query.selector is not None:
        lines.append(render_selector(query.selector))
    if query.output is not None:
        lines.append(render_output(query.output))
    return "\n".join(lines)
