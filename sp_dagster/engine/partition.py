"""Partitions: `partition with (key of S, ...) begin ... end`, one instance per key.
Each key gets its own instance of the partition's queries, with its own state, timers and inner
streams (#S); PartitionReceiver routes the chunks of a partitioned stream, split into runs of one
key as Siddhi splits them, to the instances.
"""

from __future__ import annotations

from sp_dagster.engine.events import as_events
from sp_dagster.engine.expressions import StreamScope, compile_expression
from sp_dagster.engine.junction import StreamJunction
from sp_dagster.engine.query import QueryRuntime, Streams
from sp_dagster.engine.schema import Schema
from sp_dagster.engine.values import java_str
from sp_dagster.siddhi import ast


class PartitionRuntime:
    """One `partition with ... begin ... end` block and its per-key instances."""

    def __init__(self, partition: ast.Partition, index: int, context, names: list[str]):
        self.partition = partition
        self.context = context
        self.names = names  # query names, in order
        self.schedulers: dict = {}
        self.instances: dict[str, PartitionInstance] = {}
        self.executors: dict[str, list] = {}
        for key in partition.keys:
            junction = context.junctions[key.stream]
            scope = StreamScope(junction.schema, (key.stream,), context)
            self.executors.setdefault(key.stream, []).extend(_key_executors(key, scope))
        self.read: list[str] = []  # global streams the partition's queries read (joins and patterns too)
        for query in partition.queries:
            for stream in query.input_streams():
                if not stream.inner and stream.stream in context.junctions and stream.stream not in self.read:
                    self.read.append(stream.stream)
        # build once to check the queries and define the streams they write; keep nothing
        template = PartitionInstance(self, None)
        template.stop()
        self.receivers = []
        for stream in self.read:
            receiver = PartitionReceiver(self, stream, self.executors.get(stream, []))
            context.junctions[stream].subscribe(receiver)
            self.receivers.append(receiver)

    def scheduler(self, query_index: int, slot: str):
        """The scheduler shared by every instance's query `query_index` (window or rate)."""
        key = (query_index, slot)
        if key not in self.schedulers:
            self.schedulers[key] = self.context.clock.scheduler(f"{self.names[query_index]}.{slot}")
        return self.schedulers[key]

    def instance(self, key: str) -> PartitionInstance:
        """The instance of `key`, created on first use."""
        instance = self.instances.get(key)
        if instance is None:
            instance = self.instances[key] = PartitionInstance(self, key)
        return instance

    def snapshot(self) -> list:
        """Every instance's state, in creation order."""
        return [[key, instance.snapshot()] for key, instance in self.instances.items()]

    def restore(self, state: list) -> None:
        """Recreate the saved instances and restore them."""
        for instance in self.instances.values():
            instance.stop()
        self.instances = {}
        for key, saved in state:
            self.instance(key).restore(saved)

    def stop(self) -> None:
        """Stop every instance and unsubscribe."""
        for receiver in self.receivers:
            self.context.junctions[receiver.stream].unsubscribe(receiver)
        for instance in self.instances.values():
            instance.stop()


class PartitionInstance:
    """The queries of one partition key, with their inner and local streams."""

    def __init__(self, runtime: PartitionRuntime, key: str | None):
        self.key = key
        context = runtime.context
        self.local = {name: StreamJunction(name, context.junctions[name].schema) for name in runtime.read}
        self.inner = {
            name: StreamJunction(name, Schema.of((a.name, a.type) for a in definition.attributes), inner=True)
            for name, definition in context.analysis.inner_streams(runtime.partition).items()
        }
        streams = Streams(context, self.inner, self.local)
        self.queries = []
        for index, query in enumerate(runtime.partition.queries):
            name = runtime.names[index]
            self.queries.append(
                QueryRuntime(
                    query,
                    name,
                    context,
                    streams,
                    lambda slot, i=index: runtime.scheduler(i, slot),
                    context.callbacks_for(name),
                )
            )

    def send(self, stream: str, chunk) -> None:
        """Deliver a chunk of global stream `stream` to this instance."""
        self.local[stream].send(chunk)

    def snapshot(self) -> list:
        """Every query's state."""
        return [query.snapshot() for query in self.queries]

    def restore(self, state: list) -> None:
        """Inverse of snapshot()."""
        for query, saved in zip(self.queries, state):
            query.restore(saved)

    def stop(self) -> None:
        """Release timers."""
        for query in self.queries:
            query.stop()


def _key_executors(key, scope) -> list:
    """Functions from an event to its partition key (or None) for one key definition.

    A value partition's key is the value's string form; a range partition's keys are the labels of
    every range the event falls in.
    """
    if isinstance(key, ast.ValuePartition):
        executor = compile_expression(key.expression, scope)
        row, kind = executor.row, executor.type
        if kind == "string":  # a string is its own key
            return [row]
        return [lambda e: None if (v := row(e)) is None else java_str(v, kind)]
    functions = []
    for condition in key.ranges:
        test, label = compile_expression(condition.condition, scope).row, condition.label
        functions.append(lambda e, test=test, label=label: label if test(e) is True else None)
    return functions


class PartitionReceiver:
    """Routes chunks of one global stream to partition instances."""

    def __init__(self, runtime: PartitionRuntime, stream: str, executors: list):
        self.runtime = runtime
        self.stream = stream
        self.executors = executors

    def receive(self, chunk) -> None:
        """Split by key (or broadcast, for streams without a key) and deliver."""
        runtime = self.runtime
        if not self.executors:
            for instance in list(runtime.instances.values()):
                instance.send(self.stream, chunk)
            return
        events = chunk if type(chunk) is list else as_events(chunk)
        if len(events) == 1:
            instances = runtime.instances
            for executor in self.executors:
                key = executor(events[0])
                if key is not None:
                    instance = instances.get(key) or runtime.instance(key)
                    instance.local[self.stream].send(events)
            return
        for key, part in self._runs(events):
            runtime.instance(key).send(self.stream, part)

    def _runs(self, events):
        """Siddhi's split of a multi-event chunk into (key, events) runs."""
        runs, current_key, out = [], None, []
        for event in events:
            matched = False
            for executor in self.executors:
                key = executor(event)
                if key is None:
                    continue
                if current_key is None:
                    current_key = key
                elif current_key != key:
                    runs.append((current_key, out))
                    current_key, out = key, []
                    if matched:
                        out.append(event)
                if not matched:
                    out.append(event)
                matched = True
        if current_key is not None and out:
            runs.append((current_key, out))
        return runs
