"""The `sp-kafka` Spark source and sink against the real broker and a real SparkSession."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from sp_dagster.messaging import EARLIEST, BinaryCodec, JsonCodec, Partitioned, RoundRobin
from sp_dagster.messaging.strategies import key_string, partition_for_key
from sp_dagster.worker.spark.types import attributes_option
from tests.fixtures.spark import ATTRS, collect_stream

pytestmark = [pytest.mark.slow, pytest.mark.broker]


def source_options(broker, topic, partitions, **extra):
    return {"bootstrap.servers": broker.bootstrap_servers, "topic": topic, "partitions": partitions, "attributes": attributes_option(ATTRS), **extra}


def read_topic(kafka, topic, partitions, codec, expected):
    reader = kafka.reader(topic, {p: EARLIEST for p in partitions}, codec)
    events, deadline = [], time.monotonic() + 15
    while len(events) < expected and time.monotonic() < deadline:
        events += reader.poll(timeout=0.5).events
    events += reader.poll(timeout=0.5).events
    reader.close()
    return events


def test_source_reads_only_its_partitions_with_timestamps_and_rejects(spark, kafka, broker, topic_name, tmp_path):
    kafka.ensure_topic(topic_name, 2)
    publisher = kafka.publisher(topic_name, JsonCodec(ATTRS), RoundRobin())
    publisher.send([(f"S{i}", float(i), i) for i in range(10)], [1000 + i for i in range(10)])
    publisher.flush()
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    producer.produce(topic_name, b"junk", partition=1, timestamp=5000)
    producer.flush(10)

    frame = spark.readStream.format("sp-kafka").options(**source_options(broker, topic_name, "1")).load()
    rows, _ = collect_stream(frame, str(tmp_path / "ck"))
    rows.sort(key=lambda r: r._offset)
    good = [r for r in rows if r._error is None]
    assert [(r.symbol, r.price, r.volume, r._partition, r._offset, r._timestamp) for r in good] == [
        (f"S{i}", float(i), i, 1, n, 1000 + i) for n, i in enumerate(range(1, 10, 2))
    ]
    (bad,) = [r for r in rows if r._error is not None]
    assert bad._raw == b"junk" and "not valid JSON" in bad._error and bad._offset == 5 and bad._timestamp == 5000


def test_a_restarted_query_resumes_from_its_checkpoint(spark, kafka, broker, topic_name, tmp_path):
    kafka.ensure_topic(topic_name, 1)
    codec = JsonCodec(ATTRS)
    checkpoint = str(tmp_path / "ck")

    def run_once():
        frame = spark.readStream.format("sp-kafka").options(**source_options(broker, topic_name, "0")).load()
        rows, _ = collect_stream(frame, checkpoint)
        return [r.volume for r in sorted(rows, key=lambda r: r._offset)]

    publisher = kafka.publisher(topic_name, codec, RoundRobin())
    publisher.send([("A", 1.0, v) for v in range(3)])
    publisher.flush()
    assert run_once() == [0, 1, 2]
    publisher.send([("A", 1.0, v) for v in range(3, 5)])
    publisher.flush()
    assert run_once() == [3, 4]


def test_max_events_per_trigger_splits_micro_batches(spark, kafka, broker, topic_name, tmp_path):
    kafka.ensure_topic(topic_name, 1)
    publisher = kafka.publisher(topic_name, JsonCodec(ATTRS), RoundRobin())
    publisher.send([("A", 1.0, v) for v in range(10)])
    publisher.flush()
    frame = spark.readStream.format("sp-kafka").options(**source_options(broker, topic_name, "0", maxEventsPerTrigger="4")).load()
    rows, progress = collect_stream(frame, str(tmp_path / "ck"))
    sizes = [p["numInputRows"] for p in progress if p["numInputRows"]]
    assert sorted(r.volume for r in rows) == list(range(10)) and max(sizes) <= 4 and sum(sizes) == 10


def test_sink_publishes_with_the_partitioned_strategy(spark, kafka, broker, topic_name, tmp_path):
    source, sink = topic_name, topic_name + ".out"
    kafka.ensure_topic(source, 2)
    kafka.ensure_topic(sink, 3)
    publisher = kafka.publisher(source, JsonCodec(ATTRS), RoundRobin())
    rows = [(symbol, float(i), i) for i in range(6) for symbol in ("IBM", "WSO2", "ORCL")]
    publisher.send(rows, [2000 + i for i in range(len(rows))])
    publisher.flush()
    frame = spark.readStream.format("sp-kafka").options(**source_options(broker, source, "0,1")).load().where("_error is null")
    sink_options = {
        "bootstrap.servers": broker.bootstrap_servers,
        "topic": sink,
        "attributes": attributes_option(ATTRS),
        "codec": "binary",
        "strategy": "partitioned",
        "partitionKey": "symbol",
    }
    query = frame.writeStream.format("sp-kafka").options(**sink_options).option("checkpointLocation", str(tmp_path / "ck")).start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    events = read_topic(kafka, sink, range(3), BinaryCodec(ATTRS), len(rows))
    assert sorted(e.row for e in events) == sorted(rows)
    for event in events:
        assert event.partition == partition_for_key(key_string(event.row[0]).encode(), 3)
    assert sorted(e.timestamp for e in events) == [2000 + i for i in range(len(rows))]


def test_raw_form_unions_topics_and_republishes_as_is(spark, kafka, broker, topic_name, tmp_path):
    first, second, out = topic_name + ".a", topic_name + ".b", topic_name + ".out"
    for topic, partitions in ((first, 1), (second, 2), (out, 2)):
        kafka.ensure_topic(topic, partitions)
    codec = JsonCodec(ATTRS)
    keyed = kafka.publisher(first, codec, Partitioned(0, "symbol"))
    keyed.send([("IBM", 1.0, 1)], [7000])
    keyed.flush()
    plain = kafka.publisher(second, codec, RoundRobin())
    plain.send([("X", 2.0, 2), ("Y", 3.0, 3)], [8000, 9000])
    plain.flush()

    def raw(topic, partitions):
        options = {"bootstrap.servers": broker.bootstrap_servers, "topic": topic, "partitions": partitions, "format": "raw"}
        return spark.readStream.format("sp-kafka").options(**options).load()

    frame = raw(first, "0").unionByName(raw(second, "0,1"))
    rows, _ = collect_stream(frame, str(tmp_path / "ck-read"))
    seen = sorted(((r._topic, r._key, codec.decode(r._value)[0], r._timestamp) for r in rows), key=lambda t: t[3])
    assert seen == [(first, b"IBM", ("IBM", 1.0, 1), 7000), (second, None, ("X", 2.0, 2), 8000), (second, None, ("Y", 3.0, 3), 9000)]

    # Re-publish everything, as is, to partition 1 of the output topic.
    republish = frame.selectExpr(f"'{out}' as _topic", "1 as _partition", "_key", "_value", "_timestamp")
    options = {"bootstrap.servers": broker.bootstrap_servers, "format": "raw"}
    query = republish.writeStream.format("sp-kafka").options(**options).option("checkpointLocation", str(tmp_path / "ck-write")).start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    events = read_topic(kafka, out, [0, 1], codec, 3)
    assert sorted(((e.partition, e.key, e.row, e.timestamp) for e in events), key=lambda t: t[3]) == [
        (1, b"IBM", ("IBM", 1.0, 1), 7000),
        (1, None, ("X", 2.0, 2), 8000),
        (1, None, ("Y", 3.0, 3), 9000),
    ]
