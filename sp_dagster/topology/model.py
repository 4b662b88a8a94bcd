"""The plan of a distributed app: execution groups, their subscriptions and publications, topics.
Every class is an immutable value; `sp_dagster.topology.output` turns a Topology into the JSON
contract, text or Mermaid.
"""

from __future__ import annotations

from dataclasses import dataclass

from sp_dagster.siddhi import ast

#: Every instance receives every event of the stream (parallel 1, broadcast, triggers).
ALL = "all"
#: The events are spread over the instances; each event reaches one of them.
ROUND_ROBIN = "round_robin"
#: Events are routed by a key attribute; all events of one key reach the same instance.
FIELD_GROUPING = "field_grouping"
STRATEGIES = (ALL, ROUND_ROBIN, FIELD_GROUPING)

#: Kinds of execution group.
USER = "user"  # the queries and partitions of one execGroup (or of the default group)
PASSTHROUGH = "passthrough"  # moves events from a user @source (or an entry topic) onto topics
AGGREGATION = "aggregation"  # one `define aggregation` (with queries that join it in memory)

#: Roles of topics.
INTERNAL = "internal"  # between execution groups
ENTRY = "entry"  # users publish to it: a stream no group produces and no @source feeds
EXTERNAL = "external"  # named by a user kafka @source/@sink that has no bootstrap.servers


@dataclass(frozen=True)
class Subscription:
    """How every instance of a group reads one input stream.

    `topic` is None when the stream does not come from a topic: a user @source kept inside the
    group, or a trigger (each instance fires its own copy).
    """

    stream: str
    strategy: str
    partition_key: str | None = None
    topic: str | None = None


@dataclass(frozen=True)
class Publication:
    """One topic a group publishes an output stream to, and how events spread over it."""

    stream: str
    strategy: str
    partition_key: str | None
    topic: str
    partitions: int


@dataclass(frozen=True)
class TopicSpec:
    """A topic the deployment needs, with its partition count."""

    name: str
    partitions: int
    stream: str
    partition_key: str | None = None
    role: str = INTERNAL


@dataclass(frozen=True)
class PartialApp:
    """Instance `index` (1-based) of a group: a complete Siddhi app and the partitions it reads."""

    name: str
    index: int
    app: ast.App
    siddhi: str
    assignments: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (topic, partitions), by topic
    # the Siddhi shardId to run it with (AppRuntime(shard_id=...)) when it has a distributed
    # aggregation (@PartitionById): its instance name, stable across restarts and moves
    shard_id: str | None = None

    def partitions_of(self, topic: str) -> tuple[int, ...]:
        """The partitions of `topic` this instance reads (empty when it does not read it)."""
        return next((parts for name, parts in self.assignments if name == topic), ())


@dataclass(frozen=True)
class ExecutionGroup:
    """A unit of execution: `parallelism` identical partial apps that share subscriptions."""

    name: str  # <app>-<execGroup>, <app>-passthrough-<stream>, <app>-aggregation-<aggregation>
    exec_group: str  # the name without the app prefix
    kind: str
    parallelism: int
    receiver: bool
    inputs: tuple[Subscription, ...] = ()  # by stream name
    outputs: tuple[Publication, ...] = ()  # by stream name, then topic
    instances: tuple[PartialApp, ...] = ()
    max_parallelism: int | None = None  # @dist(maxParallel): its topics have room for this many instances

    def input(self, stream: str) -> Subscription | None:
        """The subscription to `stream`, or None when the group does not read it from outside."""
        return next((s for s in self.inputs if s.stream == stream), None)

    def outputs_of(self, stream: str) -> tuple[Publication, ...]:
        """The topics this group publishes `stream` to."""
        return tuple(p for p in self.outputs if p.stream == stream)


@dataclass(frozen=True)
class Topology:
    """A distributed app split into execution groups, in data-flow order, and the topics between them."""

    app: str
    groups: tuple[ExecutionGroup, ...]
    topics: tuple[TopicSpec, ...]  # by name
    create_topics: bool = True  # False with @App:transportChannelCreationEnabled('false')

    def group(self, name: str) -> ExecutionGroup | None:
        """The group called `name` (full name or execGroup), or None."""
        return next((g for g in self.groups if name in (g.name, g.exec_group)), None)

    def topic(self, name: str) -> TopicSpec | None:
        """The topic called `name`, or None."""
        return next((t for t in self.topics if t.name == name), None)

    @property
    def partial_apps(self) -> tuple[PartialApp, ...]:
        """Every instance of every group, in group order."""
        return tuple(instance for group in self.groups for instance in group.instances)
