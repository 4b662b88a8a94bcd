"""Builds AST nodes from the grammar's rules, as lark's LALR parser reduces them.
It runs inside the parser (no intermediate parse tree): each callback gets lark Tokens, which
know their line and column, and the nodes built for sub-rules; a node takes its position from
its construct's first token, or from the operator of a binary operation.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, TypedDict

from lark import Token, Transformer

from sp_dagster.siddhi import ast
from sp_dagster.siddhi.errors import SiddhiQLError

_TIME_UNITS = {
    "year": "year", "years": "year", "month": "month", "months": "month",
    "week": "week", "weeks": "week", "day": "day", "days": "day",
    "hour": "hour", "hours": "hour", "min": "minute", "minute": "minute", "minutes": "minute",
    "sec": "second", "second": "second", "seconds": "second",
    "millisec": "millisecond", "millisecond": "millisecond", "milliseconds": "millisecond",
}  # fmt: skip
_INT_RANGE = (-(2**31), 2**31 - 1)
_LONG_RANGE = (-(2**63), 2**63 - 1)
_JAVA_ESCAPE = re.compile(r"\\(u+[0-9a-fA-F]{4}|[0-3]?[0-7]{1,2}|.)", re.S)
_SIMPLE_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "'": "'", "\\": "\\"}


class Position(TypedDict):
    """Where a node starts: the keyword arguments every node takes."""

    line: int
    column: int


def _pos(item: Any) -> Position:
    """The keyword arguments that place a node where `item` (a Token or a node) starts."""
    return Position(line=getattr(item, "line", 0) or 0, column=getattr(item, "column", 0) or 0)


def _error(message: str, item: Any) -> SiddhiQLError:
    return SiddhiQLError(message, **_pos(item))


def unquote(token: str) -> str:
    """The value of a string literal: raw between single/double quotes; Java escapes in `\"\"\"`."""
    if token.startswith('"""'):
        return _JAVA_ESCAPE.sub(_unescape_one, token[3:-3])
    return token[1:-1]


def _unescape_one(match: re.Match[str]) -> str:
    code = match.group(1)
    if code[0] == "u":
        return chr(int(code.lstrip("u"), 16))
    if code[0].isdigit():
        return chr(int(code, 8))
    return _SIMPLE_ESCAPES.get(code, "\\" + code)


class _Tagged(tuple):
    """A clause result passed up to the rule that assembles it: (tag, value, token)."""

    @property
    def tag(self) -> str:
        return self[0]

    @property
    def value(self) -> Any:
        return self[1]


def _tag(tag: str, value: Any, token: Any = None) -> _Tagged:
    return _Tagged((tag, value, token))


def _tags(children: list[Any]) -> dict[str, Any]:
    """The tagged clause values among `children` (lists of tagged values are looked into)."""
    flat = [t for c in children for t in (c if isinstance(c, list) else [c])]
    return {c.tag: c.value for c in flat if isinstance(c, _Tagged)}


def _tokens(children: list[Any], *types: str) -> list[Token]:
    return [c for c in children if isinstance(c, Token) and c.type in types]


class _Chain:
    """A pattern (`->`) or sequence (`,`) chain while it is being built."""

    def __init__(self, kind: str, elements: list[Any], at: Any) -> None:
        self.kind, self.elements, self.at = kind, elements, at


class AstBuilder(Transformer):
    """Callbacks named after the grammar's rules; each returns the node for its rule."""

    # ------------------------------------------------------------ names and literals

    def name(self, children: list[Token]) -> Token:
        token = children[0]
        return token if token.type == "NAME" else token.update("NAME", token[1:-1])

    def number(self, children: list[Token]) -> ast.Constant:
        negative = len(children) == 2
        token = children[-1]
        text = str(token)
        suffix = text[-1].lower() if text[-1] in "lLfFdD" else ""
        body = text[:-1] if suffix else text
        whole = body.isdigit()
        sign = -1 if negative else 1
        if suffix == "l":
            if not whole:
                raise _error(f"A long literal must be a whole number, not '{text}'.", token)
            return self._ranged(sign * int(body), "long", _LONG_RANGE, children[0], text)
        if suffix in ("f", "d"):
            return ast.Constant(sign * float(body), "float" if suffix == "f" else "double", **_pos(children[0]))
        if whole:
            return self._ranged(sign * int(body), "int", _INT_RANGE, children[0], text)
        return ast.Constant(sign * float(body), "double", **_pos(children[0]))

    @staticmethod
    def _ranged(value: int, type_: str, bounds: tuple[int, int], at: Token, text: str) -> ast.Constant:
        if not bounds[0] <= value <= bounds[1]:
            hint = f"; write {text}L for a long" if type_ == "int" else ""
            raise _error(f"The {type_} literal {text} is out of range{hint}.", at)
        return ast.Constant(value, type_, **_pos(at))

    def string(self, children: list[Token]) -> ast.Constant:
        return ast.Constant(unquote(children[0]), "string", **_pos(children[0]))

    def true(self, children: list[Token]) -> ast.Constant:
        return ast.Constant(True, "bool", **_pos(children[0]))

    def false(self, children: list[Token]) -> ast.Constant:
        return ast.Constant(False, "bool", **_pos(children[0]))

    def time_unit(self, children: list[Token]) -> Token:
        return children[0].update("TIME_UNIT", _TIME_UNITS[children[0].lower()])

    def time_value(self, children: list[Token]) -> ast.TimeConstant:
        parts = []
        for amount, unit in zip(children[::2], children[1::2]):
            if not amount.isdigit():
                raise _error(f"A time amount must be a whole number, not '{amount}'.", amount)
            if parts and ast.TIME_UNITS[unit] >= ast.TIME_UNITS[parts[-1][1]]:
                raise _error("The units of a time value must go from the largest to the smallest.", unit)
            parts.append((int(amount), str(unit)))
        return ast.TimeConstant(tuple(parts), **_pos(children[0]))

    # ------------------------------------------------------------ expressions

    def binary_op(self, children: list[Any]) -> ast.BinaryOp:
        left, op, right = children
        return ast.BinaryOp(op.lower(), left, right, **_pos(left), op_line=op.line, op_column=op.column)

    or_op = and_op = binary_op

    def in_op(self, children: list[Any]) -> ast.In:
        operand, op, table = children
        return ast.In(operand, str(table), **_pos(operand), op_line=op.line, op_column=op.column)

    def not_op(self, children: list[Any]) -> ast.Not:
        return ast.Not(children[1], **_pos(children[0]))

    def null_check(self, children: list[Any]) -> ast.IsNull:
        return ast.IsNull(children[0], **_pos(children[0]))

    def function_call(self, children: list[Any]) -> ast.FunctionCall:
        namespace, name, args = children[0]
        return ast.FunctionCall(str(name), args, str(namespace) if namespace else None, **_pos(namespace or name))

    def function_op(self, children: list[Any]) -> tuple[Token | None, Token, tuple[ast.Expression, ...]]:
        names = [c for c in children if isinstance(c, Token) and c.type == "NAME"]
        args = tuple(c for c in children if isinstance(c, ast.Expression))  # the grammar's arguments are expressions
        if len(names) == 2:
            return names[0], names[1], args
        return None, names[0], args

    def index(self, children: list[Token]) -> ast.EventIndex:
        if children[0].type == "NUMBER":
            return self._whole(children[0], "An event index")
        offset = self._whole(children[2], "An event index") if len(children) == 3 else 0
        return ast.Last(offset, **_pos(children[0]))

    @staticmethod
    def _whole(token: Token, what: str) -> int:
        if not token.isdigit():
            raise _error(f"{what} must be a whole number, not '{token}'.", token)
        return int(token)

    def simple_variable(self, children: list[Token]) -> ast.Variable:
        return ast.Variable(str(children[0]), **_pos(children[0]))

    def qualified_variable(self, children: list[Any]) -> ast.Variable:
        stream, *index, name = children
        return ast.Variable(str(name), str(stream), index[0] if index else None, **_pos(stream))

    def inner_variable(self, children: list[Any]) -> ast.Variable:
        hash_, stream, *index, name = children
        return ast.Variable(str(name), str(stream), index[0] if index else None, inner=True, **_pos(hash_))

    def stream_ref(self, children: list[Any]) -> ast.StreamRef:
        return ast.StreamRef(str(children[0]), children[1], **_pos(children[0]))

    def inner_stream_ref(self, children: list[Any]) -> ast.StreamRef:
        hash_, stream, *index = children
        return ast.StreamRef(str(stream), index[0] if index else None, inner=True, **_pos(hash_))

    # ------------------------------------------------------------ annotations

    def annotation(self, children: list[Any]) -> ast.Annotation:
        at, name, *items = children
        elements = tuple(i for i in items if isinstance(i, ast.AnnotationElement))
        nested = tuple(i for i in items if isinstance(i, ast.Annotation))
        return ast.Annotation(str(name), elements, nested, **_pos(at))

    def annotation_name(self, children: list[Token]) -> Token:
        return children[0].update("NAME", ":".join(children))

    def annotation_element(self, children: list[Token]) -> ast.AnnotationElement:
        value = children[-1]
        key = children[0] if len(children) == 2 else None
        return ast.AnnotationElement(unquote(value), str(key) if key is not None else None, **_pos(key or value))

    def dotted_key(self, children: list[Token]) -> Token:
        return children[0].update("KEY", "".join(children))

    def string_key(self, children: list[Token]) -> Token:
        return children[0].update("KEY", unquote(children[0]))

    # ------------------------------------------------------------ definitions

    def attribute_type(self, children: list[Token]) -> Token:
        return children[0].update("TYPE", children[0].lower())

    def attribute_def(self, children: list[Token]) -> ast.AttributeDef:
        name, type_ = children
        return ast.AttributeDef(str(name), str(type_), **_pos(name))

    def attribute_list(self, children: list[ast.AttributeDef]) -> _Tagged:
        return _tag("attributes", tuple(children))

    def definition_stream(self, children: list[Any]) -> ast.StreamDefinition:
        _, name, attributes = children
        return ast.StreamDefinition(str(name), attributes.value, **_pos(name))

    def definition_table(self, children: list[Any]) -> ast.TableDefinition:
        _, name, attributes = children
        return ast.TableDefinition(str(name), attributes.value, **_pos(name))

    def definition_window(self, children: list[Any]) -> ast.WindowDefinition:
        _, name, attributes, (namespace, function, args), *rest = children
        window = ast.Window(str(function), args, str(namespace) if namespace else None, **_pos(namespace or function))
        event_type = rest[-1].value if rest else None
        return ast.WindowDefinition(str(name), attributes.value, window, event_type, **_pos(name))

    def definition_trigger(self, children: list[Any]) -> ast.TriggerDefinition:
        name, last = children[1], children[-1]
        if isinstance(last, ast.TimeConstant):
            return ast.TriggerDefinition(str(name), every=last, **_pos(name))
        return ast.TriggerDefinition(str(name), at=unquote(last), **_pos(name))

    def definition_aggregation(self, children: list[Any]) -> ast.AggregationDefinition:
        name = children[1]
        stream = next(c for c in children if isinstance(c, ast.StreamInput))
        tags = _tags(children)
        by = next((c for c in children if isinstance(c, ast.Variable)), None)
        selector = ast.Selector(tags["select"], tags.get("group_by", ()), **_pos(tags["select_at"]))
        kind, durations = tags["durations"]
        return ast.AggregationDefinition(str(name), stream, selector, durations, kind == "range", by, **_pos(name))

    def duration(self, children: list[Token]) -> Token:
        return children[0].update("DURATION", _TIME_UNITS[children[0].lower()])

    def duration_range(self, children: list[Token]) -> _Tagged:
        low, _, high = children
        if ast.DURATIONS.index(low) > ast.DURATIONS.index(high):
            raise _error("An aggregation range must go from the smaller duration to the larger.", low)
        return _tag("durations", ("range", (str(low), str(high))))

    def duration_list(self, children: list[Token]) -> _Tagged:
        return _tag("durations", ("list", tuple(str(c) for c in children)))

    def definition_function(self, children: list[Any]) -> ast.FunctionDefinition:
        name, language = _tokens(children, "NAME")
        type_ = next(c for c in children if isinstance(c, Token) and c.type == "TYPE")
        body = children[-1]
        return ast.FunctionDefinition(str(name), str(language), str(type_), body[1:-1], **_pos(name))

    # ------------------------------------------------------------ selection and output

    def select_clause(self, children: list[Any]) -> list[_Tagged]:
        attributes = tuple(c for c in children if isinstance(c, ast.OutputAttribute))
        return [_tag("select", attributes), _tag("select_at", children[0])]

    def output_attribute(self, children: list[Any]) -> ast.OutputAttribute:
        expression = children[0]
        rename = str(children[1]) if len(children) == 2 else None
        return ast.OutputAttribute(expression, rename, **_pos(expression))

    def group_by(self, children: list[ast.Variable]) -> _Tagged:
        return _tag("group_by", tuple(children))

    def having(self, children: list[ast.Expression]) -> _Tagged:
        return _tag("having", children[0])

    def order_by(self, children: list[ast.OrderBy]) -> _Tagged:
        return _tag("order_by", tuple(children))

    def order_item(self, children: list[Any]) -> ast.OrderBy:
        order = children[1].lower() if len(children) == 2 else "asc"
        return ast.OrderBy(children[0], order, **_pos(children[0]))

    def limit(self, children: list[ast.Expression]) -> _Tagged:
        return _tag("limit", children[0])

    def offset(self, children: list[ast.Expression]) -> _Tagged:
        return _tag("offset", children[0])

    def query_section(self, children: list[Any]) -> ast.Selector:
        tags = _tags(children)
        return ast.Selector(
            tags["select"],
            tags.get("group_by", ()),
            tags.get("having"),
            tags.get("order_by", ()),
            tags.get("limit"),
            tags.get("offset"),
            **_pos(tags["select_at"]),
        )

    def _rate_type(self, children: list[Any]) -> str:
        types = _tokens(children, "ALL", "FIRST", "LAST")
        return types[0].lower() if types else "all"

    def rate_time(self, children: list[Any]) -> ast.OutputRate:
        return ast.OutputRate("time", children[-1], self._rate_type(children), **_pos(children[0]))

    def rate_events(self, children: list[Any]) -> ast.OutputRate:
        count = self._whole(children[-1], "An event count")
        return ast.OutputRate("events", count, self._rate_type(children), **_pos(children[0]))

    def rate_snapshot(self, children: list[Any]) -> ast.OutputRate:
        return ast.OutputRate("snapshot", children[-1], None, **_pos(children[0]))

    def output_event_type(self, children: list[Token]) -> _Tagged:
        return _tag("event_type", children[0].lower() if children else "current")

    def target(self, children: list[Token]) -> _Tagged:
        return _tag("target", (str(children[-1]), len(children) == 2), children[-1])

    def set_clause(self, children: list[ast.SetAssignment]) -> _Tagged:
        return _tag("set", tuple(children))

    def set_assignment(self, children: list[Any]) -> ast.SetAssignment:
        return ast.SetAssignment(children[0], children[1], **_pos(children[0]))

    @staticmethod
    def _output_parts(children: list[Any]) -> tuple[dict[str, Any], ast.Expression | None, Token]:
        tags = _tags(children)
        condition = next((c for c in children if isinstance(c, ast.Expression)), None)
        target_at = next(c[2] for c in children if isinstance(c, _Tagged) and c.tag == "target")
        return tags, condition, target_at

    def insert_into(self, children: list[Any]) -> ast.InsertInto:
        tags, _, at = self._output_parts(children)
        target, inner = tags["target"]
        return ast.InsertInto(target, tags.get("event_type", "current"), inner, **_pos(at))

    def delete(self, children: list[Any]) -> ast.Delete:
        tags, condition, at = self._output_parts(children)
        return ast.Delete(tags["target"][0], condition, tags.get("event_type", "current"), **_pos(at))

    def update(self, children: list[Any]) -> ast.Update:
        tags, condition, at = self._output_parts(children)
        assert condition is not None  # the grammar requires `on <condition>`
        return ast.Update(tags["target"][0], condition, tags.get("set", ()), tags.get("event_type", "current"), **_pos(at))

    def update_or_insert(self, children: list[Any]) -> ast.UpdateOrInsert:
        tags, condition, at = self._output_parts(children)
        assert condition is not None  # the grammar requires `on <condition>`
        return ast.UpdateOrInsert(tags["target"][0], condition, tags.get("set", ()), tags.get("event_type", "current"), **_pos(at))

    def return_(self, children: list[Any]) -> ast.Return:
        tags = _tags(children)
        return ast.Return(tags.get("event_type", "current"), **_pos(children[0]))

    # ------------------------------------------------------------ stream inputs

    def plain_source(self, children: list[Token]) -> _Tagged:
        return _tag("source", (str(children[0]), False, False), children[0])

    def inner_source(self, children: list[Token]) -> _Tagged:
        return _tag("source", (str(children[1]), True, False), children[0])

    def fault_source(self, children: list[Token]) -> _Tagged:
        return _tag("source", (str(children[1]), False, True), children[0])

    def stream_input(self, children: list[Any]) -> ast.StreamInput:
        source, *handlers = children
        stream, inner, fault = source.value
        return ast.StreamInput(stream, tuple(handlers), inner, fault, **_pos(source[2]))

    def filter(self, children: list[Any]) -> ast.Filter:
        return ast.Filter(children[-1], **_pos(children[0]))

    def window(self, children: list[Any]) -> ast.Window:
        namespace, name, args = children[-1]
        return ast.Window(str(name), args, str(namespace) if namespace else None, **_pos(namespace or name))

    def stream_function(self, children: list[Any]) -> ast.StreamFunction:
        namespace, name, args = children[-1]
        return ast.StreamFunction(str(name), args, str(namespace) if namespace else None, **_pos(namespace or name))

    # joins

    def join_source(self, children: list[Any]) -> ast.JoinSource:
        alias = str(children[1]) if len(children) == 2 else None
        return ast.JoinSource(children[0], alias, **_pos(children[0]))

    def join_type(self, children: list[Token]) -> _Tagged:
        kinds = {t.type for t in children}
        for keyword, join_type in (("LEFT", "left_outer"), ("RIGHT", "right_outer"), ("FULL", "full_outer"), ("OUTER", "full_outer")):
            if keyword in kinds:
                return _tag("join_type", join_type)
        return _tag("join_type", "inner")

    def join_on(self, children: list[Any]) -> _Tagged:
        return _tag("on", children[0])

    def join_within(self, children: list[Any]) -> _Tagged:
        return _tag("within", (tuple(children[:-1]), children[-1]))

    def _join(self, children: list[Any], unidirectional: str | None) -> ast.JoinInput:
        left, right = [c for c in children if isinstance(c, ast.JoinSource)]
        tags = _tags(children)
        within, per = tags.get("within", ((), None))
        return ast.JoinInput(left, right, tags["join_type"], unidirectional, tags.get("on"), within, per, **_pos(left))

    def join_plain(self, children: list[Any]) -> ast.JoinInput:
        return self._join(children, None)

    def join_left_unidirectional(self, children: list[Any]) -> ast.JoinInput:
        return self._join(children, "left")

    def join_right_unidirectional(self, children: list[Any]) -> ast.JoinInput:
        return self._join(children, "right")

    # patterns and sequences

    def stream_state(self, children: list[Any]) -> ast.StreamState:
        event = children[0] if isinstance(children[0], Token) else None
        stream = next(c for c in children if isinstance(c, ast.StreamInput))
        quantifier = next((c for c in children if isinstance(c, ast.Quantifier)), None)
        return ast.StreamState(stream, str(event) if event else None, quantifier, **_pos(event or stream))

    def absent_state(self, children: list[Any]) -> ast.AbsentState:
        waiting = children[2] if len(children) == 3 else None
        return ast.AbsentState(children[1], waiting, **_pos(children[0]))

    def count_range(self, children: list[Token]) -> ast.Quantifier:
        colon = next(i for i, c in enumerate(children) if c.type == "COLON")
        low = _tokens(children[:colon], "NUMBER")
        high = _tokens(children[colon:], "NUMBER")
        return ast.Quantifier(
            self._whole(low[0], "A count") if low else None,
            self._whole(high[0], "A count") if high else None,
            **_pos(children[0]),
        )

    def count_exact(self, children: list[Token]) -> ast.Quantifier:
        count = self._whole(children[1], "A count")
        return ast.Quantifier(count, count, **_pos(children[0]))

    def zero_or_more(self, children: list[Token]) -> ast.Quantifier:
        return ast.Quantifier(0, None, "*", **_pos(children[0]))

    def one_or_more(self, children: list[Token]) -> ast.Quantifier:
        return ast.Quantifier(1, None, "+", **_pos(children[0]))

    def zero_or_one(self, children: list[Token]) -> ast.Quantifier:
        return ast.Quantifier(0, 1, "?", **_pos(children[0]))

    def logical(self, children: list[Any]) -> ast.LogicalState:
        left, op, right = children
        return ast.LogicalState(op.lower(), left, right, **_pos(_chain_at(left)))

    def every(self, children: list[Any]) -> ast.EveryState:
        return ast.EveryState(children[1], **_pos(children[0]))

    def pattern(self, children: list[Any]) -> _Chain:
        return self._chain("pattern", children[0], children[-1])

    def sequence(self, children: list[Any]) -> _Chain:
        return self._chain("sequence", children[0], children[-1])

    @staticmethod
    def _chain(kind: str, left: Any, right: Any) -> _Chain:
        elements = []
        for side in (left, right):
            if isinstance(side, _Chain):
                if side.kind != kind:
                    raise _error("A query cannot mix pattern '->' and sequence ',' operators.", side.at)
                elements += side.elements
            else:
                elements.append(side)
        return _Chain(kind, elements, _chain_at(left))

    def state_input(self, children: list[Any]) -> ast.StreamInput | ast.StateInput:
        element = children[0]
        within = children[1] if len(children) == 2 else None
        if isinstance(element, ast.StreamState) and element.event is None and element.quantifier is None and within is None:
            return element.stream  # a plain `from S...`: no pattern at all
        kinds: set[str] = set()
        finished = _finish_state(element, kinds)
        if len(kinds) > 1:
            raise _error("A query cannot mix pattern '->' and sequence ',' operators.", _chain_at(element))
        return ast.StateInput(kinds.pop() if kinds else "pattern", finished, within, **_pos(_chain_at(element)))

    # ------------------------------------------------------------ queries and partitions

    def query(self, children: list[Any]) -> ast.Query:
        from_, query_input, *rest = children
        selector = next((c for c in rest if isinstance(c, ast.Selector)), None) or ast.Selector(**_pos(from_))
        rate = next((c for c in rest if isinstance(c, ast.OutputRate)), None)
        return ast.Query(query_input, selector, rest[-1], rate, **_pos(from_))

    def value_partition(self, children: list[Any]) -> ast.ValuePartition:
        expression, stream = children
        return ast.ValuePartition(str(stream), expression, **_pos(expression))

    def range_partition(self, children: list[Any]) -> ast.RangePartition:
        ranges = tuple(c for c in children if isinstance(c, ast.RangeCondition))
        return ast.RangePartition(str(children[-1]), ranges, **_pos(ranges[0]))

    def range_condition(self, children: list[Any]) -> ast.RangeCondition:
        return ast.RangeCondition(children[0], unquote(children[1]), **_pos(children[0]))

    def partition(self, children: list[Any]) -> ast.Partition:
        keys = tuple(c for c in children if isinstance(c, (ast.ValuePartition, ast.RangePartition)))
        body = [c for c in children if isinstance(c, (ast.Annotation, ast.Query))]
        app_level, queries = _attach_annotations(body)
        if app_level:
            raise _error("App annotations must come before the app's definitions, not inside a partition.", app_level[0])
        return ast.Partition(keys, tuple(queries), **_pos(children[0]))

    def app(self, children: list[Any]) -> ast.App:
        app_level, elements = _attach_annotations(children)
        return ast.App(tuple(elements), annotations=tuple(app_level))

    # ------------------------------------------------------------ on-demand queries

    def store_input(self, children: list[Any]) -> ast.StoreInput:
        names = [c for c in children if isinstance(c, Token)]
        tags = _tags(children)
        within, per = tags.get("within", ((), None))
        alias = str(names[1]) if len(names) == 2 else None
        return ast.StoreInput(str(names[0]), alias, tags.get("on"), within, per, **_pos(names[0]))

    def od_find(self, children: list[Any]) -> ast.OnDemandQuery:
        selector = next((c for c in children if isinstance(c, ast.Selector)), None)
        return ast.OnDemandQuery(children[1], selector, None, **_pos(children[0]))

    def od_modify(self, children: list[Any]) -> ast.OnDemandQuery:
        selector = next((c for c in children if isinstance(c, ast.Selector)), None)
        output = next(c for c in children if isinstance(c, (ast.Delete, ast.Update)))
        return ast.OnDemandQuery(None, selector, output, **_pos(selector or output))

    def od_insert(self, children: list[Any]) -> ast.OnDemandQuery:
        return ast.OnDemandQuery(None, children[0], self.insert_into(children[1:]), **_pos(children[0]))

    def od_upsert(self, children: list[Any]) -> ast.OnDemandQuery:
        return ast.OnDemandQuery(None, children[0], self.update_or_insert(children[1:]), **_pos(children[0]))


def _chain_at(element: Any) -> Any:
    return element.at if isinstance(element, _Chain) else element


def _finish_state(element: Any, kinds: set[str]) -> ast.StateElement:
    """Turn the _Chain placeholders into StateChain nodes, noting each chain's kind."""
    if isinstance(element, _Chain):
        kinds.add(element.kind)
        return ast.StateChain(tuple(_finish_state(e, kinds) for e in element.elements), **_pos(element.at))
    if isinstance(element, ast.EveryState):
        return replace(element, element=_finish_state(element.element, kinds))
    if isinstance(element, ast.LogicalState):
        return replace(element, left=_finish_state(element.left, kinds), right=_finish_state(element.right, kinds))
    return element


def _attach_annotations(items: list[Any]) -> tuple[list[ast.Annotation], list[Any]]:
    """Give each element the annotations written before it; `@app:...` ones go to the app."""
    app_level: list[ast.Annotation] = []
    pending: list[ast.Annotation] = []
    elements: list[Any] = []
    for item in items:
        if isinstance(item, ast.Annotation) and item.name.lower().startswith("app:"):
            if elements or pending:
                raise _error(f"App annotation @{item.name} must come before the app's definitions and queries.", item)
            app_level.append(item)
        elif isinstance(item, ast.Annotation):
            pending.append(item)
        else:
            elements.append(replace(item, annotations=tuple(pending)) if pending else item)
            pending = []
    if pending:
        raise _error(f"Annotation @{pending[0].name} must be followed by a definition, query or partition.", pending[0])
    return app_level, elements
