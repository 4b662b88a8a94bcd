"""The SiddhiQL syntax tree: immutable, hashable nodes that remember where they came from.
Two apps compare (and hash) equal exactly when they say the same thing: source positions take
no part in equality (see `Node`), which is what lets ``parse(render(app)) == app`` hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import overload

#: The attribute types of SiddhiQL, as written in definitions.
TYPES = ("string", "int", "long", "float", "double", "bool", "object")
#: Numeric types from narrowest to widest: arithmetic takes the wider of its operands.
NUMERIC_TYPES = ("int", "long", "float", "double")
#: Time units from largest to smallest, with their length in milliseconds.
TIME_UNITS = {
    "year": 365 * 24 * 3_600_000,
    "month": 30 * 24 * 3_600_000,
    "week": 7 * 24 * 3_600_000,
    "day": 24 * 3_600_000,
    "hour": 3_600_000,
    "minute": 60_000,
    "second": 1_000,
    "millisecond": 1,
}
#: The durations an incremental aggregation can keep, smallest first.
DURATIONS = ("second", "minute", "hour", "day", "week", "month", "year")
#: Output event types of `insert ... events into`, `output ... events` and `for ... events`.
EVENT_TYPES = ("current", "expired", "all")
#: Join kinds; a plain `join` is an inner join.
JOIN_TYPES = ("inner", "left_outer", "right_outer", "full_outer")


def qualified(namespace: str | None, name: str) -> str:
    """`namespace:name`, or `name` when there is no namespace."""
    return f"{namespace}:{name}" if namespace else name


@dataclass(frozen=True, slots=True)
class Node:
    """Base of every node: where it starts in the source text (0 when built by code).

    Every node is a frozen dataclass whose children are nodes or tuples of nodes. Its position (``line``,
    ``column``, 1-based) is kept for error messages but takes no part in equality."""

    line: int = field(default=0, compare=False, repr=False, kw_only=True)  # a position: keyword-only, not compared
    column: int = field(default=0, compare=False, repr=False, kw_only=True)  # a position: keyword-only, not compared


def walk(node: Node) -> Iterator[Node]:
    """`node` and every node below it (annotations included), depth first, in field order."""
    yield node
    for item in fields(node):
        value = getattr(node, item.name)
        for child in value if isinstance(value, tuple) else (value,):
            if isinstance(child, Node):
                yield from walk(child)


# --------------------------------------------------------------------------- annotations


@dataclass(frozen=True, slots=True)
class AnnotationElement(Node):
    """One `key='value'` (or keyless `'value'`) inside an annotation."""

    value: str
    key: str | None = None


@dataclass(frozen=True, slots=True)
class Annotation(Node):
    """`@name(key='value', ..., @nested(...))`; names compare case-insensitively on lookup."""

    name: str
    elements: tuple[AnnotationElement, ...] = ()
    annotations: tuple[Annotation, ...] = ()

    @overload
    def get(self, key: str) -> str | None: ...
    @overload
    def get(self, key: str, default: str) -> str: ...
    def get(self, key: str, default: str | None = None) -> str | None:
        """The value of element `key` (case-insensitive), or `default`."""
        key = key.lower()
        for element in self.elements:
            if element.key is not None and element.key.lower() == key:
                return element.value
        return default

    def element(self, key: str) -> AnnotationElement | None:
        """The element named `key` (case-insensitive), or None."""
        key = key.lower()
        return next((e for e in self.elements if e.key is not None and e.key.lower() == key), None)

    def present(self, key: str) -> AnnotationElement:
        """The element named `key`, which the caller knows is there (get(key) is not None)."""
        element = self.element(key)
        assert element is not None, key
        return element

    @property
    def values(self) -> tuple[str, ...]:
        """The values of the keyless elements, in order (e.g. `@primaryKey('a', 'b')`)."""
        return tuple(e.value for e in self.elements if e.key is None)

    def annotation(self, name: str) -> Annotation | None:
        """The first nested annotation called `name` (case-insensitive), or None."""
        return _first_named(self.annotations, name)

    def annotations_named(self, name: str) -> tuple[Annotation, ...]:
        """All nested annotations called `name` (case-insensitive), in order."""
        return _all_named(self.annotations, name)


def _first_named(annotations: tuple[Annotation, ...], name: str) -> Annotation | None:
    name = name.lower()
    return next((a for a in annotations if a.name.lower() == name), None)


def _all_named(annotations: tuple[Annotation, ...], name: str) -> tuple[Annotation, ...]:
    name = name.lower()
    return tuple(a for a in annotations if a.name.lower() == name)


@dataclass(frozen=True, slots=True)
class Annotated(Node):
    """A node that can carry annotations (definitions, queries, partitions)."""

    annotations: tuple[Annotation, ...] = field(default=(), kw_only=True)

    def annotation(self, name: str) -> Annotation | None:
        """The first annotation called `name` (case-insensitive, e.g. "dist"), or None."""
        return _first_named(self.annotations, name)

    def annotations_named(self, name: str) -> tuple[Annotation, ...]:
        """All annotations called `name` (case-insensitive), in order (e.g. every `@sink`)."""
        return _all_named(self.annotations, name)


# --------------------------------------------------------------------------- expressions


@dataclass(frozen=True, slots=True)
class Expression(Node):
    """Base of every expression node."""


@dataclass(frozen=True, slots=True)
class Constant(Expression):
    """A literal: `type` is one of int, long, float, double, string, bool."""

    value: int | float | str | bool
    type: str


@dataclass(frozen=True, slots=True)
class TimeConstant(Expression):
    """A time literal such as `1 hour 30 min`: a long number of milliseconds."""

    parts: tuple[tuple[int, str], ...]  # (amount, unit from TIME_UNITS), largest unit first

    @property
    def millis(self) -> int:
        """The duration in milliseconds."""
        return sum(amount * TIME_UNITS[unit] for amount, unit in self.parts)

    @property
    def value(self) -> int:
        """The duration in milliseconds (time constants are long values)."""
        return self.millis

    @property
    def type(self) -> str:
        """Always "long"."""
        return "long"


@dataclass(frozen=True, slots=True)
class Last(Node):
    """The index `last` (offset 0) or `last - offset` of a counted pattern event."""

    offset: int = 0


EventIndex = int | Last


@dataclass(frozen=True, slots=True)
class Variable(Expression):
    """An attribute reference: `price`, `S.price`, `e1[0].price`, `e2[last].price`, `#S.price`.

    `stream` is a stream id, a join alias or a pattern event name; `inner` marks `#S.x`.
    A bare `e2 is null` over a pattern event parses as `IsNull(Variable("e2"))`.
    """

    name: str
    stream: str | None = None
    index: EventIndex | None = None
    inner: bool = False


@dataclass(frozen=True, slots=True)
class StreamRef(Expression):
    """A reference to a counted pattern event itself, as in `e2[last] is null`."""

    stream: str
    index: EventIndex | None = None
    inner: bool = False


@dataclass(frozen=True, slots=True)
class FunctionCall(Expression):
    """`name(args)` or `namespace:name(args)`; also the aggregators (sum, count, ...)."""

    name: str
    args: tuple[Expression, ...] = ()
    namespace: str | None = None

    @property
    def qualified_name(self) -> str:
        """`namespace:name`, or `name` without a namespace."""
        return qualified(self.namespace, self.name)


#: Binary operators from loosest to tightest binding; one tuple per precedence level.
BINARY_PRECEDENCE = (("or",), ("and",), ("==", "!="), (">=", "<=", ">", "<"), ("+", "-"), ("*", "/", "%"))
ARITHMETIC_OPERATORS = ("+", "-", "*", "/", "%")
COMPARISON_OPERATORS = ("==", "!=", ">=", "<=", ">", "<")
LOGICAL_OPERATORS = ("and", "or")


@dataclass(frozen=True, slots=True)
class BinaryOp(Expression):
    """`left op right` for arithmetic (+ - * / %), comparison (== != < <= > >=), `and`, `or`.

    The node starts where `left` starts; `op_line`/`op_column` say where the operator is.
    """

    op: str
    left: Expression
    right: Expression
    op_line: int = field(default=0, compare=False, repr=False, kw_only=True)  # a position: keyword-only, not compared
    op_column: int = field(default=0, compare=False, repr=False, kw_only=True)  # a position: keyword-only, not compared


@dataclass(frozen=True, slots=True)
class Not(Expression):
    """`not operand` (binds tighter than every binary operator, as in Siddhi)."""

    operand: Expression


@dataclass(frozen=True, slots=True)
class IsNull(Expression):
    """`operand is null`; the operand is a Variable, StreamRef or FunctionCall."""

    operand: Expression


@dataclass(frozen=True, slots=True)
class In(Expression):
    """`condition in Table`: true when a row of the table satisfies the condition.

    The node starts where `operand` starts; `op_line`/`op_column` say where `in` is.
    """

    operand: Expression
    table: str
    op_line: int = field(default=0, compare=False, repr=False, kw_only=True)  # a position: keyword-only, not compared
    op_column: int = field(default=0, compare=False, repr=False, kw_only=True)  # a position: keyword-only, not compared


# --------------------------------------------------------------------------- query inputs


@dataclass(frozen=True, slots=True)
class Filter(Node):
    """`[condition]` after a stream."""

    condition: Expression


@dataclass(frozen=True, slots=True)
class StreamFunction(Node):
    """`#name(args)` or `#ns:name(args)` after a stream (e.g. `#log(...)`)."""

    name: str
    args: tuple[Expression, ...] = ()
    namespace: str | None = None

    @property
    def qualified_name(self) -> str:
        """`namespace:name`, or `name` without a namespace."""
        return qualified(self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class Window(Node):
    """`#window.name(args)` or `#window.ns:name(args)`; also the body of `define window`."""

    name: str
    args: tuple[Expression, ...] = ()
    namespace: str | None = None

    @property
    def qualified_name(self) -> str:
        """`namespace:name`, or `name` without a namespace."""
        return qualified(self.namespace, self.name)


Handler = Filter | StreamFunction | Window


@dataclass(frozen=True, slots=True)
class StreamInput(Node):
    """A stream read by a query: `S[filter]#fn()#window.w(...)[filter]`, `#Inner` or `!Fault`."""

    stream: str
    handlers: tuple[Handler, ...] = ()
    inner: bool = False
    fault: bool = False

    @property
    def window(self) -> Window | None:
        """The window of this input, if any."""
        return next((h for h in self.handlers if isinstance(h, Window)), None)

    @property
    def filters(self) -> tuple[Filter, ...]:
        """The filters, in order."""
        return tuple(h for h in self.handlers if isinstance(h, Filter))

    def streams(self) -> tuple[StreamInput, ...]:
        """The streams read (just this one)."""
        return (self,)


@dataclass(frozen=True, slots=True)
class JoinSource(Node):
    """One side of a join: a stream input with an optional `as alias`."""

    stream: StreamInput
    alias: str | None = None

    @property
    def reference(self) -> str:
        """The name attributes of this side are qualified with: the alias, else the stream id."""
        return self.alias or self.stream.stream


@dataclass(frozen=True, slots=True)
class JoinInput(Node):
    """`left [unidirectional] join right [unidirectional] [on c] [within a[, b] per p]`."""

    left: JoinSource
    right: JoinSource
    join_type: str = "inner"  # one of JOIN_TYPES
    unidirectional: str | None = None  # "left" or "right"
    on: Expression | None = None
    within: tuple[Expression, ...] = ()  # aggregation joins: a range start (and end)
    per: Expression | None = None

    def streams(self) -> tuple[StreamInput, ...]:
        """The streams read: left, then right."""
        return (self.left.stream, self.right.stream)


@dataclass(frozen=True, slots=True)
class Quantifier(Node):
    """How many events a pattern element collects: `<2:5>`, `<2:>`, `<:5>`, `<3>`, `*`, `+`, `?`."""

    min: int | None
    max: int | None
    symbol: str | None = None  # "*", "+" or "?" when written that way


@dataclass(frozen=True, slots=True)
class StreamState(Node):
    """A pattern/sequence element that matches events: `e1=S[filter]` with an optional count."""

    stream: StreamInput
    event: str | None = None
    quantifier: Quantifier | None = None


@dataclass(frozen=True, slots=True)
class AbsentState(Node):
    """`not S[filter] [for time]`: the absence of a matching event."""

    stream: StreamInput
    waiting: TimeConstant | None = None


@dataclass(frozen=True, slots=True)
class LogicalState(Node):
    """`a and b` or `a or b` between two pattern elements."""

    op: str  # "and" or "or"
    left: StateElement
    right: StateElement


@dataclass(frozen=True, slots=True)
class EveryState(Node):
    """`every element`: restart the element after each match."""

    element: StateElement


@dataclass(frozen=True, slots=True)
class StateChain(Node):
    """Elements that follow one another: `a -> b -> c` (pattern) or `a, b, c` (sequence)."""

    elements: tuple[StateElement, ...]


StateElement = StreamState | AbsentState | LogicalState | EveryState | StateChain


@dataclass(frozen=True, slots=True)
class StateInput(Node):
    """The input of a pattern (`kind="pattern"`) or sequence (`kind="sequence"`) query."""

    kind: str
    element: StateElement
    within: TimeConstant | None = None

    def states(self) -> Iterator[StreamState | AbsentState]:
        """Every leaf element (stream and absent states), left to right."""
        yield from _state_leaves(self.element)

    def streams(self) -> tuple[StreamInput, ...]:
        """The streams read by the leaf elements, left to right."""
        return tuple(state.stream for state in self.states())


def _state_leaves(element: StateElement) -> Iterator[StreamState | AbsentState]:
    if isinstance(element, (StreamState, AbsentState)):
        yield element
    elif isinstance(element, LogicalState):
        yield from _state_leaves(element.left)
        yield from _state_leaves(element.right)
    elif isinstance(element, EveryState):
        yield from _state_leaves(element.element)
    else:
        for child in element.elements:
            yield from _state_leaves(child)


QueryInput = StreamInput | JoinInput | StateInput


# --------------------------------------------------------------------------- selection and output


@dataclass(frozen=True, slots=True)
class OutputAttribute(Node):
    """One selected expression, with its `as` name if given."""

    expression: Expression
    rename: str | None = None

    @property
    def name(self) -> str | None:
        """The output attribute name: the `as` name, else the referenced attribute's name."""
        if self.rename is not None:
            return self.rename
        return self.expression.name if isinstance(self.expression, Variable) else None


@dataclass(frozen=True, slots=True)
class OrderBy(Node):
    """One `order by` key: an attribute and "asc" or "desc"."""

    variable: Variable
    order: str = "asc"


@dataclass(frozen=True, slots=True)
class Selector(Node):
    """`select ... group by ... having ... order by ... limit ... offset ...`.

    No attributes means `select *` (also when a query has no select clause at all).
    """

    attributes: tuple[OutputAttribute, ...] = ()
    group_by: tuple[Variable, ...] = ()
    having: Expression | None = None
    order_by: tuple[OrderBy, ...] = ()
    limit: Expression | None = None
    offset: Expression | None = None

    @property
    def star(self) -> bool:
        """True for `select *`."""
        return not self.attributes


@dataclass(frozen=True, slots=True)
class OutputRate(Node):
    """Output rate limiting.

    `kind` is "events" (`output [all|first|last] every N events`, value an int), "time"
    (`output [all|first|last] every <time>`) or "snapshot" (`output snapshot every <time>`,
    `type` None); `type` is "all", "first" or "last".
    """

    kind: str
    value: int | TimeConstant
    type: str | None = "all"

    @property
    def period(self) -> TimeConstant:
        """The period of a "time" or "snapshot" rate."""
        assert isinstance(self.value, TimeConstant), self.kind
        return self.value


@dataclass(frozen=True, slots=True)
class SetAssignment(Node):
    """`set Table.attr = expression` in update queries."""

    variable: Variable
    value: Expression


@dataclass(frozen=True, slots=True)
class InsertInto(Node):
    """`insert [current|expired|all] events into Target` (`#Target` when inner)."""

    target: str
    event_type: str = "current"
    inner: bool = False


@dataclass(frozen=True, slots=True)
class Delete(Node):
    """`delete Table [for ... events] [on condition]`."""

    target: str
    on: Expression | None = None
    event_type: str = "current"


@dataclass(frozen=True, slots=True)
class Update(Node):
    """`update Table [for ... events] [set ...] on condition`."""

    target: str
    on: Expression
    set: tuple[SetAssignment, ...] = ()
    event_type: str = "current"


@dataclass(frozen=True, slots=True)
class UpdateOrInsert(Node):
    """`update or insert into Table [for ... events] [set ...] on condition`."""

    target: str
    on: Expression
    set: tuple[SetAssignment, ...] = ()
    event_type: str = "current"


@dataclass(frozen=True, slots=True)
class Return(Node):
    """`return [... events]`: the query's events go back to the caller."""

    event_type: str = "current"


QueryOutput = InsertInto | Delete | Update | UpdateOrInsert | Return


# --------------------------------------------------------------------------- queries and partitions


@dataclass(frozen=True, slots=True)
class Query(Annotated):
    """`from <input> [select ...] [output ...] <output>`."""

    input: QueryInput
    selector: Selector
    output: QueryOutput
    rate: OutputRate | None = None

    @property
    def name(self) -> str | None:
        """The name given by `@info(name='...')`, or None."""
        info = self.annotation("info")
        return info.get("name") if info else None

    def input_streams(self) -> tuple[StreamInput, ...]:
        """Every stream input this query reads, in source order."""
        return self.input.streams()

    @property
    def target(self) -> str | None:
        """The stream or table written to (None for `return`)."""
        return getattr(self.output, "target", None)


@dataclass(frozen=True, slots=True)
class ValuePartition(Node):
    """`expression of Stream`: one partition per distinct value."""

    stream: str
    expression: Expression


@dataclass(frozen=True, slots=True)
class RangeCondition(Node):
    """`condition as 'label'` in a range partition."""

    condition: Expression
    label: str


@dataclass(frozen=True, slots=True)
class RangePartition(Node):
    """`c1 as 'a' or c2 as 'b' of Stream`: one partition per label."""

    stream: str
    ranges: tuple[RangeCondition, ...]


PartitionKey = ValuePartition | RangePartition


@dataclass(frozen=True, slots=True)
class Partition(Annotated):
    """`partition with (key of S, ...) begin <queries> end`."""

    keys: tuple[PartitionKey, ...]
    queries: tuple[Query, ...]

    def key_for(self, stream: str) -> PartitionKey | None:
        """The partition key declared for `stream`, or None."""
        return next((k for k in self.keys if k.stream == stream), None)


# --------------------------------------------------------------------------- definitions


@dataclass(frozen=True, slots=True)
class AttributeDef(Node):
    """`name type` in a definition."""

    name: str
    type: str


@dataclass(frozen=True, slots=True)
class Definition(Annotated):
    """Base of the `define ...` elements: every one has a name."""

    name: str


@dataclass(frozen=True, slots=True)
class AttributedDefinition(Definition):
    """A definition with attributes: a stream, table or window."""

    attributes: tuple[AttributeDef, ...]

    def attribute(self, name: str) -> AttributeDef | None:
        """The attribute called `name`, or None."""
        return next((a for a in self.attributes if a.name == name), None)


@dataclass(frozen=True, slots=True)
class StreamDefinition(AttributedDefinition):
    """`define stream S (attr type, ...)`."""


@dataclass(frozen=True, slots=True)
class TableDefinition(AttributedDefinition):
    """`define table T (attr type, ...)`, in memory or behind `@store(...)`."""


@dataclass(frozen=True, slots=True)
class WindowDefinition(AttributedDefinition):
    """`define window W (attr type, ...) fn(args) [output <type> events]`."""

    window: Window
    output_event_type: str | None = None


@dataclass(frozen=True, slots=True)
class TriggerDefinition(Definition):
    """`define trigger T at every <time>` or `at 'start'` or `at '<cron>'`."""

    every: TimeConstant | None = None
    at: str | None = None


@dataclass(frozen=True, slots=True)
class AggregationDefinition(Definition):
    """`define aggregation A from S select ... group by ... aggregate [by ts] every ...`.

    `durations` are DURATIONS names; with `duration_range` they are the two ends of
    `every sec ... year`, else the explicit list `every sec, min, hour`.
    """

    input: StreamInput
    selector: Selector
    durations: tuple[str, ...]
    duration_range: bool = False
    aggregate_by: Variable | None = None

    @property
    def all_durations(self) -> tuple[str, ...]:
        """Every duration kept, smallest first (a range expanded)."""
        if not self.duration_range:
            return self.durations
        low, high = DURATIONS.index(self.durations[0]), DURATIONS.index(self.durations[-1])
        return DURATIONS[low : high + 1]


@dataclass(frozen=True, slots=True)
class FunctionDefinition(Definition):
    """`define function f[language] return type { body }` (parsed; not supported to run)."""

    language: str
    return_type: str
    body: str  # the script between the outer braces


Element = StreamDefinition | TableDefinition | WindowDefinition | TriggerDefinition | AggregationDefinition | FunctionDefinition | Query | Partition


@dataclass(frozen=True, slots=True)
class App(Annotated):
    """A Siddhi app: app annotations (`@app:name(...)`, ...) and its elements, in order."""

    elements: tuple[Element, ...] = ()

    @property
    def name(self) -> str | None:
        """The name given by `@app:name('...')`, or None."""
        annotation = self.annotation("app:name")
        if annotation is None:
            return None
        return annotation.values[0] if annotation.values else annotation.get("name")

    @property
    def playback(self) -> bool:
        """True when the app runs on event time (`@app:playback`)."""
        return self.annotation("app:playback") is not None

    @property
    def definitions(self) -> tuple[Definition, ...]:
        """Every `define ...` element, in order."""
        return tuple(e for e in self.elements if isinstance(e, Definition))

    def definition(self, name: str) -> Definition | None:
        """The definition called `name` (any kind), or None."""
        return next((d for d in self.definitions if d.name == name), None)

    @property
    def partitions(self) -> tuple[Partition, ...]:
        """Every partition, in order."""
        return tuple(e for e in self.elements if isinstance(e, Partition))

    def queries(self) -> Iterator[tuple[Query, Partition | None]]:
        """Every query with the partition holding it (None at top level), in source order."""
        for element in self.elements:
            if isinstance(element, Query):
                yield element, None
            elif isinstance(element, Partition):
                for query in element.queries:
                    yield query, element


@dataclass(frozen=True, slots=True)
class StoreInput(Node):
    """The input of an on-demand query: `Table [as a] [on c] [within a[, b] per p]`."""

    store: str
    alias: str | None = None
    on: Expression | None = None
    within: tuple[Expression, ...] = ()
    per: Expression | None = None


@dataclass(frozen=True, slots=True)
class OnDemandQuery(Node):
    """An on-demand (store) query run against a table, window or aggregation of an app.

    Either `from <store> [select ...]` (input set, output None), or a selection followed by
    `insert into`, `delete`, `update` or `update or insert into` (input None).
    """

    input: StoreInput | None = None
    selector: Selector | None = None
    output: InsertInto | Delete | Update | UpdateOrInsert | None = None
