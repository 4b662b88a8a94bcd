"""What a worker needs to run one partial-app instance, read from its transport annotations into an
`InstancePlan`: which topic partitions (or HTTP receivers) feed which stream, which streams go to
which topics, HTTP endpoints or the log and how, and whether the instance can run keyed by its
partition key. `check_supported` refuses what workers cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from sp_dagster.errors import SpDagsterError
from sp_dagster.messaging.codecs import Attribute
from sp_dagster.messaging.maps import MapSpec, spec_of
from sp_dagster.siddhi import SiddhiQLError, ast, parse
from sp_dagster.siddhi.transports import BOOTSTRAP_PLACEHOLDER, COLUMN_WIRE, EVENT_WIRE, INSTANCE_SHARE, basic_auth_enabled, check_transports, http_headers

SUPPORTED_SINKS = ("kafka", "nats", "http", "log")
#: siddhi-io-nats's defaults for a nats @source/@sink that names no server or cluster id.
NATS_DEFAULT_SERVERS, NATS_DEFAULT_CLUSTER = "nats://localhost:4222", "test-cluster"


class InstancePlanError(SpDagsterError):
    """A partial app that a worker cannot run as written."""


@dataclass(frozen=True)
class NatsEndpoint:
    """Where a user nats @source/@sink reads or writes: its bootstrap.servers and cluster.id (None: not given)."""

    servers: str | None = None
    cluster_id: str | None = None

    def resolve(self, own_servers: str | None, own_cluster_id: str | None) -> tuple[str, str]:
        """(servers, clusterId): without bootstrap.servers, the cluster's own NATS (when it runs on NATS) or
        siddhi-io-nats's default server; without cluster.id, the cluster's own (on its servers) or `test-cluster`."""
        if self.servers:
            return self.servers, self.cluster_id or NATS_DEFAULT_CLUSTER
        if own_servers:
            return own_servers, self.cluster_id or own_cluster_id or NATS_DEFAULT_CLUSTER
        return NATS_DEFAULT_SERVERS, self.cluster_id or NATS_DEFAULT_CLUSTER


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
    mapping: MapSpec | None = None  # the user's @map (None: `codec` as it stands)
    share: tuple[int, int] | None = None  # (i, N): instance i (1-based) of N splits the topic's partitions
    seq: bool = False  # siddhi-io-kafka's seq.enabled: messages carry `sequenceId:seqNo~` headers
    properties: tuple[tuple[str, str], ...] = ()  # optional.configuration of the consumer
    nats: NatsEndpoint | None = None  # a user nats @source: its topic is `destination` on this NATS
    start: int | None = None  # a nats @source's subscription.sequence: where to read from without a checkpoint


def wire_of(mapping: MapSpec | None) -> str:
    """The wire format a binary map records (one event per message when it records none)."""
    return (mapping.option("wire") if mapping is not None else None) or EVENT_WIRE


@dataclass(frozen=True)
class OutputTopic:
    """Events of `stream` are published to `topic` over `partitions` partitions with `strategy`.

    A user sink may instead name one topic per @destination (`topics`, chosen per event by the
    strategy), a fixed `partition`, a message `key` template, and its own cluster (`bootstrap`).
    `partitions` 0 means: as many as the topic has."""

    stream: str
    topic: str
    strategy: str
    partition_key: str | None
    partitions: int
    codec: str
    attributes: tuple[Attribute, ...]
    bootstrap: str | None = None
    mapping: MapSpec | None = None
    topics: tuple[str, ...] = ()  # one per @destination(topic=...)
    partition: int | None = None  # partition.no on the sink
    destination_partitions: tuple[int, ...] = ()  # one per @destination(partition.no=...)
    key: str | None = None  # the message key, a {{attr}} template
    properties: tuple[tuple[str, str], ...] = ()  # optional.configuration of the producer
    nats: NatsEndpoint | None = None  # a user nats @sink: its topics are destinations on this NATS

    @property
    def by_column(self) -> bool:
        """True when its events go out as rows, for batches by column (an inter-group topic planned with COLUMN_WIRE)."""
        return self.codec == "binary" and wire_of(self.mapping) == COLUMN_WIRE


@dataclass(frozen=True)
class HttpDestination:
    """One endpoint of an HTTP sink."""

    url: str
    headers: tuple[tuple[str, str], ...] = ()
    username: str | None = None
    password: str | None = None


@dataclass(frozen=True)
class HttpOutput:
    """Events of `stream` are sent to HTTP endpoints, one chosen per event by `strategy`."""

    stream: str
    destinations: tuple[HttpDestination, ...]
    strategy: str
    partition_key: str | None
    method: str
    mapping: MapSpec
    attributes: tuple[Attribute, ...]
    content_type: str | None = None


@dataclass(frozen=True)
class HttpInput:
    """Events of `stream` arrive as HTTP requests at `url` (a receiver partial app)."""

    stream: str
    url: str
    basic_auth: bool
    mapping: MapSpec
    attributes: tuple[Attribute, ...]
    workers: int = 1  # worker.count: processes serving the URL (receivers/processes.py)

    @property
    def secure(self) -> bool:
        """True when the receiver listens on https:// (TLS with the node's receiverTls)."""
        return urlsplit(self.url).scheme.lower() == "https"


@dataclass(frozen=True)
class LogOutput:
    """Events of `stream` are logged with a prefix at a priority."""

    stream: str
    prefix: str | None = None
    priority: str = "INFO"


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
    http_inputs: tuple[HttpInput, ...] = ()
    http_outputs: tuple[HttpOutput, ...] = ()
    logs: tuple[LogOutput, ...] = ()

    @property
    def cluster_output_topics(self) -> list[str]:
        """The topics it publishes to on its own cluster (not another's, not NATS), sorted."""
        return sorted({t for o in self.outputs if not o.bootstrap and not o.nats for t in (o.topic, *o.topics) if t})

    @property
    def feeds_groups_only(self) -> bool:
        """True when it keeps no state and every output goes, in batches by column, to other execution groups
        of its cluster, which drop by origin what it publishes again: its turns need no transaction."""
        return (
            self.stateless
            and bool(self.outputs)
            and not self.http_outputs
            and all(o.by_column and not o.bootstrap and not o.nats and not o.topics for o in self.outputs)
        )


def _attributes(definition: ast.StreamDefinition) -> tuple[Attribute, ...]:
    return tuple(Attribute(a.name, a.type) for a in definition.attributes)


def _bootstrap(annotation: ast.Annotation) -> str | None:
    value = annotation.get("bootstrap.servers")
    return None if value in (None, BOOTSTRAP_PLACEHOLDER) else value


def _int_list(text: str | None) -> tuple[int, ...]:
    return tuple(int(part) for part in (text or "").split(",") if part.strip())


def _properties(annotation: ast.Annotation) -> tuple[tuple[str, str], ...]:
    items = (p.partition(":") for p in (annotation.get("optional.configuration") or "").split(",") if p.strip())
    return tuple((name.strip(), value.strip()) for name, _colon, value in items)


def _share(annotation: ast.Annotation) -> tuple[int, int] | None:
    text = annotation.get(INSTANCE_SHARE)
    if not text:
        return None
    index, _slash, count = text.partition("/")
    return int(index), int(count)


def check_supported(name: str, app: ast.App) -> None:
    """Raise InstancePlanError (file:line:col and a sentence) for the first source, sink or map
    workers cannot run: the same check `validate`, `plan` and `deploy` make (`siddhi.transports`)."""
    errors: list[SiddhiQLError] = []
    check_transports(app, lambda message, node: errors.append(SiddhiQLError(message, node.line, node.column)))
    if errors:
        first = min(errors, key=lambda e: (e.line, e.column))
        raise InstancePlanError(f"{name}:{first.line}:{first.column}: {first.message}")


def plan_instance(name: str, siddhi: str) -> InstancePlan:
    """Read a partial app's transport annotations into an InstancePlan.

    The topology planner writes every partial app as complete SiddhiQL whose Kafka @source and @sink
    annotations name topics, partitions, mapping and publishing strategy; user sources and sinks
    (kafka, nats, http, log) stand next to them."""
    app = parse(siddhi, name)
    check_supported(name, app)
    inputs, outputs, logs, http_inputs, http_outputs = [], [], [], [], []
    for definition in app.definitions:
        if not isinstance(definition, ast.StreamDefinition):
            continue
        attributes = _attributes(definition)
        for source in definition.annotations_named("source"):
            mapping = spec_of(source.annotation("map"))
            if (source.get("type") or "").lower() == "http":
                workers = int(source.get("worker.count") or 1)  # checked by check_supported
                http_inputs.append(HttpInput(definition.name, source.get("receiver.url", ""), basic_auth_enabled(source), mapping, attributes, workers))
                continue
            if (source.get("type") or "").lower() == "nats":
                inputs.append(_nats_input(definition.name, source, attributes, mapping))
                continue
            partitions = _int_list(source.get("partition.no.list"))
            keyed = (source.get("threading.option") or "").lower() == "partition.wise" and bool(partitions)
            seq = (source.get("seq.enabled") or "false").lower() == "true"
            for topic in (t.strip() for t in (source.get("topic.list") or "").split(",") if t.strip()):
                inputs.append(
                    InputTopic(
                        definition.name,
                        topic,
                        partitions,
                        mapping.type,
                        attributes,
                        _bootstrap(source),
                        keyed,
                        mapping,
                        None if partitions else _share(source),
                        seq,
                        _properties(source),
                    )
                )
        for sink in definition.annotations_named("sink"):
            kind = (sink.get("type") or "").lower()
            if kind == "log":
                logs.append(LogOutput(definition.name, sink.get("prefix"), (sink.get("priority") or "INFO").upper()))
            elif kind == "http":
                http_outputs.append(_http_output(definition.name, sink, attributes))
            elif kind == "nats":
                outputs.append(_nats_output(definition.name, sink, attributes))
            else:
                outputs.append(_kafka_output(definition.name, sink, attributes))
    if not inputs and not http_inputs:
        raise InstancePlanError(f"{name}: no @source: a partial app needs at least one input topic or HTTP receiver")
    return InstancePlan(
        name,
        siddhi,
        tuple(inputs),
        tuple(outputs),
        tuple(log.stream for log in logs),
        _partition_key(app, inputs),
        _stateless(app),
        http_inputs=tuple(http_inputs),
        http_outputs=tuple(http_outputs),
        logs=tuple(logs),
    )


def _distribution(sink: ast.Annotation) -> tuple[str, str | None, tuple[ast.Annotation, ...]]:
    distribution = sink.annotation("distribution")
    if distribution is None:
        return "roundRobin", None, ()
    return distribution.get("strategy") or "roundRobin", distribution.get("partitionKey"), distribution.annotations_named("destination")


def _kafka_output(stream: str, sink: ast.Annotation, attributes: tuple[Attribute, ...]) -> OutputTopic:
    strategy, key, destinations = _distribution(sink)
    mapping = spec_of(sink.annotation("map"))
    topics = tuple(d.get("topic", "") for d in destinations if d.get("topic"))
    by_partition = tuple(int(d.get("partition.no", "")) for d in destinations if d.get("partition.no") is not None and not d.get("topic"))
    partition = int(sink.get("partition.no", "")) if sink.get("partition.no") is not None else None
    if by_partition:
        partitions = len(by_partition)
    elif partition is not None:
        partitions = partition + 1
    else:
        partitions = 0  # as many as the topic has
    return OutputTopic(
        stream,
        sink.get("topic") or (topics[0] if topics else ""),
        strategy,
        key,
        partitions,
        mapping.type,
        attributes,
        _bootstrap(sink),
        mapping,
        topics,
        partition,
        by_partition if by_partition != tuple(range(len(by_partition))) else (),
        sink.get("key"),
        _properties(sink),
    )


def _nats_endpoint(annotation: ast.Annotation) -> NatsEndpoint:
    return NatsEndpoint(_bootstrap(annotation), annotation.get("cluster.id"))


def _nats_input(stream: str, source: ast.Annotation, attributes: tuple[Attribute, ...], mapping: MapSpec) -> InputTopic:
    """A user nats @source: topic `destination` of its NATS server and cluster, shared among the instances that read it."""
    sequence = source.get("subscription.sequence")
    return InputTopic(
        stream,
        source.get("destination", "").strip(),
        (),
        mapping.type,
        attributes,
        mapping=mapping,
        share=_share(source),
        nats=_nats_endpoint(source),
        start=int(sequence) if sequence is not None else None,
    )


def _nats_output(stream: str, sink: ast.Annotation, attributes: tuple[Attribute, ...]) -> OutputTopic:
    """A user nats @sink: topic `destination` (or one per @destination, their partition 0) on its NATS server and cluster."""
    strategy, key, destinations = _distribution(sink)
    mapping = spec_of(sink.annotation("map"))
    topics = tuple(d.get("destination", "").strip() for d in destinations if d.get("destination"))
    topic = (sink.get("destination") or "").strip() or topics[0]
    return OutputTopic(
        stream,
        topic,
        strategy,
        key,
        0,
        mapping.type,
        attributes,
        mapping=mapping,
        topics=topics,
        partition=0 if topics else None,
        nats=_nats_endpoint(sink),
    )


def _http_output(stream: str, sink: ast.Annotation, attributes: tuple[Attribute, ...]) -> HttpOutput:
    strategy, key, destinations = _distribution(sink)
    base = HttpDestination(
        sink.get("publisher.url") or "", http_headers(sink.get("headers") or ""), sink.get("basic.auth.username"), sink.get("basic.auth.password")
    )
    targets = tuple(
        HttpDestination(
            d.get("publisher.url") or base.url,
            http_headers(d.get("headers", "")) if d.get("headers") else base.headers,
            d.get("basic.auth.username") or base.username,
            d.get("basic.auth.password") or base.password,
        )
        for d in destinations
    ) or (base,)
    return HttpOutput(
        stream, targets, strategy, key, (sink.get("method") or "POST").upper(), spec_of(sink.annotation("map")), attributes, sink.get("content.type")
    )


def _partition_key(app: ast.App, inputs: list[InputTopic]) -> str | None:
    """The key to run one engine per key by: every query sits in a value partition on that one
    attribute, and every input stream is partitioned by it. Otherwise None (one engine)."""
    keys = set()
    for _query, partition in app.queries():
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
