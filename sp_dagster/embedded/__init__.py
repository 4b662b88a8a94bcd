"""Embedded services for development and tests: the local Kafka-protocol broker."""

from sp_dagster.embedded.broker import EmbeddedBroker, free_port, port_open, tansu_binary

__all__ = ["EmbeddedBroker", "free_port", "port_open", "tansu_binary"]
