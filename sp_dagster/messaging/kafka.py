"""The Kafka messaging layer, on confluent-kafka (librdkafka), for Apache Kafka and the embedded tansu
broker. Tansu lacks CreatePartitions and reports a partition's end offset as the start of its last
record batch, so `KafkaTransport` recreates a topic that holds no events instead of growing it, and
confirms end offsets by reading to them.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions, NewTopic  # where they are defined (confluent_kafka.admin re-imports them)

from sp_dagster.errors import BrokerUnavailable, EventDecodeError, MessagingError, ProducerFenced, TopicCannotGrow, TopicError
from sp_dagster.messaging import batches
from sp_dagster.messaging.codecs import Codec
from sp_dagster.messaging.errors import MessageTooLarge
from sp_dagster.messaging.profiles import BrokerProfile, profile_for
from sp_dagster.messaging.skips import WRITER_HEADER, SkipGuard, WriterStamps, parse_stamp
from sp_dagster.messaging.transport import EARLIEST, Batch, Event, GroupOffsets, Reader, Reject, TopicInfo, Transport
from sp_dagster.messaging.transport import RawPublisher as RawPublisherBase
from sp_dagster.messaging.transport import TransactionalPublisher as TransactionalPublisherBase
from sp_dagster.wording import counted

log = logging.getLogger(__name__)

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_UNREACHABLE = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT, KafkaError._RESOLVE}
_FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
# End-offset probes: short fetch waits, as an empty fetch at a partition's end answers at once and EOF comes quickly.
_PROBE = {"enable.partition.eof": True, "auto.offset.reset": "latest", "fetch.wait.max.ms": 10}
_OFFSETS_TIMEOUT_S = 10.0  # at most this for sending a transaction's offsets (then a retriable timeout, tried again)
_STUCK_GRACE_S = 5.0  # a call still running this long past its own timeout counts as stuck
_SHORTEST_WAIT_S = 0.5  # what a call may still wait once its owner's lease ran out
_LEASE_LOOK_S = 0.25  # how often a bounded call looks at its owner's lease
_ABANDONED: list[Producer] = []  # producers stuck in a call: kept alive, as destroying one mid-call could block too
_CANNOT_GROW = {KafkaError._UNSUPPORTED_FEATURE, KafkaError.UNSUPPORTED_VERSION, KafkaError.INVALID_REQUEST}
_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's default message.max.bytes


def _error(exc: BaseException) -> KafkaError | None:
    """The KafkaError a KafkaException carries, or None."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def _code(exc: BaseException) -> int | None:
    error = _error(exc)
    return error.code() if error is not None else None


def _reason(exc: BaseException) -> str:
    error = _error(exc)
    return error.str() if error is not None else str(exc)


class KafkaTransport(Transport):
    """Topic administration, publishing and reading on a Kafka-protocol cluster."""

    kind = "kafka"

    def __init__(self, bootstrap_servers: str, properties: Mapping[str, str] | None = None, timeout: float = 10.0, profile: str = "auto"):
        self.bootstrap_servers = bootstrap_servers
        self.properties = dict(properties or {})
        self.timeout = timeout
        self.profile_name = profile
        self._profile: BrokerProfile | None = None
        self._admin: AdminClient | None = None
        self._probe: Consumer | None = None
        self._probe_uncommitted: Consumer | None = None

    @property
    def address(self) -> str:
        """The bootstrap servers, as error messages name them."""
        return self.bootstrap_servers

    @classmethod
    def from_settings(cls, settings: Any, timeout: float = 10.0) -> KafkaTransport:
        """Build from a config's MessagingSettings."""
        return cls(settings.bootstrap_servers, settings.properties, timeout, settings.broker_profile)

    @property
    def profile(self) -> BrokerProfile:
        """The broker's profile (profiles.py): as configured, or, for `auto`, by the cluster id it reports (asked once)."""
        if self._profile is None:
            cluster_id = None
            if self.profile_name == "auto":
                # Through the admin client, which knows every topic anyway: a producer or consumer asked
                # for all topics would track them all, and librdkafka can crash in a client meeting a
                # topic deleted and made again under the same name (confluentinc/librdkafka#4964).
                try:
                    cluster_id = self.admin.list_topics(timeout=self.timeout).cluster_id
                except KafkaException as exc:
                    raise self.unreachable(exc, "asking the broker which it is") from None
            self._profile = profile_for(self.profile_name, cluster_id)
        return self._profile

    def client_config(self, **extra: Any) -> dict[str, Any]:
        """librdkafka settings for a new client: the servers, user properties, then extra."""
        # No Python `logger` callback: librdkafka calling into Python while a client is torn
        # down can crash the interpreter. Its own log goes to stderr, errors only by default.
        return {"bootstrap.servers": self.bootstrap_servers, "log_level": 3, **self.properties, **extra}

    @property
    def admin(self) -> AdminClient:
        """The (lazily created) admin client."""
        if self._admin is None:
            self._admin = AdminClient(self.client_config(**{"allow.auto.create.topics": False}))
        return self._admin

    def unreachable(self, exc: BaseException, doing: str) -> MessagingError:
        """Turn a client exception into a user-facing error that names the broker address."""
        if _code(exc) in _UNREACHABLE:
            return BrokerUnavailable(
                f"cannot reach the Kafka broker at {self.bootstrap_servers} while {doing} ({_reason(exc)}); "
                "is it running? Start the local stack with `sp-dagster up` (or the broker alone with `sp-dagster broker`), or fix deployment.config.bootstrapURLs"
            )
        return MessagingError(f"Kafka at {self.bootstrap_servers} failed while {doing}: {_reason(exc)}")

    def list_topics(self) -> dict[str, TopicInfo]:
        try:
            metadata = self.admin.list_topics(timeout=self.timeout)
        except KafkaException as exc:
            raise self.unreachable(exc, "listing topics") from None
        return {name: TopicInfo(name, len(topic.partitions)) for name, topic in metadata.topics.items() if topic.error is None and not name.startswith("__")}

    def topic_info(self, topic: str) -> TopicInfo | None:
        # The one topic asked for: the admin client then tracks only that one (see `profile` on why).
        try:
            found = self.admin.list_topics(topic=topic, timeout=self.timeout).topics.get(topic)
        except KafkaException as exc:
            raise self.unreachable(exc, f"looking up topic '{topic}'") from None
        return None if found is None or found.error is not None else TopicInfo(topic, len(found.partitions))

    def ensure_topic(self, topic: str, partitions: int) -> TopicInfo:
        if not _TOPIC_NAME.fullmatch(topic):
            raise TopicError(f"'{topic}' is not a valid Kafka topic name: use 1-249 letters, digits, '.', '_' or '-'")
        if partitions < 1:
            raise TopicError(f"topic '{topic}': a topic needs at least 1 partition, not {partitions}")
        info = self.topic_info(topic)
        if info is None:
            return self._create(topic, partitions)
        if info.partitions < partitions:
            return self._grow(info, partitions)
        if info.partitions > partitions:
            log.info("topic %s keeps its %d partitions (%d needed): topics are never shrunk", topic, info.partitions, partitions)
        return info

    def _create(self, topic: str, partitions: int) -> TopicInfo:
        future = self.admin.create_topics([NewTopic(topic, num_partitions=partitions)], operation_timeout=self.timeout)[topic]
        try:
            future.result(timeout=self.timeout)
        except KafkaException as exc:
            if _code(exc) != KafkaError.TOPIC_ALREADY_EXISTS:  # a concurrent creator won the race: fine
                raise self.unreachable(exc, f"creating topic '{topic}'") from None
        info = self._wait_for(topic, partitions)
        log.info("topic %s has %d partitions", topic, info.partitions)
        return info

    def _grow(self, info: TopicInfo, partitions: int) -> TopicInfo:
        topic = info.name
        future = self.admin.create_partitions([NewPartitions(topic, partitions)], operation_timeout=self.timeout)[topic]
        try:
            future.result(timeout=self.timeout)
            return self._wait_for(topic, partitions)
        except KafkaException as exc:
            if _code(exc) not in _CANNOT_GROW:
                raise self.unreachable(exc, f"adding partitions to topic '{topic}'") from None
            reason = _reason(exc)
        # The broker cannot add partitions. A topic that never held an event can be recreated
        # with no loss; one that holds events is left alone.
        ends = self.end_offsets(topic)
        if any(ends.values()):
            raise TopicCannotGrow(
                f"topic '{topic}' has {counted(info.partitions, 'partition')} but {partitions} are needed, and the broker at "
                f"{self.bootstrap_servers} cannot add partitions ({reason}); it holds {sum(ends.values())} events, which "
                "are never deleted to resize it. Delete the topic yourself once it is drained, or use a broker that "
                "supports CreatePartitions (Apache Kafka >= 1.0)"
            )
        log.info("broker cannot add partitions; recreating the empty topic %s with %d partitions", topic, partitions)
        self.delete_topic(topic)
        return self._create(topic, partitions)

    def _wait_for(self, topic: str, partitions: int) -> TopicInfo:
        deadline = time.monotonic() + self.timeout
        while True:
            info = self.topic_info(topic)
            if info is not None and info.partitions >= partitions:
                return info
            if time.monotonic() > deadline:
                raise TopicError(f"topic '{topic}' did not show {partitions} partitions within {self.timeout:.0f}s on {self.bootstrap_servers}")
            time.sleep(0.1)

    def delete_topic(self, topic: str) -> None:
        # A librdkafka client that knows a topic can crash when the topic is deleted and made again
        # under the same name (confluentinc/librdkafka#4964): the clients that may know it (the
        # end-offset probes, the admin) go before it does, and after, and the next calls make new ones.
        self.close()
        future = self.admin.delete_topics([topic], operation_timeout=self.timeout)[topic]
        try:
            future.result(timeout=self.timeout)
        except KafkaException as exc:
            if _code(exc) == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return
            raise self.unreachable(exc, f"deleting topic '{topic}'") from None
        deadline = time.monotonic() + self.timeout
        while self.topic_info(topic) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        self.close()

    def end_offsets(self, topic: str) -> dict[int, int]:
        return self._ends(topic, self._offsets_consumer())

    def end_offsets_with_open_transactions(self, topic: str) -> dict[int, int]:
        """Where each partition ends, messages of transactions still open included (a read_committed
        reader's end, end_offsets, stops before the first of them)."""
        if self._probe_uncommitted is None:
            self._probe_uncommitted = Consumer(self._reader_config(**{**_PROBE, "isolation.level": "read_uncommitted"}))
        return self._ends(topic, self._probe_uncommitted)

    def _ends(self, topic: str, consumer: Consumer) -> dict[int, int]:
        info = self.require_topic(topic)
        try:
            listed = {}
            for partition in range(info.partitions):
                _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=self.timeout, cached=False)
                listed[partition] = max(high, 0)
            # The listed end can lag behind (tansu reports the start of the last batch): read on to the real end.
            consumer.assign([TopicPartition(topic, p, max(o - 1, 0)) for p, o in listed.items()])
            ends: dict[int, int] = {}
            deadline = time.monotonic() + self.timeout
            while len(ends) < info.partitions and time.monotonic() < deadline:
                # In bulk: the last record batch can hold thousands of messages to step over.
                for message in consumer.consume(num_messages=10_000, timeout=0.2):
                    error = message.error()
                    if error is not None and error.code() == KafkaError._PARTITION_EOF:
                        partition, offset = message.partition(), message.offset()
                        assert partition is not None and offset is not None  # an end-of-partition event names both
                        ends[partition] = offset
                    elif error is not None and not (error.code() in _UNREACHABLE and not error.fatal()):
                        raise self.unreachable(KafkaException(error), f"reading the end offsets of '{topic}'")
            consumer.unassign()
            if len(ends) < info.partitions:
                raise BrokerUnavailable(
                    f"could not read to the end of topic '{topic}' within {self.timeout:.0f}s on {self.bootstrap_servers}: the broker is "
                    "slow, or a transaction left open there (its owner dead and not yet replaced) hides the end from committed reads"
                )
            return dict(sorted(ends.items()))
        except KafkaException as exc:
            raise self.unreachable(exc, f"reading the end offsets of '{topic}'") from None

    def _offsets_consumer(self) -> Consumer:
        """One consumer kept for end-offset probes (they run on every micro-batch of a worker's sources)."""
        if self._probe is None:
            self._probe = Consumer(self._reader_config(**_PROBE))
        return self._probe

    def _reader_config(self, **extra: Any) -> dict[str, Any]:
        return self.client_config(
            **{
                "group.id": f"sp-dagster-reader-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "allow.auto.create.topics": False,
                # Some brokers (tansu) answer a fetch only when its wait runs out, even if events
                # arrived: a short wait keeps latency low (12 ms instead of 250 ms per hop there).
                "fetch.wait.max.ms": self.properties.get("fetch.wait.max.ms", 20),
                **extra,
            }
        )

    def raw_publisher(self) -> RawPublisher:
        return RawPublisher(self)

    def transactional_publisher(self, transactional_id: str, group_id: str, abandoned_after_s: float | None = None) -> TransactionalPublisher:
        return TransactionalPublisher(self, transactional_id, group_id, self.timeout, abandoned_after_s)

    def group_offsets(self, group_id: str) -> KafkaGroupOffsets:
        return KafkaGroupOffsets(self, group_id)

    def reader(self, topic: str, assignments: Mapping[int, int], codec: Codec) -> KafkaReader:
        return KafkaReader(self, topic, self.resolve(topic, assignments), codec)

    def close(self) -> None:
        self._admin = None
        for probe in (self._probe, self._probe_uncommitted):
            if probe is not None:
                probe.close()
        self._probe = self._probe_uncommitted = None


class RawPublisher(RawPublisherBase):
    """Publishes ready-encoded messages to any topic and partition; the base of every Kafka publisher."""

    def __init__(self, transport: KafkaTransport):
        self.transport = transport
        # Idempotent: a retried send never lands twice or out of order, which the next group's
        # origin check relies on (a later origin arriving first would make the earlier look replayed).
        self.producer = Producer(
            transport.client_config(
                **{
                    "linger.ms": 5,
                    "acks": "all",
                    "enable.idempotence": True,
                    "allow.auto.create.topics": False,
                    "delivery.report.only.error": True,  # a report per failure only: no Python call per message
                }
            )
        )
        self._failures: list[str] = []
        self._topics: set[str] = set()
        self._report = self._delivered  # per-message delivery reports (transactions report at commit)
        self.stamps = WriterStamps() if transport.profile.reread_skips else None

    def _delivered(self, error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            self._failures.append(error.str())

    @property
    def max_message_bytes(self) -> int:
        """The largest message this client sends (message.max.bytes)."""
        return int(self.transport.properties.get("message.max.bytes", _MESSAGE_MAX_BYTES))

    def too_large(self, size: int, topic: str) -> MessageTooLarge:
        """The error for a message of `size` bytes over this client's limit."""
        fix = "raise message.max.bytes in deployment.config.kafkaProperties (and the broker's own limit)"
        return MessageTooLarge(size, self.max_message_bytes, topic, "a Kafka message (message.max.bytes)", fix)

    def produce(self, topic: str, value: bytes, key: bytes | None, partition: int, timestamp: int | None, headers: list | None = None) -> None:
        """Queue one message (timestamp in ms; None: the broker's time)."""
        self._topics.add(topic)
        while True:
            try:
                self.producer.produce(topic, value=value, key=key, partition=partition, timestamp=timestamp or 0, headers=headers, on_delivery=self._report)
                return
            except BufferError:  # the local queue is full: let deliveries drain
                self.producer.poll(0.1)
            except KafkaException as exc:
                if _code(exc) == KafkaError.MSG_SIZE_TOO_LARGE:
                    raise self.too_large(len(value) + len(key or b""), topic) from None
                raise self.transport.unreachable(exc, f"publishing to '{topic}'") from None

    def produce_all(self, records, header: str = "") -> None:
        """Queue (topic, value, key, partition, timestamp, origin) records; the origin goes in `header`, and,
        where the broker's profile asks, each message to a chosen partition is stamped with this publisher's counter there (skips.py)."""
        produce, report = self.producer.produce, self._report
        topics, stamp = self._topics, self.stamps.stamp if self.stamps is not None else None
        for topic, value, key, partition, timestamp, found in records:
            headers = [(header, found)] if found is not None else []
            if stamp is not None and partition >= 0:
                headers.append((WRITER_HEADER, stamp(topic, partition)))
            if topic not in topics:
                topics.add(topic)
            try:
                produce(topic, value=value, key=key, partition=partition, timestamp=timestamp or 0, headers=headers or None, on_delivery=report)
            except (BufferError, KafkaException):  # a full local queue (or an error): the careful way
                self.produce(topic, value, key, partition, timestamp, headers or None)

    def serve(self) -> None:
        """Serve delivery reports that arrived, without waiting."""
        self.producer.poll(0)

    def leave(self) -> None:
        self.producer.purge()  # then its release waits for nothing, broker or not

    def prepare(self, topics: Iterable[str]) -> None:
        try:
            for topic in topics:
                self.producer.list_topics(topic, timeout=self.transport.timeout)
        except KafkaException as exc:
            raise self.transport.unreachable(exc, "connecting a publisher") from None

    def flush(self, timeout: float = 30.0) -> None:
        """Wait for every queued message's acknowledgement; raise on any failure."""
        remaining = self.producer.flush(timeout)
        failures, self._failures = self._failures, []
        topics = ", ".join(f"'{t}'" for t in sorted(self._topics))
        if remaining:
            raise BrokerUnavailable(
                f"{counted(remaining, 'event')} for topic {topics} not acknowledged within {timeout:.0f}s by "
                f"{self.transport.bootstrap_servers}; is the broker running?"
            )
        if failures:
            raise MessagingError(f"{counted(len(failures), 'event')} could not be published to {topics}: {failures[0]}")


def _abandon_after(seconds: float | None, properties: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka settings for a broker-side abort of a transaction left open `seconds` (Kafka's
    `transaction.timeout.ms`; librdkafka wants `socket.timeout.ms` no longer than it plus 100 ms)."""
    if seconds is None or "transaction.timeout.ms" in properties:
        return {}  # the user's own setting wins
    timeout_ms = max(1000, math.ceil(seconds * 1000))
    extra: dict[str, Any] = {"transaction.timeout.ms": timeout_ms}
    if int(properties.get("socket.timeout.ms", 0)) > timeout_ms + 100:
        extra["socket.timeout.ms"] = timeout_ms + 100
    return extra


class TransactionalPublisher(RawPublisher, TransactionalPublisherBase):
    """Publishes in Kafka transactions, each also committing the input offsets its messages follow from.

    Readers with `isolation.level=read_committed` (librdkafka's default, and every reader here)
    see a transaction's messages only once it commits, together with the offsets: a restarted
    owner of the same `transactional_id` aborts what its predecessor left open (and fences it),
    reads the committed offsets, and knows which outputs were published (exactly-once)."""

    def __init__(self, transport: KafkaTransport, transactional_id: str, group_id: str, timeout: float = 30.0, abandoned_after_s: float | None = None):
        self.transport = transport
        self.transactional_id = transactional_id
        self.timeout = timeout
        settings = {"transactional.id": transactional_id, "enable.idempotence": True, "linger.ms": 1, "acks": "all", "allow.auto.create.topics": False}
        self.producer = Producer(transport.client_config(**settings, **_abandon_after(abandoned_after_s, transport.properties)))
        self._failures: list[str] = []
        self._topics: set[str] = set()
        self._report = None  # a message that fails makes its transaction's commit fail: no per-message reports
        self.stamps = WriterStamps() if transport.profile.reread_skips else None
        self._open = False
        self.stuck = False  # a call never returned (see _bounded): nothing more is asked of the producer
        self._partitions: dict[str, int] = {}  # output topic -> its partition count (marks)
        try:
            self.producer.init_transactions(timeout)
        except KafkaException as exc:
            raise self.transport.unreachable(exc, f"starting transactions as '{transactional_id}'") from None
        self._offsets = KafkaGroupOffsets(transport, group_id)
        log.info("transactions as '%s'%s", transactional_id, f" (writer {self.stamps.token})" if self.stamps else "")

    @property
    def in_transaction(self) -> bool:
        """True from a turn's first message until its commit."""
        return self._open

    def produce(self, topic: str, value: bytes, key: bytes | None, partition: int, timestamp: int | None, headers: list | None = None) -> None:
        """Queue one message in the open transaction (opening one if needed)."""
        self._begin()
        super().produce(topic, value, key, partition, timestamp, headers)

    def produce_all(self, records, header: str = "") -> None:
        self._begin()
        super().produce_all(records, header)

    def _begin(self) -> None:
        if not self._open:
            try:
                self.producer.begin_transaction()
            except KafkaException as exc:
                raise self.transport.unreachable(exc, f"beginning a transaction as '{self.transactional_id}'") from None
            self._open = True

    def commit(self, offsets: Mapping[tuple[str, int], int], metadata: str = "", *, retry_while: Callable[[], bool] | None = None) -> None:
        """Commit the open transaction with the input offsets (next to read, per (topic, partition)).

        A step the broker did not answer in time is tried again for as long as `retry_while()`
        holds (the owner still owns its inputs): given up, the transaction would stay open, and a
        next owner's start resolves it, on some brokers by committing its messages without the
        offsets (tansu 0.6), which would publish them twice."""
        self._begin()
        try:
            if offsets:
                positions = [TopicPartition(t, p, o, metadata=metadata) for (t, p), o in sorted(offsets.items())]
                metadata_of_group = self._offsets.consumer.consumer_group_metadata()

                def send() -> None:
                    wait = self._wait(min(self.timeout, _OFFSETS_TIMEOUT_S))
                    self._bounded(
                        lambda: self.producer.send_offsets_to_transaction(positions, metadata_of_group, wait),
                        wait,
                        "sending the input offsets to the transaction",
                    )

                self._retrying(send, retry_while)
            self._retrying(lambda: self.producer.commit_transaction(self._wait(self.timeout)), retry_while)
        except KafkaException as exc:
            error = _error(exc)
            if error is not None and error.code() in _FENCED:
                raise ProducerFenced(
                    f"a newer owner of '{self.transactional_id}' took over (its transactions fence this one): this copy stops without publishing"
                ) from None
            if error is not None and error.txn_requires_abort():
                try:
                    self.producer.abort_transaction(self.timeout)
                except KafkaException:  # the broker will abort it (or the next owner resolve it): the commit's error is the one to tell
                    log.warning("could not abort the failed transaction of '%s'", self.transactional_id)
            raise self.transport.unreachable(exc, "committing a transaction") from None
        finally:
            self._open = False
        failures, self._failures = self._failures, []
        if failures:
            raise MessagingError(f"{counted(len(failures), 'event')} could not be published: {failures[0]}")

    def _wait(self, longest: float) -> float:
        """How long one call may wait: `longest`, or less when the owner's lease ends sooner (a
        partitioned owner gives up within its lease, and its successor resolves what it left open)."""
        if self.time_left is None:
            return longest
        return max(_SHORTEST_WAIT_S, min(longest, self.time_left()))

    def _bounded(self, call: Callable[[], None], timeout: float, what: str) -> None:
        """Make a call that may not keep its own `timeout`, and give up on it a little past that.

        librdkafka's send_offsets_to_transaction can wait forever once the group coordinator went
        away, even when it is back (a restarted broker; confluentinc/librdkafka#5456, #5511): the call
        runs on a thread of its own and, stuck, this publisher is abandoned (the instance starts
        again from its checkpoint with a new one, whose start fences this one)."""
        outcome: list[BaseException | None] = []

        def run() -> None:
            try:
                call()
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                outcome.append(exc)

        thread = threading.Thread(target=run, name=f"kafka-txn-{self.transactional_id}", daemon=True)
        thread.start()
        started = time.monotonic()
        lease_ended = False
        while thread.is_alive() and time.monotonic() < started + timeout + _STUCK_GRACE_S and not lease_ended:
            thread.join(_LEASE_LOOK_S)
            lease_ended = self.time_left is not None and self.time_left() <= 0  # no grace past it: the successor resolves the transaction
        if not outcome:
            self.stuck = True
            _ABANDONED.append(self.producer)
            why = "its owner's lease ended meanwhile" if lease_ended else "a client stuck after the broker went away"
            raise BrokerUnavailable(
                f"the Kafka client did not return from {what} within {time.monotonic() - started:.0f}s on "
                f"{self.transport.bootstrap_servers} ({why}); its transaction is given up"
            )
        if outcome[0] is not None:
            raise outcome[0]

    def _retrying(self, step: Callable[[], None], retry_while: Callable[[], bool] | None) -> None:
        while True:
            try:
                return step()
            except KafkaException as exc:
                error = _error(exc)
                if error is None or not error.retriable() or error.txn_requires_abort() or retry_while is None or not retry_while():
                    raise
                log.warning("transaction of '%s' not acknowledged yet (%s); trying again", self.transactional_id, error.str())

    def flush(self, timeout: float = 30.0) -> None:
        """Commit what is open, without offsets."""
        if self._open:
            self.commit({})

    def committed(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, str]]:
        """(offset, metadata) committed by earlier transactions, per (topic, partition) that has one."""
        return self._offsets.committed(partitions)

    def marks(self, topics: Iterable[str]) -> dict[tuple[str, int], int]:
        """Where each partition of `topics` ends as the broker lists it (at or before its real end):
        whatever this publisher writes from now on lands past it."""
        consumer = self.transport._offsets_consumer()
        marks = {}
        try:
            for topic in topics:
                if topic not in self._partitions:  # asked once: a metadata request waits its whole timeout in a partition
                    self._partitions[topic] = self.transport.require_topic(topic).partitions
                for partition in range(self._partitions[topic]):
                    _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=self._wait(self.timeout), cached=False)
                    marks[(topic, partition)] = max(high, 0)
        except KafkaException as exc:
            raise self.transport.unreachable(exc, "listing where the output topics end") from None
        return marks

    def headers_since(self, marks: Mapping[tuple[str, int], int], header: str) -> dict[tuple[str, int], list[bytes]]:
        """The `header` value of every message a read_committed reader sees from `marks` to the end
        of each partition (as it is now), per (topic, partition); of a batch, those its events carry."""
        found: dict[tuple[str, int], list[bytes]] = {place: [] for place in marks}
        # To the end with the open transactions: another dead owner's, still open, hides what follows
        # it from a read_committed reader until its own next owner starts; wait for that.
        ends = {(t, p): end for t in {t for t, _p in marks} for p, end in self.transport.end_offsets_with_open_transactions(t).items()}
        behind = {place for place, mark in marks.items() if mark < ends.get(place, 0)}
        if not behind:
            return found
        consumer = Consumer(self.transport._reader_config(**{"auto.offset.reset": "earliest", "enable.partition.eof": True}))
        try:
            consumer.assign([TopicPartition(t, p, marks[(t, p)]) for t, p in sorted(behind)])
            deadline = time.monotonic() + self.timeout
            while behind and time.monotonic() < deadline:
                for message in consumer.consume(num_messages=10_000, timeout=0.2):
                    place, error = (message.topic() or "", message.partition() or 0), message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF and (message.offset() or 0) >= ends[place]:
                            behind.discard(place)
                        continue
                    origins = [value for name, value in message.headers() or () if name == header and isinstance(value, bytes)]
                    value = message.value()
                    if not origins and value is not None and batches.is_batch(value):
                        origins = batches.origins(value)  # a batch's events carry theirs inside
                    found[place] += origins
                for tp in consumer.position([TopicPartition(t, p) for t, p in behind]):
                    if tp.offset >= ends[(tp.topic, tp.partition)]:
                        behind.discard((tp.topic, tp.partition))
        except KafkaException as exc:
            raise self.transport.unreachable(exc, "reading back the output topics") from None
        finally:
            consumer.close()
        if behind:
            raise BrokerUnavailable(
                f"could not read {sorted(behind)} to their end within {self.timeout:.0f}s on {self.transport.bootstrap_servers} "
                "(a transaction still open there: another instance's, whose next owner has not started yet?)"
            )
        return found

    def leave(self) -> None:
        # Not aborted: the next owner's start resolves it (Kafka fences an older epoch's late abort; a broker
        # that does not would drop what that owner already counted as published).
        self._open = False
        self.close()

    def close(self) -> None:
        """Abort what is open (within the owner's lease: after it, a successor resolves it) and release the clients."""
        if self._open and self.time_left is not None and self.time_left() <= 0:
            self._open = False  # as leave(): a late abort of an older epoch would drop what the successor counted as published
        if self._open and not self.stuck:
            try:
                self.producer.abort_transaction(self._wait(self.timeout))
            except KafkaException as exc:
                log.debug("aborting on close: %s", exc)
            self._open = False
        self._offsets.close()


class KafkaGroupOffsets(GroupOffsets):
    """A group's committed offsets, written by a consumer that never joins it (as a transaction's are)."""

    def __init__(self, transport: KafkaTransport, group_id: str):
        self.transport = transport
        self.consumer = Consumer(transport._reader_config(**{"group.id": group_id}))

    def commit(self, offsets: Mapping[tuple[str, int], int], metadata: str = "") -> None:
        if not offsets:
            return
        try:
            self.consumer.commit(offsets=[TopicPartition(t, p, o, metadata=metadata) for (t, p), o in sorted(offsets.items())], asynchronous=True)
        except KafkaException as exc:
            raise self.transport.unreachable(exc, "committing offsets") from None

    def committed(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, str]]:
        wanted = [TopicPartition(t, p) for t, p in partitions]
        if not wanted:
            return {}
        try:
            found = self.consumer.committed(wanted, timeout=self.transport.timeout)
        except KafkaException as exc:
            raise self.transport.unreachable(exc, "reading committed offsets") from None
        return {(tp.topic, tp.partition): (tp.offset, tp.metadata or "") for tp in found if tp.offset >= 0}

    def close(self, wait: bool = True) -> None:
        if wait:
            self.consumer.close()  # waits for the commits in flight
        else:  # the same on a thread of its own: it may wait for an unreachable broker
            threading.Thread(target=self.consumer.close, name="kafka-offsets-close", daemon=True).start()


class KafkaReader(Reader):
    """Reads an explicit set of partitions from explicit offsets (no group rebalancing, no commits)."""

    def __init__(self, transport: KafkaTransport, topic: str, assignments: Mapping[int, int], codec: Codec):
        self.transport = transport
        self.topic = topic
        self.codec = codec
        self.consumer = Consumer(transport._reader_config(**{"auto.offset.reset": "earliest"}))
        start = {p: (TopicPartition(topic, p, o if o >= 0 else EARLIEST)) for p, o in assignments.items()}
        self._positions = {p: o for p, o in assignments.items() if o >= 0}
        self._unknown = {p for p, o in assignments.items() if o < 0}  # EARLIEST: learnt on first read
        self._outage = False
        # Messages a fetch passed over, read again (skips.py), on brokers whose profile needs it.
        self.guard = SkipGuard(topic) if transport.profile.reread_skips else None
        self.consumer.assign(list(start.values()))

    def positions(self) -> dict[int, int]:
        if self._unknown:
            for tp in self.consumer.position([TopicPartition(self.topic, p) for p in self._unknown]):
                if tp.offset >= 0:
                    self._positions[tp.partition] = tp.offset
                    self._unknown.discard(tp.partition)
        return dict(self._positions)

    def fetched_to(self) -> dict[int, int]:
        """The consumer's own positions: past the transaction markers that end_offsets() counts."""
        mine = [TopicPartition(self.topic, p) for p in sorted({*self._positions, *self._unknown})]
        return {tp.partition: tp.offset for tp in self.consumer.position(mine) if tp.offset >= 0}

    def backlog(self) -> dict[int, int]:
        """From the high watermarks the last fetches brought (no request to the broker)."""
        behind = {}
        for partition, position in self.positions().items():
            _low, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, partition), cached=True)
            if high >= 0:
                behind[partition] = max(0, high - position)
        return behind

    def _fetch(self, max_events: int, timeout: float, header: str = "") -> list:
        """The messages available (up to max_events), waiting at most `timeout` for the first;
        end-of-partition markers skipped, a broker outage reported once and waited out."""
        try:
            # Wait for the first message only; then take what has already arrived, without waiting.
            started = time.monotonic()
            first = self.consumer.poll(timeout)
            self.waited_s += time.monotonic() - started
            messages = [first] if first is not None else []
            if first is not None and max_events > 1:
                messages += self.consumer.consume(num_messages=max_events - 1, timeout=0)
        except KafkaException as exc:
            raise self.transport.unreachable(exc, f"reading '{self.topic}'") from None
        if any(message.error() is not None for message in messages):
            messages = [message for message in messages if self._usable(message)]
        elif self._outage and messages:
            log.info("reading %s: broker %s reachable again", self.topic, self.transport.bootstrap_servers)
            self._outage = False
        return self._guarded(messages, header)

    def _guarded(self, messages: list, header: str = "") -> list:
        """The messages to deliver, as (message, headers, the value of `header` or None): those read again
        that were delivered before are dropped, and a partition whose fetch stepped over messages is read
        again from there (skips.py)."""
        guard, admitted, rewound, now = self.guard, [], set(), time.monotonic()
        if guard is None:
            for message in messages:
                headers = message.headers() or ()
                admitted.append((message, headers, next((value for name, value in headers if name == header), None)))
            return admitted
        for message in messages:
            partition = message.partition()
            if partition in rewound:
                continue
            headers = message.headers() or ()
            found = stamp = None
            for name, value in headers:
                if name == WRITER_HEADER:
                    stamp = parse_stamp(value)
                elif name == header:
                    found = value
            verdict = guard.admit(partition, message.offset(), stamp, now)
            if verdict is True:
                admitted.append((message, headers, found))
            elif verdict is not False:
                rewound.add(partition)
                self._seek(partition, verdict)
        for partition, offset in guard.due().items():
            self._seek(partition, offset)
        ends = {p: end for p, end in guard.rereads().items() if p not in rewound}
        if ends:
            for tp in self.consumer.position([TopicPartition(self.topic, p) for p in ends]):
                if tp.offset >= ends[tp.partition]:
                    guard.reread_done(tp.partition)
        return admitted

    def read_again(self) -> bool:
        if self.guard is None:
            return False
        for partition, offset in self.guard.read_all_again().items():
            self._seek(partition, offset)
        return self.guard.rereading()

    def _seek(self, partition: int, offset: int) -> None:
        log.debug("reading %s: partition %d again from offset %d, where a fetch may have stepped over messages", self.topic, partition, offset)
        try:
            self.consumer.seek(TopicPartition(self.topic, partition, offset))
        except KafkaException as exc:
            raise self.transport.unreachable(exc, f"reading '{self.topic}' again") from None

    def _usable(self, message) -> bool:
        error = message.error()
        if error is None:
            if self._outage:
                log.info("reading %s: broker %s reachable again", self.topic, self.transport.bootstrap_servers)
                self._outage = False
            return True
        if error.code() == KafkaError._PARTITION_EOF:
            return False
        if error.code() in _UNREACHABLE and not error.fatal():
            # librdkafka reconnects by itself: report the outage once, keep polling.
            if not self._outage:
                log.warning("reading %s: broker %s unreachable (%s); retrying", self.topic, self.transport.bootstrap_servers, error.str())
            self._outage = True
            return False
        raise self.transport.unreachable(KafkaException(error), f"reading '{self.topic}'")

    def poll(self, max_events: int = 10_000, timeout: float = 1.0) -> Batch:
        batch = Batch()
        for message, headers, _found in self._fetch(max_events, timeout):
            partition, offset = message.partition(), message.offset()
            kind, stamp = message.timestamp()
            stamp = stamp if kind != 0 and stamp >= 0 else None
            try:
                rows = self.codec.decode(message.value() or b"")
            except EventDecodeError as exc:
                batch.rejects.append(Reject(partition, offset, stamp, message.value() or b"", str(exc)))
            else:
                headers = tuple(headers)
                batch.events.extend(Event(partition, offset, stamp, row, message.key(), headers) for row in rows)
            self._positions[partition] = max(offset + 1, self._positions.get(partition, 0))
            self._unknown.discard(partition)
        batch.positions = self.positions()
        return batch

    def poll_raw(self, max_events: int = 10_000, timeout: float = 1.0, header: str = "") -> list[tuple]:
        out = []
        positions = self._positions
        for message, _headers, found in self._fetch(max_events, timeout, header):
            partition, offset = message.partition(), message.offset()
            kind, stamp = message.timestamp()
            out.append((partition, offset, stamp if kind != 0 and stamp >= 0 else None, message.key(), message.value() or b"", found))
            if offset >= positions.get(partition, 0):  # a message read again lies behind
                positions[partition] = offset + 1
        if out and self._unknown:
            self._unknown.difference_update(p for p, *_ in out)
        return out

    def close(self) -> None:
        self.consumer.close()
