"""Who publishes each stream to which topics and who subscribes to them: passthroughs, entries, sizes."""

from __future__ import annotations

from dataclasses import dataclass, field

from sp_dagster.siddhi import ast
from sp_dagster.topology.analysis import Catalog
from sp_dagster.topology.errors import error_at
from sp_dagster.topology.grouping import GroupSpec
from sp_dagster.topology.model import (
    ALL,
    ENTRY,
    EXTERNAL,
    FIELD_GROUPING,
    INTERNAL,
    PASSTHROUGH,
    ROUND_ROBIN,
    Publication,
    Subscription,
    TopicSpec,
)
from sp_dagster.topology.strategies import Choice
from sp_dagster.topology.topics import topic_name


@dataclass
class Flows:
    """The wiring of every stream between groups."""

    passthroughs: list[GroupSpec] = field(default_factory=list)
    subscriptions: dict[str, dict[str, Subscription]] = field(default_factory=dict)  # group -> stream -> how
    publications: dict[str, list[Publication]] = field(default_factory=dict)  # group -> topics it writes
    topics: dict[str, TopicSpec] = field(default_factory=dict)
    edges: dict[str, dict[str, tuple[str, ast.Node]]] = field(default_factory=dict)  # from -> to -> (stream, read)
    source_hosts: dict[str, str] = field(default_factory=dict)  # stream -> group keeping its user @source
    emitters: dict[str, list[str]] = field(default_factory=dict)  # stream -> groups publishing it

    def subscribe(self, group: str, subscription: Subscription) -> None:
        """Record that `group` reads a stream."""
        self.subscriptions.setdefault(group, {})[subscription.stream] = subscription

    def add_topic(self, topic: TopicSpec) -> None:
        """Record a topic; one named twice keeps the larger partition count."""
        known = self.topics.get(topic.name)
        if known is None or known.partitions < topic.partitions:
            self.topics[topic.name] = topic if known is None else TopicSpec(known.name, topic.partitions, known.stream, known.partition_key, known.role)


def producers_of(groups: list[GroupSpec], catalog: Catalog) -> dict[str, list[str]]:
    """For every stream, the groups that insert into it, in group order."""
    producers: dict[str, list[str]] = {}
    for group in groups:
        for info in group.elements:
            for write in info.writes:
                names = producers.setdefault(write.name, []) if catalog.is_stream(write.name) else []
                if catalog.is_stream(write.name) and group.name not in names:
                    names.append(group.name)
    return producers


def source_parallelism(source: ast.Annotation) -> int:
    """The instances of a user @source's passthrough: its nested @dist(parallel), the least if several."""
    values = []
    for dist in source.annotations_named("dist"):
        text = (dist.get("parallel") or "").strip()
        if not text.isdigit() or int(text) < 1:
            return 1
        values.append(int(text))
    return min(values, default=1)


def plan_flows(
    app_name: str,
    groups: list[GroupSpec],
    choices: dict[str, dict[str, Choice]],
    producers: dict[str, list[str]],
    catalog: Catalog,
) -> Flows:
    """Wire every stream: passthroughs for user sources and keyed entries, topics, subscriptions."""
    flows = Flows()
    room = {group.name: group.room for group in groups}  # topics are laid out for the most instances a group may run
    order = {group.name: position for position, group in enumerate(groups)}
    readers: dict[str, dict[str, Choice]] = {}
    for group in groups:
        for stream, choice in choices[group.name].items():
            if catalog.is_stream(stream):
                readers.setdefault(stream, {})[group.name] = choice
            else:  # a trigger: each instance fires its own copy
                flows.subscribe(group.name, Subscription(stream, ALL))
    # A stream with a user @source and a @sink that no query reads still carries its events to its sinks (a bridge).
    bridges = {name for name in catalog.definitions if _bridge(catalog.stream(name))}
    for stream in sorted(set(readers) | set(producers) | bridges):
        stream_readers = dict(sorted(readers.get(stream, {}).items(), key=lambda item: order[item[0]]))
        _wire(app_name, stream, stream_readers, producers.get(stream, []), room, catalog, flows)
    _external_topics(app_name, groups, catalog, flows)
    return flows


def _wire(
    app_name: str,
    stream: str,
    readers: dict[str, Choice],
    producers: list[str],
    room: dict[str, int],
    catalog: Catalog,
    flows: Flows,
) -> None:
    passthroughs = _receive_user_sources(app_name, stream, readers, room, catalog, flows)
    emitters = producers + [group.name for group in passthroughs]
    entry = bool(readers) and not producers and not passthroughs and stream not in flows.source_hosts
    remote = _remote_readers(stream, readers, producers, emitters)

    keyed: dict[str, int] = {}
    round_robin = 0
    for name, choice in remote.items():
        if choice.strategy == FIELD_GROUPING:
            assert choice.key is not None  # field grouping is on a key
            keyed[choice.key] = max(keyed.get(choice.key, 0), room[name])
        elif choice.strategy == ROUND_ROBIN:
            round_robin = max(round_robin, room[name])
    unkeyed = entry or (bool(emitters) and any(c.strategy != FIELD_GROUPING for c in remote.values()))
    unkeyed_topic = topic_name(app_name, stream) if unkeyed else None
    keyed_topics = {key: topic_name(app_name, stream, key) for key in sorted(keyed)}

    # Broadcast readers read every partition, so only round-robin readers need more than one;
    # a single partition keeps the stream in order for the broadcast readers.
    if unkeyed_topic:
        flows.add_topic(TopicSpec(unkeyed_topic, round_robin or 1, stream, None, ENTRY if entry else INTERNAL))
    for key, topic in keyed_topics.items():
        flows.add_topic(TopicSpec(topic, keyed[key], stream, key))
    publications = [Publication(stream, FIELD_GROUPING, key, topic, keyed[key]) for key, topic in keyed_topics.items()]
    if unkeyed_topic and not entry:
        publications.insert(0, Publication(stream, ROUND_ROBIN if round_robin else ALL, None, unkeyed_topic, round_robin or 1))
    if entry and keyed:  # users publish unkeyed: a passthrough routes the entry topic by key
        router = _group(app_name, stream, "", 1, catalog, receiver=False)
        flows.subscribe(router.name, Subscription(stream, ALL, None, unkeyed_topic))
        passthroughs.append(router)
        emitters = [router.name]
    flows.emitters[stream] = emitters
    flows.passthroughs.extend(passthroughs)
    for emitter in emitters:
        flows.publications.setdefault(emitter, []).extend(publications)

    for name, choice in remote.items():
        if choice.strategy == FIELD_GROUPING:
            assert choice.key is not None  # field grouping is on a key
            topic = keyed_topics[choice.key]
        else:
            topic = unkeyed_topic
        flows.subscribe(name, Subscription(stream, choice.strategy, choice.key, topic))
        if topic is not None and topic != (unkeyed_topic if entry else None):
            for emitter in emitters:
                flows.edges.setdefault(emitter, {}).setdefault(name, (stream, choice.read.node))


def _receive_user_sources(app_name: str, stream: str, readers: dict[str, Choice], room: dict[str, int], catalog: Catalog, flows: Flows) -> list[GroupSpec]:
    """Passthroughs for a user-source stream read in parallel or by several groups; otherwise
    the single parallel-1 reader keeps the source (recorded as the stream's host)."""
    definition = catalog.stream(stream)
    sources = definition.annotations_named("source") if definition is not None else ()
    if not sources or not (readers or _bridge(definition)):
        return []
    wanted = max(source_parallelism(source) for source in sources)
    # HTTP receivers always run as receiver (passthrough) partial apps, on receiver nodes when there are any.
    receives = any((source.get("type") or "").lower() == "http" for source in sources)
    if len(readers) == 1 and wanted == 1 and all(room[name] == 1 for name in readers) and not receives:
        flows.source_hosts[stream] = next(iter(readers))
        return []
    passthroughs = _source_passthroughs(app_name, stream, sources, catalog)
    for passthrough in passthroughs:
        flows.subscribe(passthrough.name, Subscription(stream, ALL))
    return passthroughs


def _bridge(definition: ast.StreamDefinition | None) -> bool:
    """True for a stream definition with a user @source and a @sink."""
    return definition is not None and bool(definition.annotations_named("source")) and bool(definition.annotations_named("sink"))


def _remote_readers(stream: str, readers: dict[str, Choice], producers: list[str], emitters: list[str]) -> dict[str, Choice]:
    """The readers that receive the stream from a topic (a producer reads its own output locally)."""
    remote = {}
    for name, choice in readers.items():
        if name not in producers:
            remote[name] = choice
        elif len(emitters) > 1:
            others = ", ".join(e for e in emitters if e != name)
            raise error_at(
                choice.read.node,
                f"Unsupported: execGroup {name} both publishes {stream} and consumes it while other execGroups "
                f"({others}) publish it too, so it would read its own events back; give the streams different names",
            )
    return remote


def _source_passthroughs(app_name: str, stream: str, sources: tuple[ast.Annotation, ...], catalog: Catalog) -> list[GroupSpec]:
    # One group per @source, each hosting only its own source (the original made one per
    # annotation of the definition, each carrying every @source: every event came in N times).
    groups = []
    for number, source in enumerate(sources, start=1):
        suffix = f"-{number}" if len(sources) > 1 else ""
        group = _group(app_name, stream, suffix, source_parallelism(source), catalog, receiver=True)
        group.source = source
        group.declared_at = source
        groups.append(group)
    return groups


def _group(app_name: str, stream: str, suffix: str, parallelism: int, catalog: Catalog, receiver: bool) -> GroupSpec:
    exec_group = f"passthrough-{stream}{suffix}"
    position = catalog.positions.get(stream, 0)
    return GroupSpec(f"{app_name}-{exec_group}", exec_group, PASSTHROUGH, parallelism, position, receiver=receiver, stream=stream)


def _external_topics(app_name: str, groups: list[GroupSpec], catalog: Catalog, flows: Flows) -> None:
    """Topics of user kafka @source/@sink annotations that leave bootstrap.servers to the cluster."""
    used = {name for group in groups for info in group.elements for name in info.names()}
    used |= {group.carried for group in flows.passthroughs}
    hosts = {group.name: group.parallelism for group in groups + flows.passthroughs}
    for stream in sorted(used):
        definition = catalog.stream(stream)
        if definition is None:
            continue
        for sink in definition.annotations_named("sink"):
            if is_cluster_kafka(sink) and stream in flows.emitters and flows.emitters[stream]:
                for topic, partitions in addressed_topics(sink, topic_name(app_name, stream)).items():
                    flows.add_topic(TopicSpec(topic, partitions, stream, None, EXTERNAL))
        for source in definition.annotations_named("source"):
            if not is_cluster_kafka(source):
                continue
            readers = [g.name for g in flows.passthroughs if g.source is source]
            readers += [flows.source_hosts[stream]] if stream in flows.source_hosts else []
            for topic in (source.get("topic.list") or "").split(","):
                if topic.strip() and readers:
                    flows.add_topic(TopicSpec(topic.strip(), max(hosts[r] for r in readers), stream, None, EXTERNAL))


def addressed_topics(sink: ast.Annotation, default: str) -> dict[str, int]:
    """The topics a kafka @sink writes, each with as many partitions as it addresses
    (partition.no on the sink or on its @destinations, or one per partition.no destination)."""
    distribution = sink.annotation("distribution")
    destinations = distribution.annotations_named("destination") if distribution else ()

    def number(annotation: ast.Annotation) -> int:
        text = (annotation.get("partition.no") or "").strip()
        return int(text) + 1 if text.isdigit() else 1

    wanted = number(sink)
    topics: dict[str, int] = {}
    for destination in destinations:
        topic = destination.get("topic") or sink.get("topic") or default
        topics[topic] = max(topics.get(topic, wanted), number(destination))
    return topics or {sink.get("topic") or default: wanted}


def is_cluster_kafka(annotation: ast.Annotation) -> bool:
    """True for a user kafka @source/@sink without bootstrap.servers: it uses the cluster's own."""
    return (annotation.get("type") or "").lower() == "kafka" and annotation.get("bootstrap.servers") is None
