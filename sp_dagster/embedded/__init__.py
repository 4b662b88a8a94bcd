"""Embedded services for development and tests: the local Kafka-protocol broker and the local NATS server."""

from sp_dagster.embedded.broker import EmbeddedBroker, EmbeddedServer, free_port, port_open, tansu_binary
from sp_dagster.embedded.nats_server import EmbeddedNatsServer, nats_server_binary

__all__ = ["EmbeddedBroker", "EmbeddedNatsServer", "EmbeddedServer", "free_port", "nats_server_binary", "port_open", "tansu_binary"]
