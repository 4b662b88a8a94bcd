"""What a worker needs to run one partial-app instance, read from its transport annotations.

The topology planner writes every partial app as complete SiddhiQL whose Kafka @source and
@sink annotations name topics, partitions, mapping and publishing strategy. This module turns
them into an `InstancePlan`: which topic partitions feed which stream, which streams go to
which topics and how, and whether the instance can run keyed by its partition key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sp_dagster.errors import SpDagsterError
from sp_dagster.messaging.codecs import Attribute
from sp_dagster.siddhi import ast, parse

BOOTSTRAP_PLACEHOLDER = "${bootstrap}"
SUPPORTED_SINKS = ("kafka", "log")


class InstancePlanError(SpDagsterError):
    """A partial app that a worker cannot run as written."""


@dataclass(frozen=True)
class InputTopic:
    """Events of `stream` arrive from these partitions of `topic`."""

    stream: str
    topic: str
    partitions: tuple[int, ...]
    codec: str
    attributes: tuple[Attribute, ...]
    bootstrap: str | None = None  # None: the cluster's own messaging layer
    keyed: bool = False  # field-grouped: the message key is the partition key's string form


@dataclass(frozen=True)
class OutputTopic:
    """Events of `stream` are published to `topic` over `partitions` partitions with `strategy`."""

    stream: str
    topic: str
    strategy: str
    partition_key: str | None
    partitions: int
    codec: str
    attributes: tuple[Attribute, ...]
    bootstrap: str | None = None


@dataclass(frozen=True)
class InstancePlan:
    """How to run one instance: its app text, inputs, outputs and keying."""

    name: str
    siddhi: str
    inputs: tuple[InputTopic, ...]
    outputs: tuple[OutputTopic, ...]
    log_streams: tuple[str, ...] = ()
    partition_key: str | None = None  # run one engine per key when every query is keyed by it
    stateless: bool = False
    extras: dict = field(default_factory=dict)


def _attributes(definition: ast.StreamDefinition) -> tuple[Attribute, ...]:
    return tuple(Attribute(a.name, a.type) for a in definition.attributes)


def _bootstrap(annotation: ast.Annotation) -> str | None:
    value = annotation.get("bootstrap.servers")
    return None if value in (None, BOOTSTRAP_PLACEHOLDER) else value


def _codec(annotation: ast.Annotation, where: str) -> str:
    mapping = annotation.annotation("map")
    kind = (mapping.get("type") if mapping else None) or "json"
    if kind not in ("json", "binary"):
        raise InstancePlanError(f"{where}: @map(type='{kind}') is not supported; use 'json' or 'binary'")
    return kind


def _int_list(text: str | None, where: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in (text or "").split(",") if part.strip())
    except ValueError:
        raise InstancePlanError(f"{where}: expected partition numbers separated by commas, got {text!r}") from None


def plan_instance(name: str, siddhi: str) -> InstancePlan:
    """Read a partial app's transport annotations into an InstancePlan."""
    app = parse(siddhi, name)
    inputs, outputs, logs = [], [], []
    for definition in app.definitions:
        if not isinstance(definition, ast.StreamDefinition):
            continue
        attributes = _attributes(definition)
        for source in definition.annotations_named("source"):
            where = f"{name}: @source of {definition.name}"
            if (source.get("type") or "").lower() != "kafka":
                raise InstancePlanError(f"{where}: source type '{source.get('type')}' is not supported by workers; use kafka")
            partitions = _int_list(source.get("partition.no.list"), where)
            for topic in (t.strip() for t in (source.get("topic.list") or "").split(",") if t.strip()):
                keyed = (source.get("threading.option") or "").lower() == "partition.wise"
                inputs.append(InputTopic(definition.name, topic, partitions, _codec(source, where), attributes, _bootstrap(source), keyed))
        for sink in definition.annotations_named("sink"):
            where = f"{name}: @sink of {definition.name}"
            kind = (sink.get("type") or "").lower()
            if kind == "log":
                logs.append(definition.name)
                continue
            if kind != "kafka":
                raise InstancePlanError(f"{where}: sink type '{sink.get('type')}' is not supported by workers; use kafka or log")
            distribution = sink.annotation("distribution")
            strategy = (distribution.get("strategy") if distribution else None) or "roundRobin"
            destinations = len(distribution.annotations_named("destination")) if distribution else 0
            partitions = destinations or int(sink.get("partition.no", "0")) + 1
            key = distribution.get("partitionKey") if distribution else None
            outputs.append(
                OutputTopic(definition.name, sink.get("topic") or "", strategy, key, partitions, _codec(sink, where), attributes, _bootstrap(sink))
            )
    if not inputs:
        raise InstancePlanError(f"{name}: no Kafka @source: a partial app needs at least one input topic")
    return InstancePlan(name, siddhi, tuple(inputs), tuple(outputs), tuple(logs), _partition_key(app, inputs), _stateless(app))


def _partition_key(app: ast.App, inputs: list[InputTopic]) -> str | None:
    """The key to run one engine per key by: every query sits in a value partition on that one
    attribute, and every input stream is partitioned by it. Otherwise None (one engine)."""
    keys = set()
    for query, partition in app.queries():
        if partition is None:
            return None
        for key in partition.keys:
            if not isinstance(key, ast.ValuePartition) or not isinstance(key.expression, ast.Variable):
                return None
            keys.add((key.stream, key.expression.name))
    names = {attribute for _stream, attribute in keys}
    streams = {stream for stream, _attribute in keys}
    if len(names) != 1 or streams != {i.stream for i in inputs} or not all(i.keyed for i in inputs):
        return None
    return names.pop()


def _stateless(app: ast.App) -> bool:
    """True when every query only filters and projects: no windows, aggregates, partitions, tables."""
    from sp_dagster.siddhi.functions import AGGREGATORS

    if app.partitions or any(not isinstance(d, ast.StreamDefinition) for d in app.definitions):
        return False
    for query, _partition in app.queries():
        if not isinstance(query.input, ast.StreamInput) or query.rate is not None:
            return False
        if any(not isinstance(h, ast.Filter) for h in query.input.handlers):
            return False
        selector = query.selector
        if selector.group_by or selector.having or selector.order_by or selector.limit or selector.offset:
            return False
        for node in ast.walk(selector):
            if isinstance(node, ast.FunctionCall) and not node.namespace and node.name.lower() in AGGREGATORS:
                return False
    return True
