"""Partial-app instances as Spark streaming queries reproduce the in-process engine, event for event."""

from __future__ import annotations

import collections
import random
import time
import uuid
from pathlib import Path

import pytest

from sp_dagster.engine import AppRuntime
from sp_dagster.engine.clock import PlaybackClock
from sp_dagster.messaging import EARLIEST, Partitioned, codec_for
from sp_dagster.siddhi import parse
from sp_dagster.topology import plan
from sp_dagster.worker.instance_plan import plan_instance
from sp_dagster.worker.instance_runtime import InstanceRuntime, Message
from sp_dagster.worker.spark_query import QuerySettings, start_query

APP = (Path(__file__).parent / "apps" / "trades.siddhi").read_text()
SYMBOLS = ["IBM", "WSO2", "ORCL", "MSFT", "GOOG", "AMZN", "SAP"]


def trades(count: int, seed: int = 7):
    rng = random.Random(seed)
    rows = [(rng.choice(SYMBOLS), round(rng.uniform(10, 200), 2), rng.randint(1, 40)) for _ in range(count)]
    return rows, [1_700_000_000_000 + i for i in range(count)]


def reference(rows, stamps, stream="AverageStream"):
    """What the whole app gives in process, per symbol in order."""
    out = collections.defaultdict(list)
    with AppRuntime(APP, clock=PlaybackClock()) as runtime:
        runtime.add_callback(stream, lambda events: [out[e.data[0]].append(e.data) for e in events if not e.is_expired])
        runtime.send("TradeStream", rows, stamps)
    return out


def test_instance_runtime_rejects_bad_messages_to_the_dead_letter_topic():
    topology = plan(parse(APP))
    instance = topology.group("filter").instances[0]
    runtime = InstanceRuntime(plan_instance(instance.name, instance.siddhi), "Trades.deadletter")
    source = runtime.plan.inputs[0]
    good = codec_for(source.codec, source.attributes).encode(("IBM", 12.5, 20))
    out = runtime.process([Message(source.topic, 0, 0, 5, None, b"\x00junk"), Message(source.topic, 0, 1, 6, None, good)])
    dead = [m for m in out if m.topic == "Trades.deadletter"]
    published = [m for m in out if m.topic != "Trades.deadletter"]
    assert len(dead) == 1 and b'"offset": 0' in dead[0].value and b"reason" in dead[0].value
    assert len(published) == 1 and published[0].timestamp == 6
    assert (runtime.rows_in, runtime.rows_out, runtime.rejected) == (1, 1, 1)


@pytest.mark.slow
@pytest.mark.broker
def test_instances_on_spark_match_the_in_process_engine(spark, kafka, tmp_path):
    # An app name of its own: other tests deploy "Trades" on the same session broker.
    name = f"TradesOnSpark{uuid.uuid4().hex[:8]}"
    topology = plan(parse(APP.replace("Trades", name)))
    for topic in topology.topics:
        kafka.ensure_topic(topic.name, topic.partitions)
    kafka.ensure_topic(f"{name}.deadletter", 1)
    first = topology.group("filter").instances[0]
    (entry,) = plan_instance(first.name, first.siddhi).inputs
    rows, stamps = trades(3000)
    publisher = kafka.publisher(entry.topic, codec_for(entry.codec, entry.attributes), Partitioned(0, "symbol"))
    publisher.send(rows, stamps)
    publisher.flush()

    queries = []
    try:
        for instance in topology.partial_apps:
            settings = QuerySettings(kafka.bootstrap_servers, str(tmp_path / instance.name), f"{name}.deadletter", trigger_interval="200 milliseconds")
            queries.append(start_query(spark, plan_instance(instance.name, instance.siddhi), settings))
        for query in queries:  # in data-flow order: each drains what the previous ones published
            query.processAllAvailable()
    finally:
        for query in queries:
            query.stop()

    expected = reference(rows, stamps)
    codec = codec_for("json", [("symbol", "string"), ("avgPrice", "double"), ("total", "long")])
    reader = kafka.reader(f"{name}.Averages", {0: EARLIEST}, codec)
    got = collections.defaultdict(list)
    total, deadline = sum(len(v) for v in expected.values()), time.monotonic() + 30
    while sum(len(v) for v in got.values()) < total and time.monotonic() < deadline:
        for event in reader.poll(timeout=0.5).events:
            got[event.row[0]].append(event.row)
    reader.close()
    assert total > 1000
    assert dict(got) == dict(expected)


def _instance(group: str):
    topology = plan(parse(APP))
    instance = topology.group(group).instances[0]
    return plan_instance(instance.name, instance.siddhi)


def test_replayed_events_are_dropped_by_origin_and_outputs_keep_theirs():
    average = _instance("average")
    source = average.inputs[0]
    codec = codec_for(source.codec, source.attributes)
    upstream = [Message(source.topic, 0, n, 1000 + n, b"IBM", codec.encode(("IBM", 10.0 * (n + 1), 20)), f"Trades-filter>Trades.TradeStream:0|{n}.1".encode()) for n in range(4)]
    first = InstanceRuntime(average)
    out = first.process(upstream[:3])
    assert [m.origin for m in out] == [f"Trades-average@{source.topic}:0|{n}.1".encode() for n in range(3)]
    # Upstream replays events 1 and 2 (same origins, new offsets) before event 3: only 3 counts.
    replay = [Message(source.topic, 0, 10 + n, m.timestamp, m.key, m.value, m.origin) for n, m in enumerate(upstream[1:3])]
    out = first.process(replay + [Message(source.topic, 0, 12, 1003, b"IBM", upstream[3].value, upstream[3].origin)])
    assert first.duplicates == 2 and len(out) == 1
    assert codec_for("json", [("symbol", "string"), ("avgPrice", "double"), ("total", "long")]).decode(out[0].value) == [("IBM", 25.0, 80)]
    # A takeover restores the state, origins seen included, and drops the same duplicates again.
    second = InstanceRuntime(average)
    second.restore(first.snapshot())
    assert second.process(replay) == [] and second.duplicates == 2


def test_stateless_instances_pass_origins_on():
    filter_ = _instance("filter")
    source = filter_.inputs[0]
    codec = codec_for(source.codec, source.attributes)
    runtime = InstanceRuntime(filter_)
    out = runtime.process([Message(source.topic, 1, 7, 5, None, codec.encode(("IBM", 1.0, 50)))])
    assert [m.origin for m in out] == [f"Trades-filter>{source.topic}:1|7.1".encode()]
    again = runtime.process([Message(source.topic, 1, 7, 5, None, codec.encode(("IBM", 1.0, 50)))])
    assert again == [] and runtime.duplicates == 1
