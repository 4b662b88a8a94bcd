"""What each element of an app reads and writes, and what kind of thing every name is."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sp_dagster.siddhi import ast
from sp_dagster.siddhi.analysis import Analysis
from sp_dagster.siddhi.types import is_aggregate
from sp_dagster.topology.topics import topic_name

# Kinds of names.
STREAM = "stream"
INFERRED = "inferred"  # a stream with no `define stream`: a query's output defines it
TABLE = "table"
WINDOW = "window"
TRIGGER = "trigger"
AGGREGATION = "aggregation"
FUNCTION = "function"

_KINDS = {
    ast.StreamDefinition: STREAM,
    ast.TableDefinition: TABLE,
    ast.WindowDefinition: WINDOW,
    ast.TriggerDefinition: TRIGGER,
    ast.AggregationDefinition: AGGREGATION,
    ast.FunctionDefinition: FUNCTION,
}

Executable = ast.Query | ast.Partition | ast.AggregationDefinition


def is_aggregate_call(node: ast.Node) -> bool:
    """True for a call of an aggregate function (sum, count, ...)."""
    return isinstance(node, ast.FunctionCall) and is_aggregate(node)


def is_persisted(definition: ast.Definition) -> bool:
    """True for a table or aggregation kept in a shared store (`@store`, not type 'in-memory')."""
    store = definition.annotation("store")
    return store is not None and (store.get("type") or "").lower() not in ("in-memory", "inmemory")


@dataclass(frozen=True)
class Catalog:
    """Every definition the user wrote, by name and position, and the language's analysis of the app."""

    definitions: dict[str, ast.Definition]
    positions: dict[str, int]
    analysis: Analysis

    @classmethod
    def of(cls, app: ast.App, analysis: Analysis) -> Catalog:
        """The catalog of `app`'s definitions (the first one wins when a name repeats)."""
        definitions: dict[str, ast.Definition] = {}
        positions: dict[str, int] = {}
        for index, element in enumerate(app.elements):
            if isinstance(element, ast.Definition) and element.name not in definitions:
                definitions[element.name] = element
                positions[element.name] = index
        return cls(definitions, positions, analysis)

    def attributes(self, name: str) -> tuple[ast.AttributeDef, ...] | None:
        """The attributes of a stream (defined or inferred), table, window, trigger or aggregation."""
        return self.analysis.attributes(name)

    def kind(self, name: str) -> str:
        """STREAM, TABLE, WINDOW, TRIGGER, AGGREGATION, FUNCTION, or INFERRED when undefined."""
        definition = self.definitions.get(name)
        return _KINDS[type(definition)] if definition is not None else INFERRED

    def is_stream(self, name: str) -> bool:
        """True for a defined or inferred stream."""
        return self.kind(name) in (STREAM, INFERRED)

    def stream(self, name: str) -> ast.StreamDefinition | None:
        """The `define stream` of `name`, or None."""
        definition = self.definitions.get(name)
        return definition if isinstance(definition, ast.StreamDefinition) else None


@dataclass(frozen=True)
class Read:
    """One stream, table, window, trigger or aggregation read by an element."""

    name: str
    node: ast.Node
    query: ast.Query | None  # None for an aggregation's own input
    key: str | None = None  # the partition key attribute, when the enclosing partition is keyed on it
    key_node: ast.Node | None = None


@dataclass(frozen=True)
class Write:
    """A stream, table or window written by a query."""

    name: str
    node: ast.Node
    query: ast.Query


@dataclass(frozen=True)
class ElementInfo:
    """A query, partition or aggregation of the app with what it reads and writes."""

    element: Executable
    index: int  # position in app.elements
    reads: tuple[Read, ...]
    writes: tuple[Write, ...]
    tables: tuple[Read, ...]  # tables named by `... in Table` conditions
    functions: tuple[str, ...]  # names of called functions (script functions among them)

    @property
    def dist(self) -> ast.Annotation | None:
        """The element's `@dist(...)` annotation, or None."""
        return self.element.annotation("dist")

    @property
    def is_partition(self) -> bool:
        """True for a partition."""
        return isinstance(self.element, ast.Partition)

    @property
    def is_query(self) -> bool:
        """True for a top-level query."""
        return isinstance(self.element, ast.Query)

    @property
    def queries(self) -> tuple[ast.Query, ...]:
        """The queries of the element (none for an aggregation)."""
        if isinstance(self.element, ast.Partition):
            return self.element.queries
        return (self.element,) if isinstance(self.element, ast.Query) else ()

    def names(self) -> Iterator[str]:
        """Every name the element reads or writes, in order, with repeats."""
        for item in (*self.reads, *self.writes, *self.tables):
            yield item.name


def describe(app: ast.App) -> list[ElementInfo]:
    """Facts about every query, partition and aggregation of `app`, in source order."""
    infos = []
    for index, element in enumerate(app.elements):
        if isinstance(element, (ast.Query, ast.Partition)):
            infos.append(_describe_executable(element, index))
        elif isinstance(element, ast.AggregationDefinition):
            reads = (Read(element.input.stream, element.input, None),)
            infos.append(ElementInfo(element, index, reads, (), (), _functions(element)))
    return infos


def _describe_executable(element: ast.Query | ast.Partition, index: int) -> ElementInfo:
    partition: ast.Partition | None
    if isinstance(element, ast.Partition):
        partition, queries = element, element.queries
    else:
        partition, queries = None, (element,)
    reads, writes, tables = [], [], []
    for query in queries:
        for stream_input in query.input_streams():
            if stream_input.inner or stream_input.fault:
                continue  # partition-local (#S) or the local fault stream (!S)
            key, key_node = _partition_key(partition, stream_input.stream)
            reads.append(Read(stream_input.stream, stream_input, query, key, key_node))
        output = query.output
        if not isinstance(output, ast.Return) and not getattr(output, "inner", False):
            writes.append(Write(output.target, output, query))
        for node in ast.walk(query):
            if isinstance(node, ast.In):
                tables.append(Read(node.table, node, query))
    return ElementInfo(element, index, tuple(reads), tuple(writes), tuple(tables), _functions(element))


def unconsumed_streams(app: ast.App) -> list[Write]:
    """The first write of each stream that no element reads and no @sink publishes: nobody can consume its events."""
    infos = describe(app)
    read = {item.name for info in infos for item in (*info.reads, *info.tables)}
    found: dict[str, Write] = {}
    for write in (write for info in infos for write in info.writes):
        definition = app.definition(write.name)
        sinkless = definition is None or (isinstance(definition, ast.StreamDefinition) and not definition.annotations_named("sink"))
        if sinkless and write.name not in read:
            found.setdefault(write.name, write)
    return list(found.values())


def unconsumed_note(app_name: str, stream: str) -> str:
    """What to add so users can consume a stream `unconsumed_streams` found."""
    return (
        f"stream '{stream}' is read by no query and has no @sink, so nothing can consume its events; add "
        f"@sink(type='kafka', @map(type='json')) above its `define stream {stream} (...)` (write one if there is none) to publish them "
        f"to topic '{topic_name(app_name, stream)}'."
    )


def _partition_key(partition: ast.Partition | None, stream: str) -> tuple[str | None, ast.Node | None]:
    key = partition.key_for(stream) if partition else None
    if isinstance(key, ast.ValuePartition):
        name = key.expression.name if isinstance(key.expression, ast.Variable) else None
        return name, key
    return None, key


def _functions(element: ast.Node) -> tuple[str, ...]:
    names = {node.name: None for node in ast.walk(element) if isinstance(node, ast.FunctionCall) and node.namespace is None}
    return tuple(names)


def element_label(info: ElementInfo, query: ast.Query | None = None) -> str:
    """How messages name an element: the @info name of the query, else of the element."""
    for node in (query, info.element):
        annotation = node.annotation("info") if node is not None else None
        name = annotation.get("name") if annotation is not None else None
        if name:
            return name
    if isinstance(info.element, ast.AggregationDefinition):
        return info.element.name
    return "Query/Partition" if info.is_partition else "Query"
