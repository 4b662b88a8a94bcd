"""The messaging layer: topics between execution groups, publishing strategies, event codecs."""

from sp_dagster.messaging.codecs import Attribute, BinaryCodec, Codec, JsonCodec, codec_for
from sp_dagster.messaging.strategies import Broadcast, Partitioned, RoundRobin, Strategy, partition_for_key, strategy_for
from sp_dagster.messaging.transport import EARLIEST, LATEST, Batch, Event, Publisher, RawPublisher, Reader, Reject, RowPublisher, TopicInfo, Transport


def transport_for(settings, timeout: float = 10.0) -> Transport:
    """The transport a config's MessagingSettings selects: Kafka (bootstrapURLs) or NATS JetStream (natsServerUrl)."""
    if settings.kind == "kafka":
        from sp_dagster.messaging.kafka import KafkaTransport

        return KafkaTransport.from_settings(settings, timeout)
    if settings.kind == "nats":
        from sp_dagster.messaging.nats import NatsTransport

        return NatsTransport.from_settings(settings, timeout)
    from sp_dagster.errors import ConfigError

    raise ConfigError(f"unknown messaging layer '{settings.kind}'; set deployment.config.bootstrapURLs (Kafka) or natsServerUrl (NATS)")


__all__ = [
    "EARLIEST",
    "LATEST",
    "Attribute",
    "Batch",
    "BinaryCodec",
    "Broadcast",
    "Codec",
    "Event",
    "JsonCodec",
    "Partitioned",
    "Publisher",
    "RawPublisher",
    "Reader",
    "Reject",
    "RoundRobin",
    "RowPublisher",
    "Strategy",
    "TopicInfo",
    "Transport",
    "codec_for",
    "partition_for_key",
    "strategy_for",
    "transport_for",
]
