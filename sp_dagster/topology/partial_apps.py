"""Partial apps: each instance of a group as a complete Siddhi app with its transport annotations.
Built as AST (the user's definitions and queries, with `@dist` removed and Kafka @source/@sink
annotations added) and rendered with the language's renderer, so every partial app re-parses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

from sp_dagster.siddhi import ast
from sp_dagster.siddhi.render import render
from sp_dagster.siddhi.transports import COLUMN_WIRE, INSTANCE_SHARE, default_receiver_url
from sp_dagster.topology.analysis import AGGREGATION, FUNCTION, TABLE, TRIGGER, WINDOW, Catalog, is_persisted
from sp_dagster.topology.errors import TopologyError
from sp_dagster.topology.flows import Flows, is_cluster_kafka
from sp_dagster.topology.grouping import GroupSpec
from sp_dagster.topology.model import ALL, ENTRY, FIELD_GROUPING, PartialApp, Publication, Subscription, TopicSpec
from sp_dagster.topology.topics import assigned_partitions, topic_name

#: Placeholder for the messaging layer's address; the worker fills it in from its configuration.
BOOTSTRAP = "${bootstrap}"
#: How events are encoded on the topics between groups.
MAPPING = "binary"  # between execution groups
ENTRY_MAPPING = "json"  # entry topics: users publish Siddhi's JSON events to them
_PASSTHROUGH_PREFIX = "passthrough"
_AnnotatedT = TypeVar("_AnnotatedT", bound=ast.Annotated)
_NodeT = TypeVar("_NodeT", bound=ast.Node)
_MANAGER_ANNOTATIONS = ("app:name", "app:transportchannelcreationenabled")


@dataclass(frozen=True)
class Context:
    """What every partial app of a plan needs to know about the app and its wiring."""

    app: ast.App
    app_name: str
    catalog: Catalog
    flows: Flows
    topics: dict[str, TopicSpec]
    producers: dict[str, list[str]]


def partial_apps(group: GroupSpec, context: Context) -> tuple[PartialApp, ...]:
    """The `parallelism` instances of a group, `<group>-1` ... `<group>-N`."""
    instances = []
    for index in range(group.parallelism):
        name = f"{group.name}-{index + 1}"
        if group.stream is not None and not group.elements:
            elements = _passthrough_elements(group, index, name, context)
        else:
            elements = _group_elements(group, index, name, context)
        app = ast.App(elements=tuple(elements), annotations=_app_annotations(context.app, name))
        assignments = _assignments(group, index, context)
        sharded = any(isinstance(e, ast.AggregationDefinition) and _partitioned(e) for e in elements)
        instances.append(PartialApp(name, index + 1, app, render(app), assignments, name if sharded else None))
    return tuple(instances)


def _app_annotations(app: ast.App, name: str) -> tuple[ast.Annotation, ...]:
    kept = tuple(a for a in app.annotations if a.name.lower() not in _MANAGER_ANNOTATIONS)
    return (ast.Annotation("App:name", (ast.AnnotationElement(name),)), *kept)


def _assignments(group: GroupSpec, index: int, context: Context) -> tuple[tuple[str, tuple[int, ...]], ...]:
    result = {}
    for subscription in context.flows.subscriptions.get(group.name, {}).values():
        if subscription.topic is not None:
            partitions = context.topics[subscription.topic].partitions
            result[subscription.topic] = assigned_partitions(subscription.strategy, group.parallelism, partitions, index)
    return tuple(sorted(result.items()))


# --------------------------------------------------------------------------- execGroups and aggregations


def _group_elements(group: GroupSpec, index: int, instance: str, context: Context) -> list[ast.Element]:
    catalog = context.catalog
    own = {info.element.name for info in group.elements if isinstance(info.element, ast.AggregationDefinition)}
    names = {name: None for info in group.elements for name in info.names()} | dict.fromkeys(own)
    subscriptions = context.flows.subscriptions.get(group.name, {})
    publications = context.flows.publications.get(group.name, [])
    transported = {s.stream for s in subscriptions.values() if s.topic} | {p.stream for p in publications}
    definitions: list[ast.Element] = []
    for element in context.app.elements:
        if not isinstance(element, ast.Definition) or element.name not in names:
            continue
        kind = catalog.kind(element.name)
        if kind in (TABLE, WINDOW, TRIGGER):
            definitions.append(element)
        elif kind == AGGREGATION:
            assert isinstance(element, ast.AggregationDefinition)  # validation made every name unique
            if element.name in own:
                definitions.append(_sharded(_without_dist(element), group.parallelism > 1))
            elif is_persisted(element):
                definitions.extend(_aggregation_view(element, group, context))
        elif kind != FUNCTION:
            assert isinstance(element, ast.StreamDefinition)  # a defined name of no other kind
            definitions.append(_stream_definition(element, group, index, instance, context))
    functions = {name for info in group.elements for name in info.functions if catalog.kind(name) == FUNCTION}
    definitions += [e for e in context.app.elements if isinstance(e, ast.FunctionDefinition) and e.name in functions]
    for stream in (name for name in names if name in transported and catalog.stream(name) is None):
        definition = ast.StreamDefinition(name=stream, attributes=_attributes(stream, group, context))
        definitions.append(_stream_definition(definition, group, index, instance, context))
    executables = [_without_dist(info.element) for info in group.elements if not isinstance(info.element, ast.AggregationDefinition)]
    return definitions + executables


def _stream_definition(definition: ast.StreamDefinition, group: GroupSpec, index: int, instance: str, context: Context) -> ast.StreamDefinition:
    """The user's definition with the user @source/@sink this group keeps, then the injected ones."""
    stream = definition.name
    hosts_source = context.flows.source_hosts.get(stream) == group.name
    producers = context.producers.get(stream, ())
    # User sinks stay with the groups that produce the stream's events (each event leaves once).
    keeps_sink = group.name in producers or (hosts_source and not producers)
    annotations = []
    for annotation in definition.annotations:
        kind = annotation.name.lower()
        if (kind == "source" and not hosts_source) or (kind == "sink" and not keeps_sink):
            continue
        if kind in ("source", "sink"):
            annotation = _on_cluster(_without_nested_dist(annotation), context.app_name, stream)
        annotations.append(annotation)
    subscription = context.flows.subscriptions.get(group.name, {}).get(stream)
    if subscription is not None and subscription.topic is not None:
        annotations.append(_kafka_source(subscription, group, index, instance, context))
    annotations += [_kafka_sink(p) for p in context.flows.publications.get(group.name, []) if p.stream == stream]
    return dataclasses.replace(definition, annotations=tuple(annotations))


def _view_stream(source: str, group_name: str) -> str:
    return f"{source}_{group_name.replace('-', '_')}"


def is_aggregation_view(aggregation: ast.AggregationDefinition, group_name: str) -> bool:
    """True when an aggregation of group `group_name`'s partial app is a view (the group reads the
    aggregation's store; another group feeds it), False in the group that feeds it."""
    return aggregation.input.stream.endswith(_view_stream("", group_name))


def _aggregation_view(aggregation: ast.AggregationDefinition, group: GroupSpec, context: Context) -> list[ast.Element]:
    """A persisted aggregation read by another group: a copy over a stream nothing publishes to,
    so the copy only reads the shared store (as the original's renamed `<source>_<group>`)."""
    source = aggregation.input.stream
    renamed = _view_stream(source, group.name)
    stream = ast.StreamDefinition(name=renamed, attributes=_attributes(source, group, context))
    copy = _rename_stream(_without_dist(aggregation), source, renamed)
    return [stream, _sharded(copy, _shard_count(aggregation) > 1)]


def _sharded(aggregation: ast.AggregationDefinition, shards: bool) -> ast.AggregationDefinition:
    """An aggregation of N > 1 active-active instances (or a view of one): with @PartitionById, so
    every instance tags its rows with its shard id and every read merges the shards."""
    if not shards or _partitioned(aggregation):
        return aggregation
    marker = ast.Annotation("PartitionById", (ast.AnnotationElement("true", "enable"),))
    others = tuple(a for a in aggregation.annotations if a.name.lower() != "partitionbyid")
    return dataclasses.replace(aggregation, annotations=(*others, marker))


def reader_view(app: ast.App) -> ast.App:
    """The whole app as a reader of its deployed stores sees it: every aggregation planned as N > 1
    active-active shards carries @PartitionById, so a retrieval merges all shards' rows."""
    elements = tuple(_sharded(e, is_persisted(e) and _shard_count(e) > 1) if isinstance(e, ast.AggregationDefinition) else e for e in app.elements)
    return dataclasses.replace(app, elements=elements)


def _shard_count(aggregation: ast.AggregationDefinition) -> int:
    dist = aggregation.annotation("dist")
    return 1 if dist is None else int((dist.get("parallel") or "1").strip())


def _partitioned(aggregation: ast.AggregationDefinition) -> bool:
    annotation = aggregation.annotation("PartitionById")
    return annotation is not None and (annotation.get("enable") or "true").lower() == "true"


def _attributes(stream: str, group: GroupSpec, context: Context) -> tuple[ast.AttributeDef, ...]:
    attributes = context.catalog.attributes(stream)
    if attributes is None:  # the language's analysis could not infer them
        where = next((item.node for i in group.elements for item in (*i.reads, *i.writes) if item.name == stream), None)
        raise TopologyError(
            f"cannot work out the attributes of stream {stream}; define it with `define stream {stream} (...)`",
            getattr(where, "line", 0),
            getattr(where, "column", 0),
        )
    return tuple(ast.AttributeDef(a.name, a.type) for a in attributes)


def _without_dist(element: _AnnotatedT) -> _AnnotatedT:
    annotations = tuple(a for a in element.annotations if a.name.lower() != "dist")
    return dataclasses.replace(element, annotations=annotations)


def _rename_stream(node: _NodeT, old: str, new: str) -> _NodeT:
    """`node` with every reference to stream `old` (inputs and attribute prefixes) renamed to `new`."""
    changes = {f.name: _renamed(getattr(node, f.name), old, new) for f in dataclasses.fields(node) if f.init}
    if isinstance(node, (ast.StreamInput, ast.Variable)) and getattr(node, "stream", None) == old:
        changes["stream"] = new
    return dataclasses.replace(node, **changes)


def _renamed(value: object, old: str, new: str) -> object:
    """A field's value with stream `old` renamed to `new` in every node it holds."""
    if isinstance(value, tuple):
        return tuple(_renamed(item, old, new) for item in value)
    if not isinstance(value, ast.Node):
        return value
    return _rename_stream(value, old, new)


# --------------------------------------------------------------------------- passthroughs


def _passthrough_elements(group: GroupSpec, index: int, instance: str, context: Context) -> list[ast.Element]:
    """`define stream passthroughS` fed by the user @source (or the entry topic), published as S."""
    stream = group.stream
    assert stream is not None  # a passthrough group carries one stream
    attributes = _attributes(stream, group, context)
    inner = f"{_PASSTHROUGH_PREFIX}{stream}"
    subscription = context.flows.subscriptions[group.name][stream]
    if group.source is not None:
        source = _shared(_on_cluster(_without_nested_dist(group.source), context.app_name, stream), index, group.parallelism)
    else:
        source = _kafka_source(subscription, group, index, instance, context)
    sinks = [_kafka_sink(p) for p in context.flows.publications.get(group.name, [])]
    if group.source is not None:
        definition = context.catalog.stream(stream)
        assert definition is not None  # a passthrough carries a defined stream
        user_sinks = definition.annotations_named("sink")
        sinks = [_on_cluster(a, context.app_name, stream) for a in user_sinks] + sinks
    query = ast.Query(
        input=ast.StreamInput(inner),
        selector=ast.Selector(),
        output=ast.InsertInto(stream),
    )
    return [
        ast.StreamDefinition(name=inner, attributes=attributes, annotations=(source,)),
        ast.StreamDefinition(name=stream, attributes=attributes, annotations=tuple(sinks)),
        query,
    ]


def _shared(source: ast.Annotation, index: int, parallelism: int) -> ast.Annotation:
    """A user kafka or nats @source read by several instances, without partition.no.list: each instance
    reads its own share of the topics' partitions (`sp.instance='i/N'`), so together they read all."""
    if parallelism == 1 or (source.get("type") or "").lower() not in ("kafka", "nats") or source.get("partition.no.list") is not None:
        return source
    return dataclasses.replace(source, elements=(*source.elements, _element(INSTANCE_SHARE, f"{index + 1}/{parallelism}")))


def _without_nested_dist(annotation: ast.Annotation) -> ast.Annotation:
    return dataclasses.replace(annotation, annotations=tuple(a for a in annotation.annotations if a.name.lower() != "dist"))


# --------------------------------------------------------------------------- transport annotations


def _element(key: str, value: str) -> ast.AnnotationElement:
    return ast.AnnotationElement(value, key)


def _map(kind: str = MAPPING) -> ast.Annotation:
    if kind == MAPPING:  # the topic's wire format, recorded with the plan (a worker refuses one it does not know)
        return ast.Annotation("map", (_element("type", kind), _element("wire", COLUMN_WIRE)))
    return ast.Annotation("map", (_element("type", kind),))


def _kafka_source(subscription: Subscription, group: GroupSpec, index: int, instance: str, context: Context) -> ast.Annotation:
    """`@source(type='kafka', ...)` reading exactly this instance's partitions of the topic."""
    topic = subscription.topic
    assert topic is not None  # only a subscription to a topic is read with a kafka source
    partitions = context.topics[topic].partitions
    assigned = assigned_partitions(subscription.strategy, group.parallelism, partitions, index)
    # Broadcast: a consumer group per instance, so each reads everything; otherwise the
    # instances share the group's id and split the partitions by explicit assignment.
    group_id = instance if subscription.strategy == ALL else group.name
    threading = "partition.wise" if subscription.strategy == FIELD_GROUPING else "single.thread"
    elements = (
        _element("type", "kafka"),
        _element("topic.list", topic),
        _element("group.id", group_id),
        _element("partition.no.list", ",".join(map(str, assigned))),
        _element("threading.option", threading),
        _element("bootstrap.servers", BOOTSTRAP),
    )
    entry = context.topics[topic].role == ENTRY
    return ast.Annotation("source", elements, (_map(ENTRY_MAPPING if entry else MAPPING),))


def _kafka_sink(publication: Publication) -> ast.Annotation:
    """`@sink(type='kafka', ...)` spreading events over every partition of the topic."""
    if publication.strategy == FIELD_GROUPING:
        assert publication.partition_key is not None  # field grouping is on a key
        options = (_element("strategy", "partitioned"), _element("partitionKey", publication.partition_key))
    else:
        options = (_element("strategy", "roundRobin"),)
    destinations = tuple(ast.Annotation("destination", (_element("partition.no", str(number)),)) for number in range(publication.partitions))
    distribution = ast.Annotation("distribution", options, destinations)
    elements = (_element("type", "kafka"), _element("topic", publication.topic), _element("bootstrap.servers", BOOTSTRAP))
    return ast.Annotation("sink", elements, (_map(), distribution))


def _on_cluster(annotation: ast.Annotation, app_name: str, stream: str) -> ast.Annotation:
    """A user kafka @source/@sink without bootstrap.servers pointed at the cluster's own Kafka; an http
    @source without receiver.url given siddhi-io-http's default."""
    if annotation.name.lower() == "source" and (annotation.get("type") or "").lower() == "http" and annotation.get("receiver.url") is None:
        return dataclasses.replace(annotation, elements=(*annotation.elements, _element("receiver.url", default_receiver_url(app_name, stream))))
    if not is_cluster_kafka(annotation):
        return annotation
    elements = list(annotation.elements)
    if annotation.name.lower() == "sink" and annotation.get("topic") is None:
        elements.append(_element("topic", topic_name(app_name, stream)))
    elements.append(_element("bootstrap.servers", BOOTSTRAP))
    return dataclasses.replace(annotation, elements=tuple(elements))
