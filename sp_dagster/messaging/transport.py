"""The messaging-layer interface that Kafka (and NATS) implement."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sp_dagster.messaging.codecs import Codec
from sp_dagster.messaging.profiles import PROFILES, BrokerProfile
from sp_dagster.messaging.strategies import Strategy

EARLIEST = -2  # start offsets: read from the first retained event
LATEST = -1  # start offsets: read only events published from now on


@dataclass(frozen=True)
class TopicInfo:
    """A topic's name and partition count."""

    name: str
    partitions: int


class Event(NamedTuple):
    """One decoded event read from a partition (a named tuple: readers make one per message)."""

    partition: int
    offset: int
    timestamp: int | None
    row: tuple
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()

    def header(self, name: str) -> bytes | None:
        """The value of header `name` (the last one when repeated), or None."""
        return next((value for key, value in reversed(self.headers) if key == name), None)


@dataclass(frozen=True)
class Reject:
    """A message that could not be decoded, kept whole with the reason (for a dead-letter topic)."""

    partition: int
    offset: int
    timestamp: int | None
    data: bytes
    reason: str


@dataclass
class Batch:
    """What one poll returned: events, rejects, and the next offset of every assigned partition."""

    events: list[Event] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    positions: dict[int, int] = field(default_factory=dict)


class Publisher(ABC):
    """Sends rows of one stream to one topic with one strategy."""

    @abstractmethod
    def send(self, rows: Iterable[Sequence[Any]], timestamps: Iterable[int | None] | None = None) -> int:
        """Queue rows (with their event timestamps, ms); returns how many messages were queued."""

    @abstractmethod
    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued message is acknowledged; raise MessagingError on any failure."""

    def close(self) -> None:
        """Flush and release the client."""
        self.flush()


class RawPublisher(ABC):
    """Publishes ready-encoded messages to any topic and partition of one messaging layer."""

    @abstractmethod
    def produce(self, topic: str, value: bytes, key: bytes | None, partition: int, timestamp: int | None, headers: list | None = None) -> None:
        """Queue one message (timestamp in ms; None: the broker's time; headers: [(name, bytes)])."""

    @abstractmethod
    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued message is acknowledged; raise MessagingError on any failure."""

    def produce_all(self, records: Iterable[tuple], header: str = "") -> None:
        """Queue (topic, value, key, partition, timestamp, value of `header` or None) records."""
        for topic, value, key, partition, timestamp, found in records:
            self.produce(topic, value, key, partition, timestamp, [(header, found)] if found is not None else None)

    def serve(self) -> None:  # noqa: B027  (optional hook: a no-op unless the client has reports to serve)
        """Let the client handle what it received (delivery reports) without waiting; a no-op by default."""

    def prepare(self, topics: Iterable[str]) -> None:  # noqa: B027  (optional hook: a client that connects on its first send)
        """Connect and learn the topics' layout now, so the first turn that publishes to them does not wait for it."""

    def leave(self) -> None:
        """Release the client without waiting for what is queued, or ending an open transaction: this owner's claim
        has ended (its successor publishes that again, or resolves the transaction), and the broker may be out of
        reach; close() by default."""
        self.close()

    def close(self) -> None:
        """Flush and release the client."""
        self.flush()


class GroupOffsets(ABC):
    """Input offsets (with metadata) kept for a group outside any transaction, read back by the next owner."""

    @abstractmethod
    def commit(self, offsets: Mapping[tuple[str, int], int], metadata: str = "") -> None:
        """Record the offsets (next to read, per (topic, partition)) without waiting for the broker's answer."""

    @abstractmethod
    def committed(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, str]]:
        """(offset, metadata) committed for the group, per (topic, partition) that has one."""

    @abstractmethod
    def close(self, wait: bool = True) -> None:
        """Release the client once the commits sent have been answered (`wait` False: at once, leaving them)."""


class TransactionalPublisher(RawPublisher):
    """A RawPublisher whose messages are published atomically with the input offsets they follow from."""

    time_left: Callable[[], float] | None = None  # set by its owner: seconds its claim still runs, no call waits (much) past it

    @abstractmethod
    def commit(self, offsets: Mapping[tuple[str, int], int], metadata: str = "", *, retry_while: Callable[[], bool] | None = None) -> None:
        """Publish what is queued and record the input offsets (next to read, per (topic, partition)), atomically."""

    @abstractmethod
    def committed(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, str]]:
        """(offset, metadata) committed by earlier transactions, per (topic, partition) that has one."""

    @abstractmethod
    def marks(self, topics: Iterable[str]) -> dict[tuple[str, int], int]:
        """Offsets, per partition of `topics`, at or before which nothing this publisher writes from now on lands."""

    @abstractmethod
    def headers_since(self, marks: Mapping[tuple[str, int], int], header: str) -> dict[tuple[str, int], list[bytes]]:
        """The `header` value of every message a committed-only reader sees from `marks` to the end, per (topic, partition)."""


class RowPublisher(Publisher):
    """Publishes one stream's rows to one topic over a RawPublisher, choosing partitions with a strategy."""

    def __init__(self, raw: RawPublisher, info: TopicInfo, codec: Codec, strategy: Strategy):
        self.topic = info.name
        self.partition_count = info.partitions
        self.codec = codec
        self.strategy = strategy
        self.raw = raw

    def send(self, rows: Iterable[Sequence[Any]], timestamps: Iterable[int | None] | None = None) -> int:
        rows = list(rows)
        stamps = list(timestamps) if timestamps is not None else [None] * len(rows)
        if len(stamps) != len(rows):
            raise ValueError(f"{len(rows)} rows but {len(stamps)} timestamps")
        sent = 0
        for row, stamp in zip(rows, stamps):
            value, key = self.codec.encode(row), self.strategy.key(row)
            for partition in self.strategy.partitions(row, self.partition_count):
                self.raw.produce(self.topic, value, key, partition, stamp)
                sent += 1
        self.raw.serve()
        return sent

    def flush(self, timeout: float = 30.0) -> None:
        self.raw.flush(timeout)

    def close(self) -> None:
        self.raw.close()


class Reader(ABC):
    """Reads given partitions of one topic from given offsets, without consumer-group rebalancing."""

    waited_s = 0.0  # seconds polls have spent waiting for a first message, in all: what is not work

    @abstractmethod
    def poll(self, max_events: int = 10_000, timeout: float = 1.0) -> Batch:
        """Read what is available (up to max_events), waiting at most timeout seconds for the first."""

    def poll_raw(self, max_events: int = 10_000, timeout: float = 1.0, header: str = "") -> list[tuple]:
        """Like poll(), for a reader made with RawCodec: each message as (partition, offset,
        timestamp, key, value, the value of `header` or None)."""
        return [(e.partition, e.offset, e.timestamp, e.key, e.row[0], e.header(header)) for e in self.poll(max_events, timeout).events]

    @abstractmethod
    def positions(self) -> dict[int, int]:
        """The next offset to read, per assigned partition."""

    def backlog(self) -> dict[int, int] | None:
        """Events published but not yet read, per assigned partition, as last seen (None: unknown)."""
        return None

    def fetched_to(self) -> dict[int, int]:
        """Per assigned partition, how far the reader has gone (past transaction markers where the layer has them)."""
        return self.positions()

    def read_again(self) -> bool:
        """Read once more what the reader stepped over that may hold messages (messaging/skips.py);
        True while such a read is under way."""
        return False

    @abstractmethod
    def close(self) -> None:
        """Release the client."""


class Transport(ABC):
    """A messaging layer: topic administration, publishing and reading."""

    kind = "transport"
    address = "?"  # the servers, as error messages name them

    @property
    def profile(self) -> BrokerProfile:
        """What the broker needs beyond Kafka's guarantees (profiles.py): nothing, unless a layer says otherwise."""
        return PROFILES["kafka"]

    def topic_name(self, app: str, stream: str, key: str | None = None) -> str:
        """The topic that carries a stream of an app (field-grouped topics carry the key too)."""
        return ".".join(part for part in (app, stream, key) if part)

    @abstractmethod
    def list_topics(self) -> dict[str, TopicInfo]:
        """Every topic on the broker."""

    def topic_info(self, topic: str) -> TopicInfo | None:
        """One topic, or None when it does not exist."""
        return self.list_topics().get(topic)

    def require_topic(self, topic: str) -> TopicInfo:
        """The topic's info, or a TopicError saying it is missing."""
        info = self.topic_info(topic)
        if info is None:
            from sp_dagster.errors import TopicError

            raise TopicError(f"topic '{topic}' does not exist on {self.address}; deploy the app that uses it (deploying creates its topics) or create it first")
        return info

    def resolve(self, topic: str, assignments: Mapping[int, int]) -> dict[int, int]:
        """Check a reader's partitions against the topic and replace LATEST with each partition's end offset."""
        info = self.require_topic(topic)
        unknown = sorted(p for p in assignments if not 0 <= p < info.partitions)
        if unknown:
            from sp_dagster.errors import TopicError

            raise TopicError(
                f"topic '{topic}' has partitions 0..{info.partitions - 1}; cannot read {'partition' if len(unknown) == 1 else 'partitions'} {unknown}"
            )
        resolved = dict(assignments)
        if any(offset == LATEST for offset in resolved.values()):
            ends = self.end_offsets(topic)
            resolved = {p: ends[p] if o == LATEST else o for p, o in resolved.items()}
        return resolved

    @abstractmethod
    def ensure_topic(self, topic: str, partitions: int) -> TopicInfo:
        """Create the topic with at least N partitions, growing it if it has fewer; never shrink."""

    @abstractmethod
    def delete_topic(self, topic: str) -> None:
        """Delete a topic and its events."""

    @abstractmethod
    def end_offsets(self, topic: str) -> dict[int, int]:
        """The offset the next published event will get, per partition."""

    def publisher(self, topic: str, codec: Codec, strategy: Strategy) -> Publisher:
        """A publisher of one stream's rows to a topic."""
        return RowPublisher(self.raw_publisher(), self.require_topic(topic), codec, strategy)

    @abstractmethod
    def raw_publisher(self) -> RawPublisher:
        """A publisher of ready-encoded messages (the workers' output path)."""

    def transactional_publisher(self, transactional_id: str, group_id: str, abandoned_after_s: float | None = None) -> TransactionalPublisher | None:
        """A publisher whose commit(offsets, metadata) publishes its messages and records the input
        offsets atomically, and whose committed(partitions) reads them back; None when the layer has
        no transactions (workers then deliver at-least-once, replays dropped by origin). The layer
        aborts a transaction left open `abandoned_after_s` (where it can; else its own default)."""
        return None

    def group_offsets(self, group_id: str) -> GroupOffsets | None:
        """Offsets kept for `group_id` outside transactions (the same store a transactional publisher of
        that group commits to); None when the layer keeps none."""
        return None

    @abstractmethod
    def reader(self, topic: str, assignments: Mapping[int, int], codec: Codec) -> Reader:
        """A reader of the given partitions, each from its offset (or EARLIEST / LATEST)."""

    def close(self) -> None:  # noqa: B027  (optional hook: a transport that holds no client has nothing to release)
        """Release clients held by the transport."""
