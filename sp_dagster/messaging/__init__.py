"""The messaging layer: topics between execution groups, publishing strategies, event codecs."""

from sp_dagster.messaging.codecs import Attribute, BinaryCodec, Codec, JsonCodec, codec_for
from sp_dagster.messaging.strategies import Broadcast, Partitioned, RoundRobin, Strategy, partition_for_key, strategy_for
from sp_dagster.messaging.transport import EARLIEST, LATEST, Batch, Event, Publisher, RawPublisher, Reader, Reject, TopicInfo, Transport


def transport_for(settings, timeout: float = 10.0) -> Transport:
    """The transport a config's MessagingSettings selects (Kafka; NATS is not available yet)."""
    if settings.kind == "kafka":
        from sp_dagster.messaging.kafka import KafkaTransport

        return KafkaTransport.from_settings(settings, timeout)
    from sp_dagster.errors import ConfigError

    raise ConfigError(
        f"messaging layer '{settings.kind}' is not available yet; set deployment.config.bootstrapURLs to use Kafka"
    )


__all__ = [
    "EARLIEST", "LATEST", "Attribute", "Batch", "BinaryCodec", "Broadcast", "Codec", "Event", "JsonCodec",
    "Partitioned", "Publisher", "RawPublisher", "Reader", "Reject", "RoundRobin", "Strategy", "TopicInfo", "Transport",
    "codec_for", "partition_for_key", "strategy_for", "transport_for",
]
