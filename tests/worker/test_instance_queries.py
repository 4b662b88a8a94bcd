"""Partial-app instances as Spark streaming queries reproduce the in-process engine, event for event."""

from __future__ import annotations

import collections
import random
import time
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
    topology = plan(parse(APP))
    for topic in topology.topics:
        kafka.ensure_topic(topic.name, topic.partitions)
    kafka.ensure_topic("Trades.deadletter", 1)
    first = topology.group("filter").instances[0]
    (entry,) = plan_instance(first.name, first.siddhi).inputs
    rows, stamps = trades(3000)
    publisher = kafka.publisher(entry.topic, codec_for(entry.codec, entry.attributes), Partitioned(0, "symbol"))
    publisher.send(rows, stamps)
    publisher.flush()

    queries = []
    try:
        for instance in topology.partial_apps:
            settings = QuerySettings(kafka.bootstrap_servers, str(tmp_path / instance.name), "Trades.deadletter", trigger_interval="200 milliseconds")
            queries.append(start_query(spark, plan_instance(instance.name, instance.siddhi), settings))
        for query in queries:  # in data-flow order: each drains what the previous ones published
            query.processAllAvailable()
    finally:
        for query in queries:
            query.stop()

    expected = reference(rows, stamps)
    codec = codec_for("json", [("symbol", "string"), ("avgPrice", "double"), ("total", "long")])
    reader = kafka.reader("Trades.Averages", {0: EARLIEST}, codec)
    got = collections.defaultdict(list)
    total, deadline = sum(len(v) for v in expected.values()), time.monotonic() + 30
    while sum(len(v) for v in got.values()) < total and time.monotonic() < deadline:
        for event in reader.poll(timeout=0.5).events:
            got[event.row[0]].append(event.row)
    reader.close()
    assert total > 1000
    assert dict(got) == dict(expected)
