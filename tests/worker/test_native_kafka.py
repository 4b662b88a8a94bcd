"""Spark's native Kafka connector: choosing it, and its rows in the raw form the queries read.

The connector's jar (spark-sql-kafka-0-10) is not on this machine and cannot be fetched, so a
query cannot read through it here: these tests check the choice against the real session's
classpath and the column mapping on a frame shaped like the connector's output, built by hand.
"""

from __future__ import annotations

import json

import pytest

from sp_dagster.errors import ConfigError
from sp_dagster.siddhi import parse
from sp_dagster.topology import plan
from sp_dagster.worker.instance.plan import plan_instance
from sp_dagster.worker.instance.runtime import InstanceRuntime
from sp_dagster.worker.spark.microbatch import QuerySettings, _messages, build_query
from sp_dagster.worker.spark.native_kafka import kafka_source_kind, native_available, native_options, raw_from_native
from sp_dagster.worker.spark.types import RAW_DDL

pytestmark = pytest.mark.slow

NATIVE_DDL = (
    "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
    "timestampType int, headers array<struct<key: string, value: binary>>"
)
NATIVE_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
APP = """@App:name('Native')
define stream TradeStream (symbol string, price double, volume long);
@sink(type = 'kafka', topic = 'Native.Out', @map(type = 'json'))
define stream OutStream (symbol string, total long);
@dist(execGroup = 'sum')
from TradeStream#window.length(10) select symbol, sum(volume) as total insert into OutStream;
"""


def test_without_the_connector_jar_auto_reads_with_python_and_native_says_what_to_add(spark):
    assert native_available(spark) is False  # this machine's Spark has no spark-sql-kafka-0-10
    assert kafka_source_kind(spark, "auto") == "python"
    assert kafka_source_kind(spark, "python") == "python"
    with pytest.raises(ConfigError) as raised:
        kafka_source_kind(spark, "native")
    message = str(raised.value)
    assert "\n" not in message
    assert f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark.version}" in message and "spark.jars.packages" in message
    with pytest.raises(ConfigError, match="expected one of auto, native, python"):
        kafka_source_kind(spark, "jvm")
    # a query asked to read natively fails the same way before it starts
    (instance,) = plan(parse(APP)).partial_apps
    settings = QuerySettings("localhost:9092", "/nonexistent", kafka_source="native")
    with pytest.raises(ConfigError, match="spark-sql-kafka-0-10"):
        build_query(spark, plan_instance(instance.name, instance.siddhi), settings)


def test_native_options_assign_exactly_the_instances_partitions():
    options = native_options("b:9092", "T.S", (0, 2), kafka_properties=(("security.protocol", "SSL"),), max_events=500)
    assert json.loads(options["assign"]) == {"T.S": [0, 2]}
    assert options["kafka.bootstrap.servers"] == "b:9092" and options["kafka.security.protocol"] == "SSL"
    assert (options["startingOffsets"], options["includeHeaders"], options["maxOffsetsPerTrigger"]) == ("earliest", "true", "500")
    # A rescaled instance's first start: its partitions where their old owner left them, any not named from the start (-2).
    moved = native_options("b:9092", "T.S", (0, 2), starting={2: 41})
    assert json.loads(moved["startingOffsets"]) == {"T.S": {"0": -2, "2": 41}}


def test_native_rows_map_to_the_raw_form_the_engine_reads(spark):
    from pyspark.sql import functions as F

    (instance,) = plan(parse(APP)).partial_apps
    instance_plan = plan_instance(instance.name, instance.siddhi)
    topic = instance_plan.inputs[0].topic
    value = lambda symbol, volume: json.dumps({"event": {"symbol": symbol, "price": 1.0, "volume": volume}}).encode()  # noqa: E731
    rows = [  # what the connector yields: headers null, empty, without and with sp-origin
        (b"IBM", value("IBM", 5), topic, 0, 7, 1_700_000_000_123, 0, None),
        (None, value("IBM", 6), topic, 0, 8, 1_700_000_000_124, 0, []),
        (None, value("WSO2", 7), topic, 0, 9, 1_700_000_000_125, 0, [("trace", b"x")]),
        (None, value("IBM", 8), topic, 0, 10, 1_700_000_000_126, 0, [("trace", b"y"), ("sp-origin", b"Up>T:0|4.1")]),
    ]
    frame = spark.createDataFrame(rows, NATIVE_DDL.replace("timestamp timestamp", "ts bigint"))
    frame = frame.withColumn("timestamp", F.timestamp_millis("ts")).select(*NATIVE_COLUMNS)
    assert frame.schema.simpleString() == spark.createDataFrame([], NATIVE_DDL).schema.simpleString()

    raw = raw_from_native(frame)
    assert raw.schema.simpleString() == spark.createDataFrame([], RAW_DDL).schema.simpleString()
    got = [tuple(r) for r in raw.orderBy("_offset").collect()]
    assert [(t, p, o, s, k, origin) for t, p, o, s, k, _v, origin in got] == [
        (topic, 0, 7, 1_700_000_000_123, b"IBM", None),
        (topic, 0, 8, 1_700_000_000_124, None, None),
        (topic, 0, 9, 1_700_000_000_125, None, None),
        (topic, 0, 10, 1_700_000_000_126, None, b"Up>T:0|4.1"),
    ]
    # the engine takes them as it takes sp-kafka's rows: in order, timestamps and origins kept
    out = InstanceRuntime(instance_plan).process(_messages([list(column) for column in zip(*got)]))
    totals = [json.loads(m.value)["event"]["total"] for m in out]
    assert totals == [5, 11, 18, 26] and [m.timestamp for m in out] == [1_700_000_000_123 + n for n in range(4)]
    assert out[-1].origin == b"Native-sum@" + topic.encode() + b":0|10.1"
