"""A Spark streaming source (and, through kafka_sink, sink) that reads exactly the given partitions of
one Kafka topic, registered as the Python data source `sp-kafka`. Offsets are per partition
(`{"0": 12}`) and Spark's checkpoint keeps them, so a restarted query resumes where it stopped. Its
options are described in docs/messaging.md (From Spark).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from sp_dagster.worker.instance.runtime import ORIGIN_HEADER
from sp_dagster.worker.spark.kafka_options import normalized, transport_from_options
from sp_dagster.worker.spark.kafka_sink import KafkaStreamWriter
from sp_dagster.worker.spark.types import RAW_DDL, RAW_SCHEMA, arrow_schema, parse_attributes_option, spark_ddl

BATCH_ROWS = 10_000


def _record_batch(rows: list[tuple], schema: pa.Schema) -> pa.RecordBatch:
    columns = list(zip(*rows))
    return pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, schema)], schema=schema)


class OffsetRange(InputPartition):
    """One Kafka partition's offsets [start, end) in one micro-batch."""

    def __init__(self, partition: int, start: int, end: int):
        self.partition, self.start, self.end = partition, start, end


class KafkaPartitionsSource(DataSource):
    """The `sp-kafka` streaming source."""

    @classmethod
    def name(cls) -> str:
        return "sp-kafka"

    def schema(self) -> str:
        options = normalized(self.options)
        return RAW_DDL if options.get("format") == "raw" else spark_ddl(parse_attributes_option(options["attributes"]))

    def streamReader(self, schema) -> KafkaStreamReader:
        return KafkaStreamReader(normalized(self.options))

    def streamWriter(self, schema, overwrite: bool):
        return KafkaStreamWriter(normalized(self.options))


class KafkaStreamReader(DataSourceStreamReader):
    """Plans offset ranges on the driver; reads them on executors (each task one partition's range, over
    confluent-kafka, yielded as Arrow batches; undecodable messages as rows with `_error` and `_raw` set)."""

    def __init__(self, options: dict):
        self.options = options
        self.topic = options["topic"]
        self.partitions_read = [int(p) for p in str(options["partitions"]).split(",") if p.strip() != ""]
        self.max_events = int(options["maxeventspertrigger"]) if options.get("maxeventspertrigger") else None
        self.pause_flag = options.get("pauseflag")
        self._transport = None
        self._latest: dict | None = None

    def reportLatestOffset(self) -> dict | None:
        """The end of each partition as last seen, for the query's progress (lag)."""
        return self._latest

    def open_transport(self):
        """A new transport from this source's options (the driver keeps one; each read task opens its own)."""
        return transport_from_options(self.options)

    @property
    def transport(self):
        if self._transport is None:
            self._transport = self.open_transport()
        return self._transport

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_transport": None}  # a live client never travels to the executors

    def _ends(self) -> dict[str, int]:
        ends = self.transport.end_offsets(self.topic)
        return {str(p): ends[p] for p in self.partitions_read}

    def initialOffset(self) -> dict:
        starting = self.options.get("startingoffsets", "earliest")
        if starting == "latest":
            return self._ends()
        named = json.loads(starting) if starting.startswith("{") else {}
        return {str(p): int(named.get(str(p), 0)) for p in self.partitions_read}

    def getDefaultReadLimit(self):
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        return ReadMaxRows(self.max_events) if self.max_events else ReadAllAvailable()

    def latestOffset(self, start: dict, limit) -> dict:
        from pyspark.sql.streaming.datasource import ReadMaxRows

        ends = self._ends()
        self._latest = ends
        if self.pause_flag and os.path.exists(self.pause_flag):
            return dict(start)  # paused: no new batch, so the query stops between two
        if not isinstance(limit, ReadMaxRows):
            return ends
        budget, capped = limit.max_rows, {}
        for key in sorted(ends, key=int):
            take = max(0, min(ends[key] - start.get(key, 0), budget))
            capped[key] = start.get(key, 0) + take
            budget -= take
        return capped

    def partitions(self, start: dict, end: dict):
        return [OffsetRange(int(key), start.get(key, 0), end[key]) for key in sorted(end, key=int) if end[key] > start.get(key, 0)]

    def read(self, partition: OffsetRange) -> Iterator[pa.RecordBatch]:
        from sp_dagster.messaging.codecs import RawCodec, codec_for

        topic = self.topic
        if self.options.get("format") == "raw":
            schema, codec = RAW_SCHEMA, RawCodec()

            def raw_values(e):
                return (topic, e.partition, e.offset, e.timestamp, e.key, e.row[0], e.header(ORIGIN_HEADER))

            def never(r):  # a raw read never rejects
                raise AssertionError(r)

            values, reject_values = raw_values, never
        else:
            attributes = parse_attributes_option(self.options["attributes"])
            schema, codec = arrow_schema(attributes), codec_for(self.options.get("codec", "json"), attributes)
            nulls = (None,) * len(attributes)

            def decoded_values(e):
                return (*e.row, e.partition, e.offset, e.timestamp, None, None)

            def rejected_values(r):
                return (*nulls, r.partition, r.offset, r.timestamp, r.reason, r.data)

            values, reject_values = decoded_values, rejected_values

        transport = self.open_transport()
        reader = transport.reader(topic, {partition.partition: partition.start}, codec)
        rows: list[tuple] = []
        try:
            position = partition.start
            while position < partition.end:
                batch = reader.poll(max_events=BATCH_ROWS, timeout=1.0)
                rows.extend(values(e) for e in batch.events if e.offset < partition.end)
                rows.extend(reject_values(r) for r in batch.rejects if r.offset < partition.end)
                position = batch.positions.get(partition.partition, position)
                if len(rows) >= BATCH_ROWS:
                    yield _record_batch(rows, schema)
                    rows = []
            if rows:
                yield _record_batch(rows, schema)
        finally:
            reader.close()
            transport.close()

    def commit(self, end: dict) -> None:
        """Nothing to do: Spark's checkpoint holds the offsets."""

    def stop(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()
