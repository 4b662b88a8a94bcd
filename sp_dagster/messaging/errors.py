"""The messaging layer's errors: the transport's (defined on the ground floor, sp_dagster.errors) and the strategies' and codecs'."""

from sp_dagster.errors import BrokerUnavailable, EventDecodeError, JetStreamUnavailable, MessagingError, ProducerFenced, TopicCannotGrow, TopicError


class StrategyError(MessagingError, ValueError):
    """A publishing strategy cannot be built as asked: an unknown name, or a missing or unknown partition key."""


class MessageTooLarge(MessagingError):
    """A message over the messaging layer's size limit: sending it again can never succeed."""

    def __init__(self, size: int, limit: int, topic: str, limit_of: str, fix: str):
        self.size, self.limit = size, limit
        super().__init__(f"an event of {size} bytes for '{topic}' is over the {limit}-byte limit of {limit_of}; send smaller events, or {fix}")


class CodecError(MessagingError, ValueError):
    """An unknown codec or attribute type (a ValueError too, as callers of the codecs catch)."""


__all__ = [
    "BrokerUnavailable",
    "CodecError",
    "EventDecodeError",
    "JetStreamUnavailable",
    "MessageTooLarge",
    "MessagingError",
    "ProducerFenced",
    "StrategyError",
    "TopicCannotGrow",
    "TopicError",
]
