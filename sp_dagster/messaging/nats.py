"""The NATS messaging layer, on JetStream (nats-py), NATS Streaming's successor: a topic is one JetStream
stream with one subject per partition, an event's offset is its stream sequence number, and the message
key, event timestamp and headers travel as NATS headers. Names, offsets and batching are described in
docs/messaging.md.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import concurrent.futures
import json
import logging
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

try:
    import nats
    import nats.errors
    import nats.js.errors
    from nats.js import api
except ImportError:  # pragma: no cover - nats-py is the optional extra `nats`
    from sp_dagster.errors import SpDagsterError

    raise SpDagsterError("the NATS messaging layer needs nats-py: pip install 'sp-dagster[nats]'") from None

from sp_dagster.errors import BrokerUnavailable, ConfigError, EventDecodeError, JetStreamUnavailable, MessagingError, TopicError
from sp_dagster.messaging.codecs import Codec
from sp_dagster.messaging.errors import MessageTooLarge
from sp_dagster.messaging.transport import EARLIEST, Batch, Event, Reader, Reject, TopicInfo, Transport
from sp_dagster.messaging.transport import RawPublisher as RawPublisherBase
from sp_dagster.siddhi.transports import NATS_CLUSTER_ID, NATS_TOPIC
from sp_dagster.wording import counted

log = logging.getLogger(__name__)

KEY_HEADER, TIME_HEADER, HEADERS_HEADER = "Sp-Key", "Sp-Ts", "Sp-Headers"
META_CLUSTER, META_TOPIC = "sp-dagster-cluster", "sp-dagster-topic"
CHUNK = 512  # messages handed to the event loop at once, as one write of protocol frames
MAX_IN_FLIGHT = 20_000  # unacknowledged publishes before produce() waits
MAX_BUFFERED = 50_000  # messages a reader holds before the server is made to wait (flow control)


def header_block(key: bytes | None, timestamp: int | None, headers: Iterable[tuple[str, bytes]] | None) -> bytes:
    """The NATS header block that carries a message's key, event timestamp (ms) and own headers (b"": none)."""
    lines = []
    if key is not None:
        lines.append(f"{KEY_HEADER}: {base64.b64encode(key).decode()}\r\n")
    if timestamp:
        lines.append(f"{TIME_HEADER}: {int(timestamp)}\r\n")
    if headers:  # name:value pairs, each side base64 (so any bytes survive), joined by ','
        lines.append(f"{HEADERS_HEADER}: {','.join(f'{_b64(name)}:{_b64(value)}' for name, value in headers)}\r\n")
    return f"NATS/1.0\r\n{''.join(lines)}\r\n".encode() if lines else b""


def publish_frame(subject: str, reply: str, value: bytes, block: bytes) -> bytes:
    """One message as the NATS protocol writes it (HPUB with a header block, else PUB), so a chunk goes out in one write."""
    if not block:
        return b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply.encode(), len(value), value)
    return b"HPUB %s %s %d %d\r\n%s%s\r\n" % (subject.encode(), reply.encode(), len(block), len(block) + len(value), block, value)


def _b64(data: bytes | str) -> str:
    return base64.b64encode(data if isinstance(data, bytes) else str(data).encode()).decode()


def parse_headers(nats_headers: Mapping[str, str] | None) -> tuple[bytes | None, int | None, tuple[tuple[str, bytes], ...]]:
    """Read back header_block() as nats-py parsed it: (key, timestamp or None, headers)."""
    if not nats_headers:
        return None, None, ()
    key = nats_headers.get(KEY_HEADER)
    stamp = nats_headers.get(TIME_HEADER)
    pairs = nats_headers.get(HEADERS_HEADER)
    return (
        base64.b64decode(key) if key is not None else None,
        int(stamp) if stamp else None,
        tuple((base64.b64decode(name).decode(), base64.b64decode(value)) for name, _, value in (p.partition(":") for p in pairs.split(","))) if pairs else (),
    )


def _sequence_and_time(reply: str) -> tuple[int, int]:
    """The stream sequence and the store time (ns) in a JetStream delivery's reply subject."""
    tokens = reply.split(".")
    if len(tokens) > 9:  # $JS.ACK.<domain>.<account hash>.<stream>... (the v2 form)
        tokens = tokens[:2] + tokens[4:]
    return int(tokens[5]), int(tokens[7])


def server_url(server: str) -> str:
    """A NATS URL from `host:port` or `nats://host:port`."""
    server = server.strip()
    return server if "://" in server else f"nats://{server}"


class _EventLoop:
    """A private asyncio event loop running in a daemon thread.

    nats-py is asyncio: each transport runs its client on one of these, so the synchronous interface
    works from any thread (workers, Spark Python workers, the CLI)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sp-dagster-nats", daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout: float | None):
        """Run a coroutine on the loop and wait for its result (at most timeout seconds)."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError from None

    def stop(self) -> None:
        """Cancel what still runs on the loop, then stop the loop and its thread."""

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.run(cancel_all(), 5)
        except Exception:  # stopping anyway
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()


class NatsTransport(Transport):
    """Topic administration, publishing and reading on a NATS server with JetStream."""

    kind = "nats"

    def __init__(
        self, servers: str | Sequence[str], cluster_id: str, timeout: float = 10.0, replicas: int = 1, setting: str = "deployment.config.natsServerUrl"
    ):
        names = servers.split(",") if isinstance(servers, str) else servers
        self.servers = tuple(server_url(s) for s in names if s.strip())
        if not self.servers:
            raise ConfigError("no NATS server given; set deployment.config.natsServerUrl (nats://host:4222)")
        if not cluster_id or not NATS_CLUSTER_ID.fullmatch(cluster_id):
            raise ConfigError(
                f"clusterId '{cluster_id or ''}' cannot name NATS streams and subjects: use letters, digits, '_' or '-' (deployment.config.clusterId)"
            )
        self.cluster_id = cluster_id
        self.setting = setting  # where users set the servers, for errors
        self.timeout = timeout
        self.replicas = replicas
        self._lock = threading.Lock()
        self._loop: _EventLoop | None = None
        self._nc: Any = None  # nats-py's client and JetStream context, once connected
        self._js: Any = None
        self._publishers: weakref.WeakSet[NatsRawPublisher] = weakref.WeakSet()  # open ones, stopped by close()

    @classmethod
    def from_settings(cls, settings: Any, timeout: float = 10.0) -> NatsTransport:
        """Build from a config's MessagingSettings (natsServerUrl, clusterId)."""
        return cls(settings.servers, settings.cluster_id, timeout)

    @property
    def address(self) -> str:
        """The servers, comma separated, as users wrote them in natsServerUrl."""
        return ",".join(self.servers)

    # -- the connection ---------------------------------------------------------------------

    def run(self, coroutine, doing: str, timeout: float | None = None):
        """Run a coroutine on the transport's loop; turn NATS failures into errors that name the server."""
        try:
            self.connect()
        except BaseException:
            coroutine.close()  # never to run
            raise
        loop = self._loop
        assert loop is not None  # connected just above
        try:
            return loop.run(coroutine, timeout or self.timeout + 1)
        except TimeoutError:
            raise BrokerUnavailable(f"the NATS server at {self.address} did not answer within {self.timeout:.0f}s while {doing}; is it running?") from None
        except (nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError):
            raise self._no_jetstream() from None
        except (nats.errors.TimeoutError, nats.errors.ConnectionClosedError, nats.errors.StaleConnectionError) as exc:
            raise BrokerUnavailable(f"the NATS server at {self.address} did not answer while {doing} ({type(exc).__name__}); is it running?") from None
        except nats.js.errors.APIError as exc:
            raise MessagingError(f"NATS JetStream at {self.address} refused {doing}: {exc.description or exc}") from None

    def _no_jetstream(self) -> JetStreamUnavailable:
        return JetStreamUnavailable(
            f"JetStream is not enabled on the NATS server at {self.address}; start nats-server with -js (`sp-dagster nats` runs one with JetStream on)"
        )

    def connect(self) -> None:
        """Connect (once) and check that the server runs JetStream."""
        with self._lock:
            if self._nc is not None:
                return
            loop = _EventLoop()
            try:
                self._nc, self._js = loop.run(self._connect(), self.timeout + 1)
            except BaseException as exc:
                loop.stop()
                if isinstance(exc, MessagingError):
                    raise
                raise BrokerUnavailable(
                    f"cannot reach the NATS server at {self.address} ({_describe(exc)}); is it running? Start the local stack with "
                    f"`sp-dagster up --messaging nats` (or the server alone with `sp-dagster nats`), or fix {self.setting}"
                ) from None
            self._loop = loop

    async def _connect(self):
        async def error(exc: Exception) -> None:
            log.warning("NATS %s: %s", self.address, _describe(exc))

        async def disconnected() -> None:
            if self._nc is not None:  # not when close() disconnects
                log.warning("NATS %s: disconnected; reconnecting", self.address)

        async def reconnected() -> None:
            log.info("NATS %s: reconnected", self.address)

        nc = await asyncio.wait_for(
            nats.connect(
                servers=list(self.servers),
                name="sp-dagster",
                connect_timeout=min(self.timeout, 5),
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                error_cb=error,
                disconnected_cb=disconnected,
                reconnected_cb=reconnected,
            ),
            self.timeout,
        )
        js = nc.jetstream(timeout=self.timeout)
        try:
            await js._jsm.account_info()
        except (nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError):
            await nc.close()
            raise self._no_jetstream() from None
        except BaseException:
            await nc.close()
            raise
        return nc, js

    def close(self) -> None:
        # A publisher left open keeps a subscription the drain below would wait 5 s for.
        for publisher in list(self._publishers):
            publisher.stop()
        with self._lock:
            nc, loop, self._nc, self._js, self._loop = self._nc, self._loop, None, None, None
        if loop is None:
            return
        try:
            loop.run(nc.drain(), 5)
        except Exception:  # closing: the server may be gone already
            pass
        loop.stop()

    # -- names --------------------------------------------------------------------------------

    def stream_name(self, topic: str) -> str:
        """The JetStream stream that holds a topic."""
        return f"{self.cluster_id}_{topic.replace('.', '~')}"

    def subject(self, topic: str, partition: int) -> str:
        """The subject of one partition of a topic."""
        return f"{self.cluster_id}.{topic}.{partition}"

    # -- topics -------------------------------------------------------------------------------

    def list_topics(self) -> dict[str, TopicInfo]:
        async def listing():
            streams, offset = [], 0
            while True:
                page = await self._js._jsm.streams_info(offset)
                streams += page
                offset += len(page)
                if not page or len(page) < 256:
                    return streams

        topics = {}
        for info in self.run(listing(), "listing streams"):
            metadata = info.config.metadata or {}
            if metadata.get(META_CLUSTER) == self.cluster_id and metadata.get(META_TOPIC):
                topics[metadata[META_TOPIC]] = TopicInfo(metadata[META_TOPIC], len(info.config.subjects or ()))
        return topics

    def _stream(self, topic: str) -> api.StreamInfo | None:
        async def info():
            try:
                return await self._js._jsm.stream_info(self.stream_name(topic))
            except nats.js.errors.NotFoundError:
                return None

        found = self.run(info(), f"looking up topic '{topic}'")
        if found is not None:
            metadata = found.config.metadata or {}
            if (metadata.get(META_CLUSTER), metadata.get(META_TOPIC)) != (self.cluster_id, topic):
                raise TopicError(
                    f"the JetStream stream '{found.config.name}' on {self.address} does not hold topic '{topic}' of cluster "
                    f"'{self.cluster_id}' (its metadata: {metadata.get(META_CLUSTER)!r}, {metadata.get(META_TOPIC)!r}); "
                    "rename the topic or remove that stream"
                )
        return found

    def topic_info(self, topic: str) -> TopicInfo | None:
        found = self._stream(topic)
        return None if found is None else TopicInfo(topic, len(found.config.subjects or ()))

    def ensure_topic(self, topic: str, partitions: int) -> TopicInfo:
        if not NATS_TOPIC.fullmatch(topic) or len(topic) > 200:
            raise TopicError(f"'{topic}' is not a valid topic name: use up to 200 letters, digits, '_' or '-', in parts joined by '.'")
        if partitions < 1:
            raise TopicError(f"topic '{topic}': a topic needs at least 1 partition, not {partitions}")
        found = self._stream(topic)
        if found is None:
            return self._create(topic, partitions)
        have = len(found.config.subjects or ())
        if have < partitions:
            config = found.config
            config.subjects = [self.subject(topic, p) for p in range(partitions)]
            self.run(self._js._jsm.update_stream(config), f"adding partitions to topic '{topic}'")
            log.info("topic %s grew from %d to %d partitions", topic, have, partitions)
            return TopicInfo(topic, partitions)
        if have > partitions:
            log.info("topic %s keeps its %d partitions (%d needed): topics are never shrunk", topic, have, partitions)
        return TopicInfo(topic, have)

    def _create(self, topic: str, partitions: int) -> TopicInfo:
        config = api.StreamConfig(
            name=self.stream_name(topic),
            description=f"sp-dagster topic {topic} (cluster {self.cluster_id})",
            subjects=[self.subject(topic, p) for p in range(partitions)],
            retention=api.RetentionPolicy.LIMITS,
            storage=api.StorageType.FILE,
            num_replicas=self.replicas,
            allow_direct=True,
            metadata={META_CLUSTER: self.cluster_id, META_TOPIC: topic},
        )

        async def create():
            try:
                await self._js._jsm.add_stream(config)
                return True
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code == 10058:  # stream name already in use: a concurrent creator won the race
                    return False
                raise

        try:
            self.run(create(), f"creating topic '{topic}'")
        except MessagingError as exc:
            raise TopicError(f"cannot create topic '{topic}' as JetStream stream '{config.name}' on {self.address}: {exc}") from None
        info = self.ensure_topic(topic, partitions)
        log.info("topic %s has %d partitions", topic, info.partitions)
        return info

    def delete_topic(self, topic: str) -> None:
        async def delete():
            try:
                await self._js._jsm.delete_stream(self.stream_name(topic))
            except nats.js.errors.NotFoundError:
                pass

        if self._stream(topic) is not None:
            self.run(delete(), f"deleting topic '{topic}'")

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Per partition: its last event's sequence + 1, or 0 while it holds none."""
        info = self.require_topic(topic)
        stream = self.stream_name(topic)

        async def last(partition: int) -> int:
            try:
                message = await self._js._jsm.get_last_msg(stream, self.subject(topic, partition))
                return message.seq + 1
            except nats.js.errors.NotFoundError:
                return 0

        async def ends():
            return await asyncio.gather(*(last(p) for p in range(info.partitions)))

        return dict(enumerate(self.run(ends(), f"reading the end offsets of '{topic}'")))

    def first_offset(self, topic: str) -> int:
        """The sequence of the oldest event the topic's stream retains (where EARLIEST starts)."""
        found = self._stream(topic)
        if found is None:
            self.require_topic(topic)  # raises: no such topic
            return 1
        return max(found.state.first_seq, 1)

    # -- publishing and reading -------------------------------------------------------------------

    def raw_publisher(self) -> NatsRawPublisher:
        return NatsRawPublisher(self)

    def reader(self, topic: str, assignments: Mapping[int, int], codec: Codec) -> NatsReader:
        resolved = self.resolve(topic, assignments)
        if any(offset == EARLIEST for offset in resolved.values()):
            first = self.first_offset(topic)
            resolved = {p: first if o == EARLIEST else o for p, o in resolved.items()}
        return NatsReader(self, topic, resolved, codec)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class NatsRawPublisher(RawPublisherBase):
    """Publishes ready-encoded messages to any topic and partition, with JetStream acknowledgements.

    Batched: produce() queues protocol frames, each with its own reply subject; every CHUNK of them
    (or serve()/flush()) goes to the server in one write, and the acknowledgements are taken off the
    reply subscription in bulk as they come; flush() waits until every one is in."""

    def __init__(self, transport: NatsTransport):
        self.transport = transport
        transport.connect()
        assert transport._loop is not None and transport._nc is not None  # connected just above
        self._loop: _EventLoop = transport._loop
        self._nc = transport._nc
        self._buffer: list[bytes] = []  # protocol frames not yet handed to the event loop
        self._pending: dict[str, str] = {}  # reply subject -> message subject, until acknowledged
        self._failures: list[str] = []
        self._topics: set[str] = set()
        self._acked = threading.Condition()
        self._waiting = False  # a caller waits in _wait(): wake it on acknowledgements
        self._producing = threading.Lock()  # the buffer, counter and topics, between calling threads
        self._inbox = self._nc.new_inbox() + "."
        self._counter = 0
        self._queue: asyncio.Queue = asyncio.Queue()  # bound to the transport's loop on first use there
        self._stopped = False
        self.transport.run(self._start(), "subscribing to publish acknowledgements")
        transport._publishers.add(self)

    async def _start(self) -> None:
        self._subscription = await self._nc.subscribe(self._inbox + "*", pending_msgs_limit=4 * MAX_IN_FLIGHT)
        loop = asyncio.get_running_loop()
        self._tasks = (loop.create_task(self._send()), loop.create_task(self._take_acks()))

    async def _send(self) -> None:
        """Write the handed-over chunks in order (one task, so a partition keeps its order)."""
        nc = self._nc
        while True:
            chunk = await self._queue.get()
            if chunk is None:
                return
            frames, replies = chunk
            if nc.is_closed:
                self._settle([(reply, f"{self._pending.get(reply)}: the connection is closed") for reply in replies])
                continue
            await nc._send_command(b"".join(frames))  # what nc.publish() does for one frame, for a chunk
            if nc._flush_queue is not None and nc._flush_queue.empty():
                await nc._flush_pending()

    async def _take_acks(self) -> None:
        """Settle acknowledgements as they arrive, all those waiting at once."""
        queue = self._subscription._pending_queue
        while True:
            acks = [await queue.get()]
            while not queue.empty():
                acks.append(queue.get_nowait())
            self._subscription._pending_size -= sum(len(msg.data) for msg in acks)  # nats-py's bookkeeping, as next_msg() does it
            self._settle([(msg.subject, self._failure(msg)) for msg in acks])

    def _failure(self, msg) -> str | None:
        """Why JetStream refused a message (None: stored)."""
        failure = None
        if msg.headers and msg.headers.get("Status") == "503":
            failure = "no stream takes this subject (the topic or partition does not exist)"
        elif b'"error"' in msg.data[:16]:
            try:
                failure = json.loads(msg.data)["error"].get("description", msg.data.decode(errors="replace"))
            except (ValueError, KeyError, AttributeError):
                failure = msg.data.decode(errors="replace")
        return f"{self._pending.get(msg.subject)}: {failure}" if failure else None

    def _settle(self, outcomes: list[tuple[str, str | None]]) -> None:
        pending = self._pending
        for reply, failure in outcomes:
            if pending.pop(reply, None) is not None and failure:  # (None: acknowledged after flush() gave up on it)
                self._failures.append(failure)
        if self._waiting:
            with self._acked:
                self._acked.notify_all()

    @property
    def max_message_bytes(self) -> int:
        """The largest message the server takes (its max_payload, headers included)."""
        return int(self._nc.max_payload)

    def too_large(self, size: int, topic: str) -> MessageTooLarge:
        """The error for a message of `size` bytes over the server's limit."""
        return MessageTooLarge(
            size, self.max_message_bytes, topic, "a NATS message (the server's max_payload)", "raise max_payload in the NATS server's configuration"
        )

    def produce(self, topic: str, value: bytes, key: bytes | None, partition: int, timestamp: int | None, headers: list | None = None) -> None:
        """Queue one message (timestamp in ms; None: the server's time). Safe to call from several threads."""
        subject = self.transport.subject(topic, partition)
        block = header_block(key, timestamp, headers)
        if len(value) + len(block) > self._nc.max_payload:  # the server would close the connection on it, failing every message in flight
            raise self.too_large(len(value) + len(block), topic)
        with self._producing:
            self._topics.add(topic)
            self._counter += 1
            reply = f"{self._inbox}{self._counter}"
            self._pending[reply] = subject
            self._buffer.append(publish_frame(subject, reply, value, block))
            full = len(self._buffer) >= CHUNK
            if full:
                self._hand_over()
        if full and len(self._pending) >= MAX_IN_FLIGHT:
            self._wait(lambda: len(self._pending) < MAX_IN_FLIGHT, self.transport.timeout * 3)

    def _hand_over(self) -> None:
        """Give the buffered frames, and their reply subjects, to the sender task (under self._producing)."""
        frames, self._buffer = self._buffer, []
        replies = [f"{self._inbox}{n}" for n in range(self._counter - len(frames) + 1, self._counter + 1)]
        self._loop.loop.call_soon_threadsafe(self._queue.put_nowait, (frames, replies))

    def _wait(self, condition, timeout: float) -> None:
        with self._acked:
            self._waiting = True
            try:
                if self._acked.wait_for(condition, timeout):
                    return
            finally:
                self._waiting = False
        waiting = len(self._pending)
        self._pending.clear()
        topics = ", ".join(f"'{t}'" for t in sorted(self._topics))
        raise BrokerUnavailable(
            f"{counted(waiting, 'event')} for topic {topics} not acknowledged within {timeout:.0f}s by {self.transport.address}; is the NATS server running?"
        )

    def serve(self) -> None:
        """Send what is buffered now, without waiting for acknowledgements (a caller publishing a few
        events at a time must not wait for a chunk to fill)."""
        with self._producing:
            if self._buffer:
                self._hand_over()

    def flush(self, timeout: float = 30.0) -> None:
        """Wait for every queued message's acknowledgement; raise on any failure."""
        self.serve()
        self._wait(lambda: not self._pending, timeout)
        failures, self._failures = self._failures, []
        if failures:
            topics = ", ".join(f"'{t}'" for t in sorted(self._topics))
            raise MessagingError(f"{counted(len(failures), 'event')} could not be published to {topics} on {self.transport.address}: {failures[0]}")

    def close(self) -> None:
        """Flush, then stop the sender and the acknowledgement subscription."""
        try:
            self.flush()
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop the sender and the acknowledgement subscription without waiting for anything queued (once)."""
        loop, queue = self._loop, self._queue
        if self._stopped:
            return
        self._stopped = True

        async def stop():
            queue.put_nowait(None)
            sender, acks = self._tasks
            await sender
            acks.cancel()
            await self._subscription.unsubscribe()

        try:
            loop.run(stop(), 5)
        except Exception:  # the connection may be closed already
            pass


class NatsReader(Reader):
    """Reads an explicit set of partitions from explicit offsets, one ordered JetStream consumer per partition."""

    def __init__(self, transport: NatsTransport, topic: str, assignments: Mapping[int, int], codec: Codec):
        self.transport = transport
        self.topic = topic
        self.codec = codec
        self._positions = dict(assignments)
        self._next = dict(assignments)  # loop thread: the next sequence to accept per partition
        self._buffer: collections.deque = collections.deque()
        self._arrived = threading.Condition()
        self._closed = False
        self._subscriptions = transport.run(self._subscribe(), f"reading '{topic}'")

    async def _subscribe(self) -> list:
        js, stream = self.transport._js, self.transport.stream_name(self.topic)
        subscriptions = []
        for partition, start in self._positions.items():
            subject = self.transport.subject(self.topic, partition)
            if start >= 1:
                config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start, filter_subject=subject)
            else:
                config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL, filter_subject=subject)
            subscriptions.append(
                await js.subscribe(subject, stream=stream, cb=self._receiver(partition), ordered_consumer=True, config=config, idle_heartbeat=2.0)
            )
        return subscriptions

    def _receiver(self, partition: int):
        async def receive(msg) -> None:
            sequence, stored = _sequence_and_time(msg.reply)
            if sequence < self._next[partition]:
                return  # already delivered (a consumer that restarted after a gap)
            self._next[partition] = sequence + 1
            while len(self._buffer) >= MAX_BUFFERED and not self._closed:
                await asyncio.sleep(0.005)  # the caller is behind: hold this subscription (flow control stops the server)
            self._buffer.append((partition, sequence, stored, msg.data, msg.headers))
            with self._arrived:
                self._arrived.notify()

        return receive

    def positions(self) -> dict[int, int]:
        return dict(self._positions)

    def poll(self, max_events: int = 10_000, timeout: float = 1.0) -> Batch:
        if not self._buffer:
            started = time.monotonic()
            with self._arrived:
                self._arrived.wait_for(lambda: self._buffer, timeout)
            self.waited_s += time.monotonic() - started
        batch = Batch()
        buffer = self._buffer
        for _ in range(min(max_events, len(buffer))):
            partition, sequence, stored, data, nats_headers = buffer.popleft()
            key, stamp, headers = parse_headers(nats_headers)
            stamp = stamp if stamp is not None else stored // 1_000_000
            try:
                rows = self.codec.decode(data)
            except EventDecodeError as exc:
                batch.rejects.append(Reject(partition, sequence, stamp, data, str(exc)))
            else:
                batch.events.extend(Event(partition, sequence, stamp, row, key, headers) for row in rows)
            self._positions[partition] = sequence + 1
        batch.positions = dict(self._positions)
        return batch

    def close(self) -> None:
        self._closed = True
        subscriptions, self._subscriptions = self._subscriptions, []

        async def stop():
            jsm = self.transport._js._jsm
            for subscription in subscriptions:
                consumer = subscription._consumer
                await subscription.unsubscribe()
                try:
                    await jsm.delete_consumer(subscription._stream, consumer)
                except Exception:  # an ephemeral consumer goes away by itself soon after anyway
                    pass

        if subscriptions and self.transport._loop is not None:
            try:
                self.transport._loop.run(stop(), 5)
            except Exception:  # closing: the server may be gone already
                pass
