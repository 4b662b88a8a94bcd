"""User sinks beyond Kafka topics (log and HTTP), and the per-event choices of Siddhi's distributed
sinks: which destinations get an event, a kafka sink's message key, and siddhi-io-kafka's sequenced
messages. A turn's HTTP requests are sent before its Kafka outputs are committed or flushed
(`HttpSinks.deliver`), so its input offsets are committed only after its HTTP sends ended.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from sp_dagster.engine.javahash import string_hash
from sp_dagster.errors import EventDecodeError
from sp_dagster.javatext import java_str
from sp_dagster.messaging.errors import StrategyError
from sp_dagster.messaging.strategies import RoundRobin
from sp_dagster.siddhi.secrets import resolve_placeholders
from sp_dagster.siddhi.transports import fill_template
from sp_dagster.wording import counted

log = logging.getLogger(__name__)

HTTP_PREFIX = "http:"
RETRIES = 4  # after the first attempt
RETRY_BACKOFF_S = 0.2  # doubled after each attempt
CONCURRENCY = 32  # requests in flight per sink


def java_hash_destination(value: Any, count: int) -> int:
    """Siddhi's destination for a partition key value: |String.hashCode(str(value)) % count|."""
    h = string_hash(java_str(value) if value is not None else "null")
    signed = h - (1 << 32) if h & 0x80000000 else h
    return abs(signed) % count


def destination_chooser(
    strategy: str, names: Sequence[str], partition_key: str | None, count: int, turn: RoundRobin | None = None
) -> Callable[[Sequence[Any]], Sequence[int]]:
    """A function from a row to the indexes of the destinations it goes to (round robin: in `turn`'s order), per
    @distribution over @destination(...) (partitioned: |String.hashCode(key) % n|, as Siddhi's PartitionedDistribution)."""
    kind = (strategy or "roundRobin").replace("_", "").lower()
    if kind == "partitioned":
        if partition_key is None:
            raise StrategyError("PartitionKey is required for partitioned distribution strategy.")
        index = list(names).index(partition_key)
        return lambda row: (java_hash_destination(row[index], count),)
    if kind in ("broadcast", "all"):
        every = tuple(range(count))
        return lambda row: every
    turn = turn if turn is not None else RoundRobin()
    return lambda row: turn.partitions(row, count)


def message_key(template: str | None, names: Sequence[str], row: Sequence[Any]) -> bytes | None:
    """A kafka sink's `key` option for one row, with {{attr}} templates filled in (None without one)."""
    if template is None:
        return None
    values = dict(zip(names, row))
    return fill_template(template, lambda name: java_str(values.get(name)) if values.get(name) is not None else "null").encode("utf-8")


def sequenced(message):
    """A siddhi-io-kafka `seq.enabled` message (`sequenceId:seqNo~body`) with its header taken off and made its origin."""
    value = message.value or b""
    head, tilde, body = value.partition(b"~")
    sequence_id, colon, number = head.decode("utf-8", "replace").partition(":")
    if not tilde or not colon or not number.strip().isdigit():
        raise EventDecodeError("seq.enabled is on but the message has no 'sequenceId:seqNo~' header")
    origin = f"seq:{sequence_id}|{int(number)}".encode()
    return message._replace(value=body, origin=origin)


def log_sink(instance: str, sink) -> Callable:
    """The engine callback of `@sink(type='log')`: each event logged with its prefix at its priority."""
    level = {"DEBUG": logging.DEBUG, "TRACE": logging.DEBUG, "WARN": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}
    priority = level.get(sink.priority, logging.INFO)
    prefix = sink.prefix if sink.prefix is not None else f"{instance} : {sink.stream}"
    logger = logging.getLogger("sp_dagster.log_sink")

    def write(events) -> None:
        if sink.priority == "OFF":
            return
        for event in events:
            logger.log(priority, "%s : Event{timestamp=%s, data=%s, isExpired=%s}", prefix, event.timestamp, list(event.data), event.is_expired)

    return write


def _password(target, instance: str, stream: str) -> str:
    """A destination's basic-auth password, its placeholders resolved from this node's environment."""
    return resolve_placeholders(target.password, f"{instance}: basic.auth.password of the http sink of {stream}") or ""


class HttpSinks:
    """The HTTP sinks of one instance: queue requests, then send them all (retried) on flush.

    `@sink(type='http')`: POSTs (or PUT/...) with headers and basic auth, retried, then sent to the app's
    dead-letter topic with the reason. The instance loop (and a micro-batch query's engine task) hands
    the messages InstanceRuntime makes to `deliver`, which sends those of the HTTP sinks (topic
    `http:<stream>`, partition = destination index)."""

    def __init__(self, outputs, instance: str):
        self.instance = instance
        self.outputs = {f"{HTTP_PREFIX}{o.stream}": o for o in outputs}
        self._queue: list = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session = None
        self.sent = self.failed = 0
        # Authorization headers per (pseudo-topic, destination), a ${VAR} password resolved here, where the instance runs.
        self._auth = {
            (topic, index): "Basic " + base64.b64encode(f"{t.username}:{_password(t, instance, o.stream)}".encode()).decode("ascii")
            for topic, o in self.outputs.items()
            for index, t in enumerate(o.destinations)
            if t.username is not None
        }

    def owns(self, topic: str) -> bool:
        """True for the pseudo-topics of this instance's HTTP sinks."""
        return topic in self.outputs

    def produce(self, message) -> None:
        """Queue one request (message.partition is the destination index)."""
        self._queue.append(message)

    def deliver(self, out: list, dead_letter_topic: str | None, timeout: float = 60.0) -> list:
        """Send the requests among `out` and wait for them; returns the other messages, and a dead letter per request that failed."""
        rest = []
        for message in out:
            (self.produce if self.owns(message.topic) else rest.append)(message)
        if dead_letter_topic:
            rest += [
                m._replace(topic=dead_letter_topic, partition=0, offset=-1, key=None, value=dead_letter_body(self.instance, m, why), origin=None)
                for m, why in self.flush(timeout)
            ]
        else:
            self.flush(timeout)
        return rest

    def flush(self, timeout: float = 60.0) -> list[tuple[Any, str]]:
        """Send what is queued; return (message, reason) for every request that failed after its retries."""
        if not self._queue:
            return []
        queued, self._queue = self._queue, []
        future = asyncio.run_coroutine_threadsafe(self._send_all(queued), self._started())
        return future.result(timeout)

    def _started(self) -> asyncio.AbstractEventLoop:
        """The client's event loop, started on first use in a thread of its own."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name=f"http-sinks-{self.instance}", daemon=True)
            self._thread.start()
        return self._loop

    async def _send_all(self, messages) -> list[tuple[Any, str]]:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        limit = asyncio.Semaphore(CONCURRENCY)
        results = await asyncio.gather(*(self._send(message, limit) for message in messages))
        failures = [(m, reason) for m, reason in zip(messages, results) if reason is not None]
        self.sent += len(messages) - len(failures)
        self.failed += len(failures)
        return failures

    async def _send(self, message, limit: asyncio.Semaphore) -> str | None:
        output = self.outputs[message.topic]
        target = output.destinations[message.partition]
        headers = dict(target.headers)
        headers.setdefault("Content-Type", output.content_type or _content_type(output.mapping.type))
        if (message.topic, message.partition) in self._auth:
            headers["Authorization"] = self._auth[(message.topic, message.partition)]
        reason, session = None, self._session
        assert session is not None  # made by _send_all before any send
        async with limit:
            for attempt in range(RETRIES + 1):
                try:
                    async with session.request(output.method, target.url, data=message.value, headers=headers) as response:
                        await response.read()
                        if response.status < 300:
                            return None
                        reason = f"{target.url} answered {response.status} {response.reason}"
                        if 400 <= response.status < 500 and response.status not in (408, 429):
                            break  # the endpoint refuses this event: retrying will not help
                except Exception as exc:  # connection refused, reset, timeout
                    reason = f"{target.url}: {exc.__class__.__name__}: {exc}"
                if attempt < RETRIES:
                    await asyncio.sleep(RETRY_BACKOFF_S * (2**attempt))
        log.warning("%s: HTTP sink of %s gave up after %s: %s", self.instance, output.stream, counted(attempt + 1, "attempt"), reason)
        return reason

    def close(self) -> None:
        """Close the client and its event loop."""
        if self._loop is None:
            return
        if self._session is not None:
            asyncio.run_coroutine_threadsafe(self._session.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop.close()
        self._loop = None


def _content_type(kind: str) -> str:
    return {"json": "application/json", "xml": "application/xml", "keyvalue": "application/x-www-form-urlencoded", "csv": "text/csv"}.get(kind, "text/plain")


def dead_letter_body(instance: str, message, reason: str) -> bytes:
    """The dead-letter message of an HTTP send that failed: where it was going, why, and its bytes."""
    body = {
        "instance": instance,
        "sink": message.topic,
        "destination": message.partition,
        "reason": reason,
        "timestamp": message.timestamp,
        "failed_at": int(time.time() * 1000),
        "data_base64": base64.b64encode(message.value or b"").decode("ascii"),
    }
    return json.dumps(body).encode("utf-8")
