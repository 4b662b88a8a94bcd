"""One partial-app instance's engine, fed raw Kafka messages, returning raw messages to publish: it
decodes each input message with its topic's codec, sends it to the engine in per-partition order,
and encodes each output for its topic with the topic's publishing strategy; undecodable messages
become dead letters. Every output carries an origin by which the next group drops replays. It knows
nothing of Spark.
"""

from __future__ import annotations

import base64
import functools
import heapq
import json
import logging
import operator
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from sp_dagster.engine import AppRuntime
from sp_dagster.engine.clock import DrivenClock, PlaybackClock
from sp_dagster.engine.events import ArrowChunk
from sp_dagster.errors import EventDecodeError
from sp_dagster.messaging.maps import mapper_for
from sp_dagster.messaging.strategies import RoundRobin, strategy_for
from sp_dagster.siddhi import ast, parse
from sp_dagster.worker.instance.plan import InstancePlan
from sp_dagster.worker.instance.sinks import HTTP_PREFIX, destination_chooser, log_sink, message_key, sequenced

log = logging.getLogger(__name__)

ORIGIN_HEADER = "sp-origin"  # the header naming the upstream event a message stems from (row-exact replay drops)


class Message(NamedTuple):
    """A raw Kafka message: where it came from (or goes), its key, value and event time (a named
    tuple: a worker makes one per message)."""

    topic: str
    partition: int
    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes
    origin: bytes | None = None
    index: int = -1  # its place in the batch it came in (worker/instance/batching.py); -1: a message of its own


_new = tuple.__new__  # makes a Message without its __new__'s keyword handling: a worker makes one per event
_OFFSET = operator.itemgetter(2)  # a Message's offset
_NONE = object()  # no send yet (a send may be None: what timers fire)
_ORIGIN_KEYS: dict[bytes, str] = {}  # origin keys as read, decoded once: a partition's messages share a few


def origin_prefix(key: str, sequence: tuple[int, ...]) -> str:
    """What the sp-origin header of (key, sequence + (n,)) holds before n: one send's outputs share it."""
    if len(sequence) == 2:  # a message of a batch (offset, index), the most common
        return f"{key}|{sequence[0]}.{sequence[1]}."
    return f"{key}|{'.'.join(map(str, sequence))}." if sequence else f"{key}|"


def encode_origin(key: str, sequence: tuple[int, ...]) -> bytes:
    """The sp-origin header value."""
    if not sequence:
        return f"{key}|".encode()
    return f"{origin_prefix(key, sequence[:-1])}{sequence[-1]}".encode()


@functools.lru_cache(maxsize=64)
def _parsed(name: str, siddhi: str) -> ast.App:
    return parse(siddhi, name)


def needs_wakeups(plan: InstancePlan) -> bool:
    """True when the instance's outputs may come from wall-clock time passing, not only from
    its input: its host must wake it at next_wakeup() (no @app:playback, and timers in use)."""
    app = _parsed(plan.name, plan.siddhi)
    if app.playback:
        return False
    engine = AppRuntime(app, clock=DrivenClock())
    try:
        return engine.uses_timers
    finally:
        engine.shutdown()


def identity_copy(app: ast.App) -> tuple[str, str] | None:
    """(S, T) when the app's only element besides stream definitions is `from S select * insert into T`,
    T's attributes of S's types: every event of S comes out of T as it went in, nothing else ever does."""
    queries = [e for e in app.elements if not isinstance(e, ast.StreamDefinition)]
    if len(queries) != 1 or not isinstance(query := queries[0], ast.Query) or query.rate is not None:
        return None
    source, selector, output = query.input, query.selector, query.output
    if not isinstance(source, ast.StreamInput) or source.handlers or source.inner or source.fault:
        return None
    if not selector.star or selector.group_by or selector.having or selector.order_by or selector.limit or selector.offset:
        return None
    if not isinstance(output, ast.InsertInto) or output.event_type != "current" or output.inner or output.target == source.stream:
        return None
    streams = [app.definition(source.stream), app.definition(output.target)]
    if not all(isinstance(d, ast.StreamDefinition) for d in streams):
        return None
    types = [[a.type for a in d.attributes] for d in streams]  # type: ignore[union-attr]
    return (source.stream, output.target) if types[0] == types[1] else None


def dead_letter(instance: str, message: Message, reason: str) -> dict:
    """The JSON body of a dead-letter message: where the bad message was, why, and its bytes."""
    return {
        "instance": instance,
        "topic": message.topic,
        "partition": message.partition,
        "offset": message.offset,
        "timestamp": message.timestamp,
        "reason": reason,
        "data_base64": base64.b64encode(message.value or b"").decode("ascii"),
    }


class InstanceRuntime:
    """The engine of one instance (or of one key of it), with codecs and strategies around it.

    Input messages go to the engine in per-partition order, partitions merged by event time. Undecodable
    messages become dead-letter messages with the reason. It knows nothing of Spark, so it is tested on
    its own, and run by `loop.py`, the receivers and `spark/microbatch.py`.

    Exactly-once effect across failovers. Delivery between groups is at-least-once: an instance
    that takes over replays from its last saved state and publishes some events again. Every
    published event therefore carries an *origin* (the `sp-origin` header): a key naming where it
    stems from and a sequence that grows along that key. A stateful instance names its outputs
    after its own input (`group@topic:partition`, sequence `(offset, n)`); a stateless one passes
    its input's origin on, extended (`_origin`). Replays produce the same origins, so each instance
    keeps the highest sequence seen per (input partition, origin key) in its state and drops what it
    has already seen: duplicates never reach a window or an aggregate.

    Time. An app with `@app:playback` runs on event time, as in process. Any other runs on the
    wall clock as its host tells it (a DrivenClock): each `process(messages, now)` first moves
    time to `now`, firing what fell due, and the host comes back at `next_wakeup()` to call
    `advance(now)` when no event arrives. Outputs fired by time name the clock of their engine
    key, or of their instance (`group@clock:key`, sequence `(due time, n)`), as replays of them do."""

    def __init__(self, plan: InstancePlan, dead_letter_topic: str | None = None, *, key: str = "", now: int | None = None, partitions_of=None):
        self.plan = plan
        self.partitions_of = partitions_of  # topic -> partition count, for user sinks that address every partition
        self.dead_letter_topic = dead_letter_topic
        app = _parsed(plan.name, plan.siddhi)
        # The worker's engine settings (datasources, aggregation shard id), carried in the plan's extras.
        options = plan.extras.get("engine", {})
        self.engine = AppRuntime(app, clock=PlaybackClock() if app.playback else DrivenClock(now), **options)
        self._inputs = {i.topic: (i.stream, mapper_for(i.mapping or i.codec, i.attributes)) for i in plan.inputs}
        self._inputs.update({f"{HTTP_PREFIX}{i.stream}": (i.stream, mapper_for(i.mapping, i.attributes)) for i in plan.http_inputs})
        self._sequenced = {i.topic for i in plan.inputs if i.seq}
        # One input topic in a form read a poll at a time (a user source's JSON): its messages are decoded together.
        bulk = [codec for topic, (_s, codec) in self._inputs.items() if codec.bulk and topic not in self._sequenced]
        self._bulk = bulk[0] if len(bulk) == len(self._inputs) == 1 else None
        self._out: list[Message] = []
        self.rows_in = self.rows_out = self.rejected = self.duplicates = 0
        self.group = plan.name.rsplit("-", 1)[0]
        self.seen: dict[tuple[str, int, str], tuple[int, ...]] = {}
        self._named: dict[tuple[str, int, str], str] = {}  # (topic, partition, origin key) -> its outputs' origin key
        # What the wall clock's outputs are named after: per key (micro-batch) or per instance, never
        # shared by two instances, whose outputs may meet downstream at the same due time.
        self.clock_origin = f"{self.group}@clock:{key or plan.name}"
        self._tick = [0, 0]  # the time of the last advance and how many outputs it has named
        # Each output stream's events are collected as the engine delivers them (whole runs at
        # once where it can), then published with the origin of the send they stem from.
        self._emitters: list[tuple[_Collector, Callable[[list, list, list], None]]] = []
        self._turns: list[RoundRobin] = []  # the round-robin outputs' places, kept in snapshots
        for output in plan.outputs:
            self._emitters.append((self._collector(output.stream), self._publisher(output)))
        for output in plan.http_outputs:
            self._emitters.append((self._collector(output.stream), self._http_publisher(output)))
        for sink in plan.logs:
            self.engine.add_callback(sink.stream, log_sink(plan.name, sink))
        # A partial app that only copies one stream to a published one (a passthrough or a receiver's
        # group) hands its input rows straight to the copy's publisher: the engine would return them as they are.
        self._copy: tuple[str, _Collector] | None = None  # (the input stream, its copy's collector)
        copy, published = identity_copy(app), [o.stream for o in plan.outputs]
        sinks = published + [o.stream for o in plan.http_outputs] + [s.stream for s in plan.logs]
        if copy is not None and copy[0] not in sinks and sinks.count(copy[1]) == 1 and copy[1] in published:  # the copy's one sink
            self._copy = (copy[0], self._emitters[published.index(copy[1])][0])

    def _collector(self, stream: str) -> _Collector:
        collector = _Collector(self.engine)
        self.engine.add_receiver(stream, collector)
        return collector

    def _publisher(self, output):
        codec = mapper_for(output.mapping or output.codec, output.attributes)
        names = [a.name for a in output.attributes]
        if output.topics:  # one topic per @destination: the strategy picks destinations, Siddhi's way
            choose = destination_chooser(output.strategy, names, output.partition_key, len(output.topics), self._turn())
        else:
            strategy = strategy_for(output.strategy, names, output.partition_key)
            if isinstance(strategy, RoundRobin):
                self._turns.append(strategy)
        count = output.partitions

        def publish(rows, stamps, origins) -> None:
            nonlocal count
            append, before = self._out.append, len(self._out)
            if not output.topics and output.partition is None and not output.destination_partitions and not output.key:
                # The common case (an inter-group topic, a user topic spread by a strategy): a lean loop.
                if not count:
                    count = self.partitions_of(output.topic) if self.partitions_of else 1
                place, topic = strategy.place, output.topic
                encode = None if output.by_column else codec.encode  # by column: `pack` writes the rows as they are
                for data, stamp, origin in zip(rows, stamps, origins):
                    value = encode(data) if encode else data
                    key, chosen = place(data, count)
                    for partition in chosen:
                        append(_new(Message, (topic, partition, -1, stamp, key, value, origin, -1)))
                self.rows_out += len(self._out) - before
                return
            for data, stamp, origin in zip(rows, stamps, origins):
                value = data if output.by_column else codec.encode(data)
                if output.topics:
                    key = message_key(output.key, names, data)
                    places = [(output.topics[i], output.partition if output.partition is not None else -1) for i in choose(data)]
                elif output.partition is not None and not output.destination_partitions:
                    key = message_key(output.key, names, data)
                    places = [(output.topic, output.partition)]
                else:
                    if not count:
                        count = self.partitions_of(output.topic) if self.partitions_of else 1
                    key = message_key(output.key, names, data) if output.key else strategy.key(data)
                    chosen = strategy.partitions(data, count)
                    if output.destination_partitions:
                        chosen = [output.destination_partitions[i] for i in chosen]
                    places = [(output.topic, p) for p in chosen]
                for topic, partition in places:
                    append(Message(topic, partition, -1, stamp, key, value, origin))
            self.rows_out += len(self._out) - before

        return publish

    def _turn(self) -> RoundRobin:
        """A round robin whose place the instance's snapshots keep (a replay then places events as before)."""
        self._turns.append(RoundRobin())
        return self._turns[-1]

    def _http_publisher(self, output):
        codec = mapper_for(output.mapping, output.attributes)
        choose = destination_chooser(output.strategy, [a.name for a in output.attributes], output.partition_key, len(output.destinations), self._turn())
        topic = f"{HTTP_PREFIX}{output.stream}"

        def publish(rows, stamps, origins) -> None:
            append, before = self._out.append, len(self._out)
            for data, stamp, origin in zip(rows, stamps, origins):
                value = codec.encode(data)
                for index in choose(data):
                    append(Message(topic, index, -1, stamp, None, value, origin))
            self.rows_out += len(self._out) - before

        return publish

    def _emit(self, origin_of_send, named: int = 0) -> int:
        """Publish what the output streams collected, each event named after the send it stems
        from (`origin_of_send(send)` -> (key, sequence)) and its place among that send's outputs
        (counting from `named + 1`); returns how many outputs the last send named."""
        counts: dict = {}
        prefixes: dict = {}
        last = named
        for collector, publish in self._emitters:
            if not collector.rows:
                continue
            rows, stamps, sends = collector.take()
            origins: list[bytes] = []
            append, current, prefix = origins.append, _NONE, ""
            for send in sends:  # a send's outputs mostly come together: look it up once per run of them
                if send != current:
                    if current is not _NONE:
                        counts[current] = last
                    current, last = send, counts.get(send, named)
                    prefix = prefixes.get(send)
                    if prefix is None:
                        origin_key, sequence = origin_of_send(send)
                        prefix = prefixes[send] = origin_prefix(origin_key, sequence)
                last += 1
                append(f"{prefix}{last}".encode())
            if current is not _NONE:
                counts[current] = last
            publish(rows, stamps, origins)
        return last

    @property
    def on_wall_clock(self) -> bool:
        """True when the host drives the engine's time (the app has no @app:playback)."""
        return not self.engine.playback

    def next_wakeup(self) -> int | None:
        """When the host should call advance() even if no message arrives (ms), or None."""
        return self.engine.next_wakeup() if self.on_wall_clock else None

    def advance(self, now: int) -> list[Message]:
        """Move the wall clock to `now`; return what the timers due by then publish."""
        self._advance(now)
        out, self._out = self._out, []
        return out

    def _advance(self, now: int) -> None:
        # Timers fire one due time after another, each seeing its own time as now, as the
        # wall clock's thread would have fired them had it run then.
        while (due := self.engine.next_wakeup()) is not None and due < now:
            self._advance_to(max(due, self.engine.clock.now()))
        self._advance_to(max(now, self.engine.clock.now()))

    def _advance_to(self, now: int) -> None:
        if self._tick[0] != now:
            self._tick = [now, 0]
        self.engine.advance_time(now)
        origin = (self.clock_origin, (now,))
        self._tick[1] = self._emit(lambda _send: origin, self._tick[1])

    def process(self, messages: Iterable[Message], now: int | None = None) -> list[Message]:
        """Run messages through the engine; return the messages to publish (outputs and dead letters).

        On the wall clock, time moves to `now` (default: the system time) before the messages go in,
        and timers their events armed in the past fire after them."""
        wall = int(time.time() * 1000) if now is None else now
        if self.on_wall_clock:
            self._advance(wall)
        run = _Run()
        seen, inputs, sequenced_topics, keys, keys_get = self.seen, self._inputs, self._sequenced, _ORIGIN_KEYS, _ORIGIN_KEYS.get
        named, stateless = self._named, self.plan.stateless
        rows_in = 0
        ordered, bulk = _in_order(messages), self._bulk
        if bulk is not None:
            ordered = list(ordered)
            decoded = iter(bulk.decode_many([m[5] for m in ordered]))
        for message in ordered:
            topic, partition, offset, stamp, _k, value, raw, index = message
            rows = next(decoded) if bulk is not None else None  # taken first: every message has its item, duplicates too
            if topic in sequenced_topics:
                try:
                    message = sequenced(message)
                except EventDecodeError as exc:
                    self._reject(message, str(exc))
                    continue
                value, raw = message.value, message.origin
            # The message's origin (key, sequence): its sp-origin header, or its own place.
            if raw:
                head, _, tail = raw.rpartition(b"|")
                key = keys_get(head)
                if key is None:
                    if len(keys) >= 4096:
                        keys.clear()
                    key = keys[head] = head.decode("utf-8")
                parts = tail.split(b".")
                sequence = (int(parts[0]), int(parts[1])) if len(parts) == 2 else tuple(map(int, parts))
            else:
                key, sequence = f"{topic}:{partition}", (offset,)
            place = (topic, partition, key)
            last = seen.get(place)
            if last is not None and sequence <= last:
                self.duplicates += 1
                continue
            seen[place] = sequence
            # self._origin(...), its names made once per place
            name = named.get(place)
            if name is None:
                if len(named) >= 65536:
                    named.clear()
                name = named[place] = self._origin_key(topic, partition, key)
            origin = (name, sequence) if stateless else (name, (offset,) if index < 0 else (offset, index))
            stream, codec = inputs[topic]
            if type(value) is tuple:  # an event of a batch by column: its row as it was read
                rows = [value]
            elif rows is None:
                try:
                    rows = codec.decode(value)
                except EventDecodeError as exc:
                    self._reject(message, str(exc))
                    continue
            elif type(rows) is not list:
                self._reject(message, str(rows))
                continue
            if not rows:
                continue
            size = len(rows)
            rows_in += size
            if stream != run.stream or stamp is None or stamp < 0:
                self._send(run)  # a message without its own time takes the clock's, as it stands after those before it
                run = _Run(stream)
                if stamp is None or stamp < 0:
                    stamp = self.engine.clock.now()
            if size == 1:
                run.rows.append(rows[0])
                run.stamps.append(stamp)
            else:
                run.rows += rows
                run.stamps += [stamp] * size
            run.sizes.append(size)
            run.origins.append(origin)
        self.rows_in += rows_in
        self._send(run)
        if self.on_wall_clock:
            self._advance(wall)
        out, self._out = self._out, []
        return out

    def replay(self, messages: Iterable[Message], until: int) -> None:
        """Run messages whose outputs are out already, dropping what they and the timers emit. On the
        wall clock each goes in at its own time (its publication, about when its first owner read it),
        never past `until`, so timers fire between the same messages as they did then."""
        if not self.on_wall_clock:
            self.process(messages, until)
            return
        for message in list(_in_order(messages)):
            stamp = message.timestamp
            self.process([message], until if stamp is None or stamp < 0 else min(stamp, until))

    def process_decoded(self, sends: Iterable[tuple[str, list, str, int]], now: int) -> list[Message]:
        """process() for messages their host has decoded already (an HTTP receiver decodes each request
        once, to answer 400 itself): each send is (input topic, rows, origin key, n), one message at
        partition 0 and offset n whose origin is (key, (n,)), stamped `now`; consecutive sends of one
        stream go to the engine in one call, each as if sent alone."""
        if self.on_wall_clock:
            self._advance(now)
        run = _Run()
        seen, inputs = self.seen, self._inputs
        for topic, rows, key, n in sends:
            place, sequence = (topic, 0, key), (n,)
            if place in seen and sequence <= seen[place]:
                self.duplicates += 1
                continue
            seen[place] = sequence
            if not rows:
                continue
            stream = inputs[topic][0]
            if stream != run.stream:
                self._send(run)
                run = _Run(stream)
            self.rows_in += len(rows)
            run.add(rows, now, self._origin(topic, 0, n, key, sequence))
        self._send(run)
        if self.on_wall_clock:
            self._advance(now)
        out, self._out = self._out, []
        return out

    def _origin(self, topic: str, partition: int, offset: int, key: str, sequence: tuple[int, ...], index: int = -1) -> tuple[str, tuple[int, ...]]:
        """What the outputs of one input message are named after: a stateless instance passes the
        message's origin on, behind the partition it came through; a stateful one names them after
        the message's place (its offset, and its index when it came in a batch).

        The partition is part of a stateless key because instances of one group may take events of
        one origin (a topic split round robin or by key) and publish to the same partitions: one
        partition is read by one instance at a time, so each key still has one publisher whose
        sequences only grow, as the next group's duplicate check needs."""
        name = self._origin_key(topic, partition, key)
        if self.plan.stateless:
            return (name, sequence)
        return (name, (offset,) if index < 0 else (offset, index))

    def _origin_key(self, topic: str, partition: int, key: str) -> str:
        """The origin key of the outputs of a message from (topic, partition) whose own origin key is `key` (see _origin)."""
        place = f"{topic}:{partition}"
        if self.plan.stateless:  # a message without an origin header is its own place: named once
            return f"{self.group}>{place}" if key == place else f"{self.group}>{place}>{key}"
        return f"{self.group}@{place}"

    def _send(self, run: _Run) -> None:
        """One engine call for a run of messages of one stream: each message is one send, as if sent
        alone, and the outputs of each are named after it."""
        stream = run.stream
        if not run.sizes or stream is None:
            return
        if self._copy is not None and stream == self._copy[0]:
            rows, _batch = self.engine.conform(stream, self.engine.schema(stream), run.rows)
            collector = self._copy[1]
            collector.rows += rows or ()
            collector.stamps += run.stamps
            for send, size in enumerate(run.sizes):
                collector.sends += [send] * size
        else:
            self.engine.send_each(stream, run.rows, run.stamps, run.sizes)
        self._emit(run.origins.__getitem__)

    def _reject(self, message: Message, reason: str) -> None:
        self.rejected += 1
        log.warning("%s: rejected %s[%d]@%d: %s", self.plan.name, message.topic, message.partition, message.offset, reason)
        if self.dead_letter_topic:
            body = json.dumps(dead_letter(self.plan.name, message, reason)).encode("utf-8")
            self._out.append(Message(self.dead_letter_topic, 0, -1, message.timestamp, None, body))

    def snapshot(self) -> bytes:
        """The engine's state, the origins seen, the clock's naming and the round robins' places, as bytes."""
        seen = [[topic, partition, key, list(sequence)] for (topic, partition, key), sequence in self.seen.items()]
        head = json.dumps({"seen": seen, "tick": self._tick, "turns": [t.position for t in self._turns]}).encode("utf-8")
        return len(head).to_bytes(4, "big") + head + self.engine.snapshot()

    def restore(self, snapshot: bytes):
        """Put the engine, the origins seen, the clock's naming and the round robins' places back as snapshot() saved them; the
        snapshot may be an earlier version's of the partial app (returns the engine's CarryOver)."""
        head, engine = _split_snapshot(snapshot)
        self.seen = {(t, p, k): tuple(q) for t, p, k, q in head["seen"]}
        self._tick = list(head["tick"])
        turns = head.get("turns", [])
        if len(turns) == len(self._turns):  # else another version's outputs: they start from the first place
            for turn, position in zip(self._turns, turns):
                turn.position = position
        return self.engine.restore(engine, partial=True)

    def forget(self) -> None:
        """Forget the origins seen and the round robins' places, keeping the engine: for a stateless
        instance whose host may run a batch again (a retried Spark task), which must then publish
        the same messages to the same partitions instead of dropping them as seen."""
        self.seen.clear()
        for turn in self._turns:
            turn.position = 0

    def close(self) -> None:
        """Stop the engine."""
        self.engine.shutdown()


def _split_snapshot(snapshot: bytes) -> tuple[dict, bytes]:
    """An instance snapshot's head (origins seen, the clock's naming) and its engine's snapshot."""
    size = int.from_bytes(snapshot[:4], "big")
    head = json.loads(snapshot[4 : 4 + size])
    if isinstance(head, list):  # saved before the head had the clock's naming
        head = {"seen": head, "tick": [0, 0]}
    return head, snapshot[4 + size :]


def merge_snapshots(snapshots: Sequence[bytes], owns) -> bytes:
    """One instance snapshot from those of a keyed group's old instances (a rescale): the keys `owns`
    accepts of each engine, every origin seen (the highest per place) and the latest clock naming."""
    from sp_dagster.engine.runtime import merge_keyed

    seen: dict[tuple, list] = {}
    tick, engines = [0, 0], []
    for snapshot in snapshots:
        head, engine = _split_snapshot(snapshot)
        for t, p, k, q in head["seen"]:
            previous = seen.get((t, p, k))
            seen[(t, p, k)] = q if previous is None or q > previous else previous
        tick = max(tick, list(head["tick"]))
        engines.append(engine)
    body = json.dumps({"seen": [[*place, q] for place, q in seen.items()], "tick": tick}).encode("utf-8")
    return len(body).to_bytes(4, "big") + body + merge_keyed(engines, owns)


class _Collector:
    """What one output stream received since the last take(): rows, times, and the send of each."""

    blind = True  # it cannot tell chunks apart: the engine may deliver whole runs at once

    __slots__ = ("engine", "rows", "stamps", "sends")

    def __init__(self, engine: AppRuntime):
        self.engine = engine
        self.rows: list = []
        self.stamps: list[int] = []
        self.sends: list = []

    def receive(self, chunk) -> None:
        """Keep one chunk (an ArrowChunk names its rows' sends; otherwise the engine's current send)."""
        if isinstance(chunk, ArrowChunk):
            count = chunk.batch.num_rows
            columns = [column.to_pylist() for column in chunk.batch.columns]
            self.rows.extend(zip(*columns) if columns else [()] * count)
            self.stamps.extend(chunk.timestamps.to_pylist())
            self.sends.extend(chunk.sends.tolist() if chunk.sends is not None else [self.engine.send_index] * count)
            return
        send = self.engine.send_index
        for event in chunk:
            self.rows.append(event.data)
            self.stamps.append(event.timestamp)
            self.sends.append(send)

    def take(self) -> tuple[list, list[int], list]:
        """What was kept, emptied."""
        taken = self.rows, self.stamps, self.sends
        self.rows, self.stamps, self.sends = [], [], []
        return taken


class _Run:
    """Consecutive messages of one input stream: their rows, timestamps, rows per message and origins."""

    __slots__ = ("stream", "rows", "stamps", "sizes", "origins")

    def __init__(self, stream: str | None = None):
        self.stream = stream
        self.rows: list = []
        self.stamps: list[int] = []
        self.sizes: list[int] = []
        self.origins: list[tuple[str, tuple[int, ...]]] = []

    def add(self, rows: list, stamp: int, origin: tuple[str, tuple[int, ...]]) -> None:
        """Append one message's events."""
        self.rows.extend(rows)
        self.stamps.extend([stamp] * len(rows))
        self.sizes.append(len(rows))
        self.origins.append(origin)


def _in_order(messages: Iterable[Message]) -> Iterable[Message]:
    """Each partition's messages in offset order; partitions merged by event time."""
    by_partition: dict[tuple[str, int], list[Message]] = {}
    for message in messages:
        by_partition.setdefault(message[:2], []).append(message)  # (topic, partition)
    runs: Sequence[list[Message]] = [sorted(run, key=_OFFSET) for run in by_partition.values()]
    if len(runs) == 1:
        return runs[0]
    return heapq.merge(*runs, key=lambda m: m.timestamp if m.timestamp is not None else -1)
