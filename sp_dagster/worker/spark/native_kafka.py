"""Spark's own Kafka connector as an instance's source, where its jar is on the classpath, chosen by
`spark.kafkaSource` (docs/configuration.md). Its rows are mapped to `sp-kafka`'s raw form, so the
rest of the query is the same; the two sources keep offsets in different shapes in a query's
checkpoint, so a checkpoint made with one cannot be resumed by the other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from sp_dagster.errors import ConfigError
from sp_dagster.worker.instance.runtime import ORIGIN_HEADER
from sp_dagster.worker.spark.types import RAW_COLUMNS

PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
CHOICES = ("auto", "native", "python")
EARLIEST = -2  # the connector's JSON startingOffsets for "from the start"


def native_available(spark) -> bool:
    """True when the session's JVM can load Spark's Kafka connector (False without a JVM, as with Spark Connect)."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return False
    try:
        return bool(jvm.org.apache.spark.util.Utils.classIsLoadable(PROVIDER))
    except Exception:  # a JVM that cannot answer: the Python source always works
        return False


def connector_package(spark) -> str:
    """The Maven coordinate of the connector matching the session's Spark and Scala versions."""
    try:
        scala = ".".join(spark._jvm.scala.util.Properties.versionNumberString().split(".")[:2])
    except Exception:
        scala = "2.13"
    return f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{spark.version}"


def kafka_source_kind(spark, choice: str) -> str:
    """`native` or `python`: which source an instance reads with, for the `spark.kafkaSource` choice: `auto` (the
    default) reads with the native connector when the session's JVM can load it and with the `sp-kafka` Python
    data source otherwise; `native` insists on the connector; `python` never uses it."""
    if choice not in CHOICES:
        raise ConfigError(f"spark.kafkaSource: expected one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "python":
        return "python"
    if native_available(spark):
        return "native"
    if choice == "native":
        raise ConfigError(
            f"spark.kafkaSource is 'native' but Spark's Kafka connector ({PROVIDER}) is not on the classpath: "
            f"add {connector_package(spark)} to spark.jars.packages (spark.conf in the worker config), or use 'auto'"
        )
    return "python"


def native_options(
    bootstrap: str, topic: str, partitions, *, kafka_properties=(), max_events: int | None = None, starting: Mapping[int, int] | None = None
) -> dict:
    """The native connector's options that read exactly `partitions` of `topic` from the start (or from `starting`
    offsets, those of a rescaled instance's partitions; any not named from the start)."""
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "assign": json.dumps({topic: list(partitions)}),
        "startingOffsets": json.dumps({topic: {str(p): starting.get(p, EARLIEST) for p in partitions}}) if starting else "earliest",
        "includeHeaders": "true",
        # like sp-kafka: offsets the broker no longer holds are skipped, not a failed query
        "failOnDataLoss": "false",
        **{f"kafka.{k}": v for k, v in kafka_properties},
    }
    if max_events:
        options["maxOffsetsPerTrigger"] = str(max_events)
    return options


def raw_from_native(frame):
    """The native connector's rows (key, value, topic, partition, offset, timestamp, timestampType,
    headers) as the raw form's columns, in RAW_COLUMNS order."""
    from pyspark.sql import functions as F

    millis = F.unix_millis(F.col("timestamp"))
    origin = F.try_element_at(F.filter(F.col("headers"), lambda h: h["key"] == F.lit(ORIGIN_HEADER)), F.lit(1))["value"]
    columns = {
        "_topic": F.col("topic"),
        "_partition": F.col("partition").cast("int"),
        "_offset": F.col("offset").cast("bigint"),
        "_timestamp": F.when(millis >= 0, millis),  # a message without a timestamp: none, as sp-kafka gives
        "_key": F.col("key"),
        "_value": F.col("value"),
        "_origin": origin,
    }
    return frame.select(*[columns[name].cast(kind).alias(name) for name, kind, _ in RAW_COLUMNS])


def read_native(spark, bootstrap: str, topic: str, partitions, **options):
    """A streaming frame of `partitions` of `topic` through the native connector, in the raw form: exactly the
    instance's partitions (`assign`), with headers, mapped to `sp-kafka`'s raw columns (types.RAW_COLUMNS)."""
    reader = spark.readStream.format("kafka").options(**native_options(bootstrap, topic, partitions, **options))
    return raw_from_native(reader.load())
