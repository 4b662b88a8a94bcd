"""The options of the `sp-kafka` data source (kafka_source reads, kafka_sink writes): case-insensitive names, the transport they name."""

from __future__ import annotations


def normalized(options) -> dict:
    """Spark passes options case-insensitively: keep one lower-case plain dict."""
    return {str(k).lower(): v for k, v in dict(options).items()}


def _kafka_properties(options: dict) -> dict:
    return {k[len("kafka.") :]: v for k, v in options.items() if k.startswith("kafka.")}


def transport_from_options(options: dict):
    """A KafkaTransport from the data source's options."""
    from sp_dagster.messaging.kafka import KafkaTransport

    return KafkaTransport(options["bootstrap.servers"], _kafka_properties(options), timeout=float(options.get("timeout", 30)))
