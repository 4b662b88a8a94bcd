"""Start one partial-app instance as a Spark Structured Streaming query.

    sources (sp-kafka, raw form, exactly the instance's partitions, unioned)
      -> the engine: transformWithStateInPandas keyed by the partition key (one engine per
         key; a constant key when the instance cannot be split by key), or mapInArrow when
         the partial app is stateless
      -> sink (sp-kafka, raw form: messages already encoded and routed by strategy)

The engine's state lives in Spark's state store (RocksDB) next to the offsets in the query's
checkpoint, so a restarted query resumes exactly where its last committed batch ended.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa

from sp_dagster.worker.instance_plan import InstancePlan, InstancePlanError
from sp_dagster.worker.instance_runtime import InstanceRuntime, Message

OUTPUT_DDL = "_topic string, _partition int, _key binary, _value binary, _timestamp bigint, _origin binary"
OUTPUT_SCHEMA = pa.schema(
    [
        ("_topic", pa.string()), ("_partition", pa.int32()), ("_key", pa.binary()), ("_value", pa.binary()),
        ("_timestamp", pa.int64()), ("_origin", pa.binary()),
    ]
)
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_CACHED_RUNTIMES = 10_000


@dataclass(frozen=True)
class QuerySettings:
    """Where and how an instance's query runs."""

    bootstrap: str
    checkpoint: str
    dead_letter_topic: str | None = None
    kafka_properties: tuple[tuple[str, str], ...] = ()
    trigger_interval: str = "500 milliseconds"
    max_events_per_trigger: int | None = None


def _messages(columns) -> list[Message]:
    """Messages from the raw columns, in RAW_COLUMNS order (topic, partition, offset, timestamp, key, value, origin)."""
    return [
        Message(t, int(p), int(o), None if s is None or s != s else int(s), k, v, origin)
        for t, p, o, s, k, v, origin in zip(*columns[:7])
    ]


def _output_columns(messages: list[Message]) -> dict:
    return {
        "_topic": [m.topic for m in messages],
        "_partition": [m.partition for m in messages],
        "_key": [m.key for m in messages],
        "_value": [m.value for m in messages],
        "_timestamp": [m.timestamp for m in messages],
        "_origin": [m.origin for m in messages],
    }


# Engines kept between micro-batches in this Python worker process, with the token of the
# state they hold: a batch reuses one only when the state store still holds that token (a
# retried batch rolls the store back, and then the engine is rebuilt from the snapshot).
_RUNTIMES: "OrderedDict[tuple, tuple[str, InstanceRuntime]]" = OrderedDict()


def _runtime_for(cache_key: tuple, token: str | None, snapshot: bytes | None, plan: InstancePlan, dead_letters: str | None) -> InstanceRuntime:
    cached = _RUNTIMES.pop(cache_key, None)
    if cached is not None and token is not None and cached[0] == token:
        return cached[1]
    if cached is not None:
        cached[1].close()
    runtime = InstanceRuntime(plan, dead_letters)
    if snapshot:
        runtime.restore(snapshot)
    return runtime


def _keep(cache_key: tuple, token: str, runtime: InstanceRuntime) -> None:
    _RUNTIMES[cache_key] = (token, runtime)
    while len(_RUNTIMES) > _CACHED_RUNTIMES:
        _key, (_token, old) = _RUNTIMES.popitem(last=False)
        old.close()


def _stateful_processor(plan: InstancePlan, dead_letters: str | None):
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor

    class PartialAppProcessor(StatefulProcessor):
        """Runs the instance's engine for one key; its snapshot is the key's state."""

        def init(self, handle) -> None:
            self.state = handle.getValueState("engine", "token string, snapshot binary")

        def handleInputRows(self, key, rows, timerValues) -> Iterator["pd.DataFrame"]:
            token, snapshot = tuple(self.state.get()) if self.state.exists() else (None, None)
            cache_key = (plan.name, plan.siddhi, tuple(key))
            runtime = _runtime_for(cache_key, token, snapshot, plan, dead_letters)
            # Spark hands the columns over positionally (named _0, _1, ...), in the source's order.
            messages = [m for frame in rows for m in _messages([frame.iloc[:, i].tolist() for i in range(7)])]
            out = runtime.process(messages)
            new_token = uuid.uuid4().hex
            self.state.update((new_token, runtime.snapshot()))
            _keep(cache_key, new_token, runtime)
            # Plain object columns: an Arrow-backed column (pandas may infer one for strings)
            # reaches Spark's converter as a ChunkedArray, which it cannot take.
            yield pd.DataFrame({name: pd.Series(values, dtype=object) for name, values in _output_columns(out).items()})

        def close(self) -> None:
            pass

    return PartialAppProcessor()


def _stateless_function(plan: InstancePlan, dead_letters: str | None):
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        cache_key = (plan.name, plan.siddhi, "stateless")
        cached = _RUNTIMES.get(cache_key)
        runtime = cached[1] if cached else InstanceRuntime(plan, dead_letters)
        _keep(cache_key, "stateless", runtime)
        for batch in batches:
            out = runtime.process(_messages([column.to_pylist() for column in batch.columns]))
            yield pa.RecordBatch.from_pydict(_output_columns(out), schema=OUTPUT_SCHEMA)

    return run


def build_query(spark, plan: InstancePlan, settings: QuerySettings):
    """The (not yet started) DataStreamWriter of one instance."""
    from pyspark.sql import functions as F

    for output in plan.outputs:
        if output.bootstrap and output.bootstrap != settings.bootstrap:
            raise InstancePlanError(f"{plan.name}: publishing {output.stream} to another Kafka cluster ({output.bootstrap}) is not supported yet")
    kafka = {f"kafka.{k}": v for k, v in settings.kafka_properties}
    frames = []
    for source in plan.inputs:
        options = {
            "bootstrap.servers": source.bootstrap or settings.bootstrap,
            "topic": source.topic,
            "partitions": ",".join(map(str, source.partitions)),
            "format": "raw",
            **kafka,
        }
        if settings.max_events_per_trigger:
            options["maxEventsPerTrigger"] = str(settings.max_events_per_trigger)
        frames.append(spark.readStream.format("sp-kafka").options(**options).load())
    frame = frames[0]
    for other in frames[1:]:
        frame = frame.unionByName(other)
    if plan.stateless:
        out = frame.mapInArrow(_stateless_function(plan, settings.dead_letter_topic), OUTPUT_DDL)
    else:
        key = F.coalesce(F.col("_key").cast("string"), F.lit("")) if plan.partition_key else F.lit("")
        out = frame.withColumn("_engine_key", key).groupBy("_engine_key").transformWithStateInPandas(
            statefulProcessor=_stateful_processor(plan, settings.dead_letter_topic),
            outputStructType=OUTPUT_DDL,
            outputMode="Append",
            timeMode="None",
        )
    return (
        out.writeStream.format("sp-kafka")
        .options(**{"bootstrap.servers": settings.bootstrap, "format": "raw", **kafka})
        .option("checkpointLocation", settings.checkpoint)
        .queryName(plan.name)
        .trigger(processingTime=settings.trigger_interval)
    )


def start_query(spark, plan: InstancePlan, settings: QuerySettings):
    """Start the instance's streaming query; returns the StreamingQuery."""
    return build_query(spark, plan, settings).start()
