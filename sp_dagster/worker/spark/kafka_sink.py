"""A Spark streaming sink that publishes rows to a Kafka topic with a publishing strategy: the writer
side of the Python data source `sp-kafka` (options in docs/messaging.md, From Spark). Delivery is
at-least-once: a micro-batch that Spark re-runs is published again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from sp_dagster.worker.spark.kafka_options import transport_from_options


@dataclass
class Published(WriterCommitMessage):
    """How many messages one task published."""

    messages: int


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    """Publishes each task's Arrow batches and waits for the broker's acknowledgement."""

    def __init__(self, options: dict):
        self.options = options

    def open_transport(self):
        """A new transport from the sink's options."""
        return transport_from_options(self.options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        if self.options.get("format") == "raw":
            return self._write_raw(iterator)
        from sp_dagster.messaging.codecs import codec_for
        from sp_dagster.messaging.strategies import strategy_for
        from sp_dagster.worker.spark.types import parse_attributes_option

        attributes = parse_attributes_option(self.options["attributes"])
        names = [a.name for a in attributes]
        codec = codec_for(self.options.get("codec", "json"), attributes)
        strategy = strategy_for(self.options.get("strategy", "roundRobin"), names, self.options.get("partitionkey"))
        transport = self.open_transport()
        try:
            publisher = transport.publisher(self.options["topic"], codec, strategy)
            sent = 0
            for batch in iterator:
                columns = [batch.column(name).to_pylist() for name in names]
                stamps = batch.column("_timestamp").to_pylist() if "_timestamp" in batch.schema.names else None
                sent += publisher.send(list(zip(*columns)) if columns else [], stamps)
            publisher.flush(float(self.options.get("timeout", 30)))
            return Published(sent)
        finally:
            transport.close()

    def _write_raw(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        from sp_dagster.worker.instance.runtime import ORIGIN_HEADER

        transport = self.open_transport()
        try:
            publisher = transport.raw_publisher()
            sent = 0
            for batch in iterator:
                columns = [batch.column(name).to_pylist() for name in ("_topic", "_value", "_key", "_partition", "_timestamp")]
                origins = batch.column("_origin").to_pylist() if "_origin" in batch.schema.names else [None] * batch.num_rows
                for (topic, value, key, partition, stamp), origin in zip(zip(*columns), origins):
                    publisher.produce(topic, value, key, partition, stamp, [(ORIGIN_HEADER, origin)] if origin else None)
                    sent += 1
            publisher.flush(float(self.options.get("timeout", 30)))
            return Published(sent)
        finally:
            transport.close()
