"""The `sp-nats` Spark source and sink against a real nats-server and a real SparkSession."""

from __future__ import annotations

import pytest

from sp_dagster.messaging import BinaryCodec, JsonCodec, RoundRobin
from sp_dagster.messaging.strategies import key_string, partition_for_key
from sp_dagster.worker.spark.types import attributes_option
from tests.fixtures.spark import ATTRS, collect_stream
from tests.messaging.helpers import read_all

pytestmark = [pytest.mark.slow, pytest.mark.nats]


def options(nats, topic, **extra):
    return {"bootstrap.servers": nats.address, "cluster.id": nats.cluster_id, "topic": topic, **extra}


def test_raw_source_reads_its_partitions_by_sequence_and_resumes_from_its_checkpoint(spark, nats, topic_name, tmp_path):
    nats.ensure_topic(topic_name, 2)
    raw = nats.raw_publisher()
    for i in range(6):  # sequences 1..6, alternating partitions 0 and 1
        raw.produce(topic_name, f"v{i}".encode(), f"k{i}".encode(), i % 2, 1000 + i, headers=[("sp-origin", f"o{i}".encode())])
    raw.flush()
    checkpoint = str(tmp_path / "ck")

    def run_once():
        frame = spark.readStream.format("sp-nats").options(**options(nats, topic_name, partitions="1", format="raw")).load()
        rows, _ = collect_stream(frame, checkpoint)
        return [(r._topic, r._partition, r._offset, r._timestamp, r._key, r._value, r._origin) for r in sorted(rows, key=lambda r: r._offset)]

    assert run_once() == [(topic_name, 1, seq, 999 + seq, f"k{seq - 1}".encode(), f"v{seq - 1}".encode(), f"o{seq - 1}".encode()) for seq in (2, 4, 6)]
    raw.produce(topic_name, b"late", None, 1, 2000)
    raw.produce(topic_name, b"other partition", None, 0, 2001)
    raw.close()
    # The restarted query reads only what came after its last committed batch.
    assert [(offset, value) for _, _, offset, _, _, value, _ in run_once()] == [(7, b"late")]


def test_sink_publishes_with_the_partitioned_strategy_and_acknowledgements(spark, nats, topic_name, tmp_path):
    source, sink = topic_name, topic_name + ".out"
    nats.ensure_topic(source, 2)
    nats.ensure_topic(sink, 3)
    rows = [(symbol, float(i), i) for i in range(6) for symbol in ("IBM", "WSO2", "ORCL")]
    publisher = nats.publisher(source, JsonCodec(ATTRS), RoundRobin())
    publisher.send(rows, [2000 + i for i in range(len(rows))])
    publisher.flush()
    attributes = attributes_option(ATTRS)
    frame = spark.readStream.format("sp-nats").options(**options(nats, source, partitions="0,1", attributes=attributes)).load().where("_error is null")
    sink_options = options(nats, sink, attributes=attributes, codec="binary", strategy="partitioned", partitionKey="symbol")
    query = frame.writeStream.format("sp-nats").options(**sink_options).option("checkpointLocation", str(tmp_path / "ck")).start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    events, _, _ = read_all(nats, sink, range(3), BinaryCodec(ATTRS), len(rows))
    assert sorted(e.row for e in events) == sorted(rows)
    for event in events:
        assert event.partition == partition_for_key(key_string(event.row[0]).encode(), 3) and event.key == event.row[0].encode()
    assert sorted(e.timestamp for e in events) == [2000 + i for i in range(len(rows))]
