"""A receiver partial app run continuously: HTTP requests in -> engine -> entry topics, acknowledged when durable.

A user `@source(type='http', receiver.url=...)` always becomes a receiver (passthrough) group
(`topology.flows`); its instances run here instead of `InstanceLoop`. An aiohttp server (its own
event loop, in a thread) takes each request:

    401  basic.auth.enabled and no valid `Authorization: Basic` for a user of deployment.yaml
    400  the body does not decode with the source's @map; the reason is the answer's text
    200  only once the request's events are in the instance's output topics (the broker acknowledged)
    503  publishing failed; the client should retry

In continuous mode a receiver runs as a Spark task like any instance; in micro-batch mode (a
query cannot listen) the worker's driver hosts it on a thread (`HostedReceiver`), as
bench/http.py does. The loop thread takes whatever requests are waiting (one turn), runs them through
`InstanceRuntime` (one engine send per request), produces and flushes the outputs, then answers
every request of the turn: many concurrent requests share one flush, so the endpoint keeps up
with the broker. Each request gets an origin `<instance>@http|<sequence>` with a sequence that
grows across restarts (microseconds of the wall clock), so the next group never mistakes a new
request for a replay.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from sp_dagster.errors import EventDecodeError
from sp_dagster.messaging.maps import mapper_for
from sp_dagster.messaging.transport import Transport
from sp_dagster.worker.instance_plan import InstancePlan
from sp_dagster.worker.instance_runtime import InstanceRuntime, Message, encode_origin
from sp_dagster.worker.sinks import HTTP_PREFIX
from sp_dagster.worker.spark_types import ORIGIN_HEADER

log = logging.getLogger(__name__)


@dataclass
class _Request:
    stream: str
    body: bytes
    future: asyncio.Future
    received: float


def receiver_urls(plan: InstancePlan) -> tuple[str, ...]:
    """The URLs an instance receives events at."""
    return tuple(i.url for i in plan.http_inputs)


class ReceiverLoop:
    """Runs one receiver instance until stopped (see the module docstring)."""

    def __init__(self, plan: InstancePlan, transport: Transport, settings, *, control, users=()):
        self.plan = plan
        self.transport = transport
        self.settings = settings
        self.control = control
        self.users = dict(users or {})  # username -> password
        self.runtime = InstanceRuntime(plan, settings.dead_letter_topic, now=_now_ms())
        self.codecs = {i.stream: mapper_for(i.mapping, i.attributes) for i in plan.http_inputs}
        self.requests: queue.Queue[_Request] = queue.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runners: list = []
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._sequence = 0
        self.accepted = self.refused = 0
        self.publisher = None

    # -- the HTTP side (the server's event loop) -------------------------------------------------

    def _serve(self) -> None:
        from aiohttp import web

        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        try:
            sites: dict[tuple[str, int], web.Application] = {}
            for source in self.plan.http_inputs:
                parts = urlsplit(source.url)
                app = sites.setdefault((parts.hostname, parts.port or 80), web.Application(client_max_size=16 * 1024 * 1024))
                app.router.add_route("POST", parts.path or "/", self._handler(source))
            for (host, port), app in sites.items():
                runner = web.AppRunner(app, access_log=None)
                self._loop.run_until_complete(runner.setup())
                self._loop.run_until_complete(web.TCPSite(runner, host, port, reuse_address=True).start())
                self._runners.append(runner)
        except BaseException as exc:  # a port taken: the instance fails and the worker reports it
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        for runner in self._runners:
            self._loop.run_until_complete(runner.cleanup())
        self._loop.close()

    def _handler(self, source):
        from aiohttp import web

        codec = self.codecs[source.stream]

        async def handle(request: web.Request) -> web.Response:
            if source.basic_auth and not self._authorized(request.headers.get("Authorization")):
                self.refused += 1
                return web.Response(status=401, text="valid basic authentication is required", headers={"WWW-Authenticate": 'Basic realm="sp-dagster"'})
            body = await request.read()
            try:
                codec.decode(body)
            except EventDecodeError as exc:
                self.refused += 1
                return web.Response(status=400, text=f"the event does not decode with @map(type='{source.mapping.type}'): {exc}")
            future = asyncio.get_running_loop().create_future()
            self.requests.put(_Request(source.stream, body, future, time.monotonic()))
            error = await future
            if error:
                return web.Response(status=503, text=f"the event could not be stored: {error}; retry")
            self.accepted += 1
            return web.Response(status=200, text="OK")

        return handle

    def _authorized(self, header: str | None) -> bool:
        if not header or not header.lower().startswith("basic "):
            return False
        try:
            user, _colon, password = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        expected = self.users.get(user)
        return expected is not None and hmac.compare_digest(expected.encode(), password.encode())

    # -- the loop thread -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the HTTP server (once); raise when it cannot listen."""
        if self.publisher is not None:
            return
        self._thread = threading.Thread(target=self._serve, name=f"http-receiver-{self.plan.name}", daemon=True)
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            raise self._error
        self.publisher = self.transport.raw_publisher()
        log.info("%s: receiving at %s", self.plan.name, ", ".join(receiver_urls(self.plan)))

    def run(self) -> str:
        """Serve until told to stop (or the lease runs out); returns why it stopped."""
        self.start()
        last_metrics = time.monotonic()
        try:
            while True:
                if any(command[0] == "stop" for command in self.control.commands()):
                    return "stopped"
                if not self.control.lease_ok():
                    log.warning("%s: the worker's lease on this instance ran out: stopping", self.plan.name)
                    return "lease lost"
                self.turn(self.settings.idle_wait_s)
                if time.monotonic() - last_metrics >= self.settings.metrics_interval_s:
                    self.control.metrics(self.metrics())
                    last_metrics = time.monotonic()
        finally:
            self.close()

    def turn(self, wait: float) -> int:
        """Take the waiting requests, publish their events, answer them; returns how many."""
        try:
            batch = [self.requests.get(timeout=wait)]
        except queue.Empty:
            return 0
        while len(batch) < self.settings.max_events:
            try:
                batch.append(self.requests.get_nowait())
            except queue.Empty:
                break
        now = _now_ms()
        messages = []
        for request in batch:
            self._sequence = max(self._sequence + 1, time.time_ns() // 1000)
            origin = encode_origin(f"{self.plan.name}@http", (self._sequence,))
            messages.append(Message(f"{HTTP_PREFIX}{request.stream}", 0, self._sequence, now, None, request.body, origin))
        error = None
        try:
            out = self.runtime.process(messages, now)
            for message in out:
                headers = [(ORIGIN_HEADER, message.origin)] if message.origin else None
                self.publisher.produce(message.topic, message.value, message.key, message.partition, message.timestamp, headers)
            self.publisher.flush(self.settings.flush_timeout_s)
        except Exception as exc:  # the broker is away: the clients retry
            log.warning("%s: publishing %d request(s) failed: %s", self.plan.name, len(batch), exc)
            error = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
        for request in batch:
            self._loop.call_soon_threadsafe(_answer, request.future, error)
        return len(batch)

    def metrics(self) -> dict:
        """Requests accepted and refused, and where the instance listens."""
        return {
            "mode": "receiver",
            "receiver_urls": list(receiver_urls(self.plan)),
            "accepted_total": self.accepted,
            "refused_total": self.refused,
            "rows_in_total": self.runtime.rows_in,
            "rows_out_total": self.runtime.rows_out,
            "delivery": "at-least-once",
        }

    def close(self) -> None:
        """Stop the server, answer what is left with 503, release the publisher and the engine."""
        if self._loop is not None and self._loop.is_running():
            while not self.requests.empty():
                self._loop.call_soon_threadsafe(_answer, self.requests.get_nowait().future, "the receiver is stopping")
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None
        self.runtime.close()


class LocalControl:
    """The control of a receiver hosted in this process: stop commands in, its newest metrics kept, a lease from a callable."""

    def __init__(self, lease_remaining: Callable[[], float] = lambda: 30.0):
        self.queue: list[tuple] = []
        self.newest: dict = {}
        self._lease = lease_remaining

    def commands(self) -> list[tuple]:
        """The commands given since the last call."""
        queue, self.queue = self.queue, []
        return queue

    def lease_ok(self) -> bool:
        """True while the node may run its instances."""
        return self._lease() > 0

    def metrics(self, values: dict) -> None:
        """Keep the loop's newest metrics."""
        self.newest = values


class HostedReceiver:
    """A receiver instance on a thread of this process, with the handle a worker keeps of an instance."""

    mode = "receiver"

    def __init__(self, plan: InstancePlan, transport: Transport, settings, *, users=(), lease_remaining=lambda: 30.0, own_transport: bool = False):
        self.control = LocalControl(lease_remaining)
        self.loop = ReceiverLoop(plan, transport, settings, control=self.control, users=users)
        self.transport = transport if own_transport else None
        self.reason: str | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"receiver-{plan.name}", daemon=True)

    def start(self) -> HostedReceiver:
        """Start serving; raise when the receiver cannot listen."""
        try:
            self.loop.start()
        except BaseException:
            self.loop.close()
            if self.transport is not None:
                self.transport.close()
            raise
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self.reason = self.loop.run()
        except Exception as exc:
            self.error = f"{exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            log.error("%s: the receiver failed: %s", self.loop.plan.name, self.error)
        finally:
            if self.transport is not None:
                self.transport.close()

    @property
    def active(self) -> bool:
        """True while the receiver serves."""
        return self._thread.is_alive()

    @property
    def ready(self) -> bool:
        """True once the receiver's loop has opened its outputs (its first metrics came)."""
        return bool(self.control.newest)

    def failure(self) -> str:
        """Why the receiver stopped."""
        return self.error or self.reason or "the receiver stopped"

    def metrics(self) -> dict:
        """The receiver's newest metrics."""
        return dict(self.control.newest)

    def stop(self, *, save: bool = True, timeout: float = 30.0) -> None:
        """Stop serving (a receiver keeps no state: `save` changes nothing)."""
        self.control.queue.append(("stop", save))
        self._thread.join(timeout)


def _answer(future: asyncio.Future, error: str | None) -> None:
    if not future.done():
        future.set_result(error)


def _now_ms() -> int:
    return int(time.time() * 1000)
