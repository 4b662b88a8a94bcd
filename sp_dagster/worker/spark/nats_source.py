"""A Spark streaming source (and sink) over NATS JetStream that reads exactly the given partitions of
one topic: the `sp-kafka` source and sink (kafka_source, kafka_sink) on the NATS transport,
registered as the Python data source `sp-nats`, with siddhi-io-nats's option names
`bootstrap.servers` (NATS URLs) and `cluster.id` (docs/messaging.md, From Spark).
"""

from __future__ import annotations

from sp_dagster.worker.spark.kafka_sink import KafkaStreamWriter
from sp_dagster.worker.spark.kafka_source import KafkaPartitionsSource, KafkaStreamReader, normalized


def transport_from_options(options: dict):
    """A NatsTransport from the data source's options (bootstrap.servers, cluster.id, timeout)."""
    from sp_dagster.messaging.nats import NatsTransport

    return NatsTransport(options["bootstrap.servers"], options["cluster.id"], timeout=float(options.get("timeout", 30)))


class NatsStreamReader(KafkaStreamReader):
    """Plans sequence ranges on the driver; reads them on executors through ordered JetStream consumers.

    Offsets are stream sequence numbers per partition (`{"0": 12}` = read partition 0 from sequence 12 on).
    maxEventsPerTrigger is an upper bound: a topic's partitions share one sequence, so a batch may hold fewer."""

    def open_transport(self):
        return transport_from_options(self.options)


class NatsStreamWriter(KafkaStreamWriter):
    """Publishes each task's Arrow batches to JetStream and waits for every acknowledgement."""

    def open_transport(self):
        return transport_from_options(self.options)


class NatsPartitionsSource(KafkaPartitionsSource):
    """The `sp-nats` streaming source and sink."""

    @classmethod
    def name(cls) -> str:
        return "sp-nats"

    def streamReader(self, schema) -> NatsStreamReader:
        return NatsStreamReader(normalized(self.options))

    def streamWriter(self, schema, overwrite: bool) -> NatsStreamWriter:
        return NatsStreamWriter(normalized(self.options))
