"""The messaging layer's errors: the transport's (defined on the ground floor, sp_dagster.errors) and the strategies' and codecs'."""

from sp_dagster.errors import BrokerUnavailable, EventDecodeError, JetStreamUnavailable, MessagingError, ProducerFenced, TopicError


class StrategyError(MessagingError, ValueError):
    """A publishing strategy cannot be built as asked: an unknown name, or a missing or unknown partition key."""


class CodecError(MessagingError, ValueError):
    """An unknown codec or attribute type (a ValueError too, as callers of the codecs catch)."""


__all__ = ["BrokerUnavailable", "CodecError", "EventDecodeError", "JetStreamUnavailable", "MessagingError", "ProducerFenced", "StrategyError", "TopicError"]
