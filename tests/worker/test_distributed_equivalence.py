"""Random distributed apps give what the same app gives in one process.

Each app is planned into partial apps; every instance runs through its InstanceRuntime (what a
worker runs) once all instances publishing to its inputs have run, over in-memory topics that keep
each partition's order. Every user sink's events (values and timestamps, as multisets: partitions
interleave) must equal those of the whole app in one engine. This exercises the planner's splits
(round robin, by key, passthroughs, HTTP receivers fed a request per event, several sinks on a
stream), the codecs between groups and the origins by which an instance drops what it has seen:
the worst interleaving on a shared partition is every event of one instance before any of the next.
"""

from __future__ import annotations

import collections
import json
import random
import zlib

import pytest

from sp_dagster.engine import AppRuntime
from sp_dagster.engine.clock import PlaybackClock
from sp_dagster.messaging.maps import mapper_for
from sp_dagster.siddhi import parse
from sp_dagster.topology import plan
from sp_dagster.worker.instance.connections import share_of
from sp_dagster.worker.instance.plan import plan_instance
from sp_dagster.worker.instance.runtime import InstanceRuntime, Message, _in_order
from sp_dagster.worker.instance.sinks import HTTP_PREFIX

ATTRIBUTES = ("sym", "price", "vol")
SCHEMA = "(sym string, price double, vol long)"
SYMBOLS = ("IBM", "WSO2", "ORCL", "MSFT", "GOOG")
# kind -> (output stream, its attributes, the query given a Random, may run parallel)
SHAPES = {
    "filter": (
        "F1",
        "(sym string, p2 double, vol long)",
        lambda r: f"from In1[price > {r.randint(20, 150)}.0] select sym, price * 2 as p2, vol insert into F1;",
        True,
    ),
    "chain": ("C1", "(sym string, p2 double)", lambda r: f"from F1[vol > {r.randint(1, 30)}] select sym, p2 insert into C1;", True),
    "keyed": (
        "A1",
        "(sym string, total long, ap double)",
        lambda r: (
            f"partition with (sym of In1) begin from In1#window.length({r.randint(1, 6)}) select sym, sum(vol) as total, avg(price) as ap insert into A1; end;"
        ),
        True,
    ),
    "keyed_filter": (
        "K1",
        "(sym string, n long)",
        lambda r: f"partition with (sym of In1) begin from In1[vol > {r.randint(1, 30)}] select sym, count() as n insert into K1; end;",
        True,
    ),
    "keyed_time": (
        "T1",
        "(sym string, hi double)",
        lambda r: (
            f"partition with (sym of In1) begin from In1#window.time({r.choice([30, 50, 120])} milliseconds) select sym, max(price) as hi insert into T1; end;"
        ),
        True,
    ),
    "batch": (
        "B1",
        "(n long, mx double)",
        lambda r: f"from In1#window.lengthBatch({r.randint(2, 9)}) select count() as n, max(price) as mx insert into B1;",
        False,
    ),
    "rate": (
        "R1",
        "(sym string, total long)",
        lambda r: f"from In1 select sym, sum(vol) as total group by sym output last every {r.randint(2, 7)} events insert into R1;",
        False,
    ),
    "join": (
        "J1",
        SCHEMA,
        lambda r: "from In1#window.length(5) as a join In2#window.length(5) as b on a.sym == b.sym select a.sym, a.price, b.vol insert into J1;",
        False,
    ),
    "pattern": (
        "P1",
        "(sym string, p1 double, p2 double)",
        lambda r: "from every e1=In1[price > 150.0] -> e2=In1[price < 50.0 and sym == e1.sym] select e1.sym, e1.price as p1, e2.price as p2 insert into P1;",
        False,
    ),
    "keyed_chain": ("AC1", "(sym string, total long)", lambda r: f"from A1[total > {r.randint(10, 80)}] select sym, total insert into AC1;", True),
    "by_number": (
        "V1",
        "(vol long, mx double)",
        lambda r: "partition with (vol of In1) begin from In1 select vol, max(price) as mx insert into V1; end;",
        True,
    ),
    "grouped": (
        "G1",
        "(sym string, s long)",
        lambda r: f"from In1#window.lengthBatch({r.randint(2, 6)}) select sym, sum(vol) as s group by sym insert into G1;",
        False,
    ),
    "all_events": ("AE1", "(sym string, price double)", lambda r: "from In1#window.length(2) select sym, price insert all events into AE1;", False),
    "copy": ("Y1", SCHEMA, lambda r: "from In1 select * insert into Y1;", True),
    "expired": (
        "X1",
        "(sym string, price double)",
        lambda r: f"from In1#window.length({r.randint(1, 4)}) select sym, price insert expired events into X1;",
        False,
    ),
}


def _source(stream: str, topic: str, echo: bool, http: bool = False) -> str:
    if http:  # a receiver partial app takes the events as HTTP requests
        text = f"@source(type = 'http', receiver.url = 'http://127.0.0.1:8280/{topic}', @map(type = 'json'))\n"
    else:
        text = f"@source(type = 'kafka', topic.list = '{topic}', group.id = 'g{topic}', @map(type = 'json'))\n"
    if echo:  # the stream is published as it arrives, besides feeding queries
        text += f"@sink(type = 'kafka', topic = 'echo_{topic}', @map(type = 'json'))\n"
    return text + f"define stream {stream} {SCHEMA};\n"


def random_app(rng: random.Random) -> str:
    """An app of 1-4 query shapes, each in an execution group of its own, parallel where the shape allows."""
    kinds = rng.sample(sorted(SHAPES), rng.randint(1, 4))
    for needs, first in (("chain", "filter"), ("keyed_chain", "keyed")):
        if needs in kinds and first not in kinds:
            kinds.append(first)
    text = "@App:name('Equal')\n@app:playback\n" + _source("In1", "in1", rng.random() < 0.3, rng.random() < 0.3)
    if "join" in kinds:
        text += _source("In2", "in2", rng.random() < 0.3)
    if rng.random() < 0.25:  # a bridge: no query reads it, its sink still gets its events
        text += _source("In3", "in3", True, rng.random() < 0.3)
    for number, kind in enumerate(kinds, 1):
        stream, schema, query, parallel = SHAPES[kind]
        if rng.random() < 0.2:  # over two topics, one per @destination; the test reads them as one
            strategy = "partitioned', partitionKey = 'sym" if schema.startswith("(sym ") and rng.random() < 0.5 else "roundRobin"
            destinations = f"@destination(topic = 'out_{stream}.a'), @destination(topic = 'out_{stream}.b')"
            text += f"@sink(type = 'kafka', @map(type = 'json'), @distribution(strategy = '{strategy}', {destinations}))\n"
        else:
            text += f"@sink(type = 'kafka', topic = 'out_{stream}', @map(type = 'json'))\n"
        text += f"define stream {stream} {schema};\n"
        text += f"@dist(execGroup = 'g{number}', parallel = '{rng.randint(1, 3) if parallel else 1}')\n{query(rng)}\n"
    return text


def random_events(rng: random.Random, streams: list[str], count: int = 300) -> list[tuple[str, tuple, int]]:
    """(stream, row, timestamp) in time order, 10 ms apart."""
    rows = []
    for n in range(count):
        row = (rng.choice(SYMBOLS), round(rng.uniform(10, 200), 2), rng.randint(1, 40))
        rows.append((rng.choice(streams), row, 1_000 + 10 * n))
    return rows


def _sink_topics(text: str) -> dict[str, list[str]]:
    topics: dict[str, list[str]] = {}
    for definition in parse(text).definitions:
        for sink in definition.annotations_named("sink"):
            topics.setdefault(definition.name, []).append(sink.get("topic") or f"out_{definition.name}")
    return topics


def in_process(text: str, events) -> dict[str, collections.Counter]:
    """What each sink topic receives when the whole app runs in one engine, an event per send."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    with AppRuntime(text, clock=PlaybackClock()) as runtime:
        for stream, topics in _sink_topics(text).items():
            for topic in topics:
                runtime.add_callback(stream, lambda batch, topic=topic: out[topic].update((e.data, e.timestamp) for e in batch if not e.is_expired))
        for stream, row, stamp in events:
            runtime.send(stream, [row], [stamp])
    return out


def _run(instance, partitions: dict, read: list[Message], restart: random.Random | None) -> list[Message]:
    """What an instance publishes for `read` (in the order it takes them); with `restart`, its
    runtime dies part-way and a new one restores its last snapshot and reads on from there, so
    what the first published after that snapshot is published again."""
    new = lambda: InstanceRuntime(instance, "Equal.deadletter", partitions_of=lambda topic: partitions.get(topic, 1))  # noqa: E731
    runtime, ordered = new(), list(_in_order(read))
    if restart is None or len(ordered) < 2:
        return runtime.process(ordered)
    saved_at = restart.randrange(len(ordered))
    died_at = restart.randrange(saved_at, len(ordered))
    published = runtime.process(ordered[:saved_at])
    snapshot = runtime.snapshot()
    published += runtime.process(ordered[saved_at:died_at])
    successor = new()
    successor.restore(snapshot)
    return published + successor.process(ordered[saved_at:])


def distributed(text: str, events, restart: random.Random | None = None, user_partitions: int = 1) -> dict[str, collections.Counter]:
    """What each sink topic receives when the partial apps run one after the other over in-memory
    topics (with `restart`, one instance reading topics is restarted part-way, see _run); a sink's
    events are counted once per origin, as a reader of them can."""
    topology = plan(parse(text))
    partitions = {t.name: t.partitions for t in topology.topics}
    partitions.update({stream.lower(): user_partitions for stream, _row, _stamp in events})  # the user's topics as they are
    instances = [plan_instance(i.name, i.siddhi) for i in topology.partial_apps]
    topics: dict[str, dict[int, list[Message]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for stream, row, stamp in events:
        partition = zlib.crc32(row[0].encode()) % user_partitions
        held = topics[stream.lower()][partition]
        held.append(Message(stream.lower(), partition, len(held), stamp, None, json.dumps({"event": dict(zip(ATTRIBUTES, row))}).encode()))
    publishers = collections.defaultdict(set)
    for instance in instances:
        for output in instance.outputs:
            for topic in (output.topic, *output.topics):
                publishers[topic].add(instance.name)
    restarted = restart.choice([i.name for i in instances if i.inputs]) if restart is not None else None
    done: set[str] = set()
    while len(done) < len(instances):
        ready = [i for i in instances if i.name not in done and all(p in done for source in i.inputs for p in publishers[source.topic] - {i.name})]
        assert ready, "the partial apps feed each other in a cycle"
        for instance in ready:
            read = [
                m
                for source in instance.inputs
                for p in source.partitions or share_of(partitions[source.topic], *(source.share or (1, 1)))
                for m in topics[source.topic][p]
            ]
            if instance.http_inputs:
                runtime = InstanceRuntime(instance, "Equal.deadletter", partitions_of=lambda topic: partitions.get(topic, 1))
                published = []
            else:
                published = _run(instance, partitions, read, restart if instance.name == restarted else None)
            for source in instance.http_inputs:  # a request per event, at the event's time
                mapper = mapper_for(source.mapping, source.attributes)
                requests = sorted((m for held in topics[source.url.rsplit("/", 1)[1]].values() for m in held), key=lambda m: m.timestamp)
                for n, request in enumerate(requests):
                    published += runtime.process_decoded(
                        [(f"{HTTP_PREFIX}{source.stream}", mapper.decode(request.value), f"{instance.name}@http", n)], request.timestamp
                    )
            for message in published:
                held = topics[message.topic][max(message.partition, 0)]
                held.append(message._replace(partition=max(message.partition, 0), offset=len(held)))
            assert not any(m.topic == "Equal.deadletter" for m in published), f"{instance.name} rejected messages"
            done.add(instance.name)
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for topic, held in topics.items():
        if topic.startswith(("out_", "echo_")):
            once = {m.origin: m for messages in held.values() for m in messages}
            assert len(once) == sum(map(len, held.values())) or restarted, f"{topic}: an origin published twice without a restart"
            for message in once.values():
                event = json.loads(message.value)["event"]
                out[topic.split(".")[0]][(tuple(event[a] for a in event), message.timestamp)] += 1
    return out


def _check(rng: random.Random, restart: bool) -> None:
    text = random_app(rng)
    events = random_events(rng, [s for s in ("In1", "In2", "In3") if f"define stream {s} " in text])
    expected = in_process(text, events)
    got = distributed(text, events, restart=rng if restart else None, user_partitions=rng.randint(1, 4))
    assert sum(map(len, expected.values())) > 0
    for topic in set(expected) | set(got):
        missing, extra = expected[topic] - got[topic], got[topic] - expected[topic]
        assert not missing and not extra, f"{topic}: {sum(missing.values())} missing, {sum(extra.values())} extra\n{text}"


@pytest.mark.parametrize("seed", range(120))
def test_a_random_distributed_app_gives_what_it_gives_in_one_process(seed):
    _check(random.Random(seed), restart=False)


@pytest.mark.parametrize("seed", range(60))
def test_a_random_distributed_app_gives_the_same_when_an_instance_restarts_from_its_snapshot(seed):
    _check(random.Random(1000 + seed), restart=True)
