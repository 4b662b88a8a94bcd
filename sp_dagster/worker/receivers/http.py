"""A receiver partial app run continuously: HTTP requests in -> engine -> entry topics, acknowledged
when durable. A user `@source(type='http', receiver.url=...)` always becomes a receiver
(passthrough) group (`topology.flows`), whose instances run here (`ReceiverLoop`) instead of `InstanceLoop`; requests
are published and answered in groups, one batch in flight at a time (docs/concepts/workers.md).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import contextlib
import hmac
import logging
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from sp_dagster.errors import ConfigError, EventDecodeError
from sp_dagster.messaging.errors import MessageTooLarge
from sp_dagster.messaging.maps import mapper_for
from sp_dagster.messaging.transport import Transport
from sp_dagster.wording import counted
from sp_dagster.worker.instance.batching import batched_outputs, pack
from sp_dagster.worker.instance.plan import InstancePlan
from sp_dagster.worker.instance.runtime import ORIGIN_HEADER, InstanceRuntime
from sp_dagster.worker.instance.sinks import HTTP_PREFIX

log = logging.getLogger(__name__)

MAX_BODY = 16 * 1024 * 1024  # the largest request body a receiver reads


def receiver_urls(plan: InstancePlan) -> tuple[str, ...]:
    """The URLs an instance receives events at."""
    return tuple(i.url for i in plan.http_inputs)


def _event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop for the server: uvloop's when it is installed (it comes with dagster-webserver's uvicorn[standard])."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class ReceiverLoop:
    """Runs one receiver instance until stopped.

    An aiohttp server (its low-level `web.Server`, on an event loop of its own in a thread; uvloop's when
    installed) takes each request and answers:

        401  basic.auth.enabled and no valid `Authorization: Basic` for a user of deployment.yaml
        400  the body does not decode with the source's @map; the reason is the answer's text
        200  only once the request's events are in the instance's output topics (the broker acknowledged)
        413  an event is larger than the messaging layer takes (or the body than MAX_BODY): retrying cannot help
        503  publishing failed (or the receiver is stopping); the client should retry

    Group commit. The handler checks the credentials, decodes the body (once: the engine gets the
    rows) and leaves the request waiting. One batch is in flight at a time: on the server's loop, the
    requests waiting are run through `InstanceRuntime` as one run (the engine's `send_each`, each
    request a send of its own), their outputs are produced in one call, and a helper thread waits
    for the broker's acknowledgement of all of them (`flush`); then every request of the batch is
    answered at once, and the requests that arrived meanwhile make the next batch. So a request
    costs the endpoint its HTTP parsing, a check and a decode; the engine pass, the produce call and
    the broker's round trip are shared by all requests of a batch.

    Each request gets an origin `<instance>@http|<sequence>` with a sequence that grows across
    restarts (microseconds of the wall clock), so the next group never mistakes a new request for a
    replay. In continuous mode a receiver runs as a Spark task like any instance (`run()` serves
    its control: stop commands, the lease, metrics); in micro-batch mode (a query cannot listen) the
    worker's driver hosts it on a thread (`HostedReceiver`), as bench/receiver.py does."""

    def __init__(self, plan: InstancePlan, transport: Transport, settings, *, control, users=(), messaging=None, process_index: int = 0):
        self.plan = plan
        self.transport = transport
        self.settings = settings
        self.control = control
        self.users = dict(users or {})  # username -> password
        # The `Authorization` value each user's client sends (the canonical form): most requests match one.
        self._expected = [f"Basic {base64.b64encode(f'{u}:{p}'.encode()).decode('ascii')}".encode() for u, p in self.users.items()]
        self.runtime = InstanceRuntime(plan, settings.dead_letter_topic, now=_now_ms())
        self._batched = batched_outputs(plan)
        # worker.count: this loop's process and the helpers beside it (receivers/processes.py), each with origins of its own
        self.processes = max((i.workers for i in plan.http_inputs), default=1)
        self.process_index = process_index
        self.origin_key = f"{plan.name}@http{process_index or ''}"
        self.messaging = messaging  # how a helper process reaches the messaging layer
        self._helpers = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runners: list = []
        self._started = threading.Event()
        self._done = threading.Event()  # the server's loop has ended
        self._error: BaseException | None = None
        self._waiting: list[tuple[str, list, asyncio.Future]] = []  # (topic, rows, answer) of the requests for the next batch
        self._arrived = asyncio.Event()  # a request joined _waiting (bound to the server's loop on first use)
        self._committer: asyncio.Task | None = None
        self._closing = False
        self._flusher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"http-flush-{plan.name}")
        self._sequence = 0
        self._alone = 0  # how many of the next batches hold one request only (after an event too large, to find its request)
        self.accepted = self.refused = self.batches = 0
        self.publisher = None

    # -- the HTTP side (the server's event loop) -------------------------------------------------

    def _serve(self) -> None:
        from aiohttp import web

        self._loop = loop = _event_loop()
        asyncio.set_event_loop(loop)
        try:
            routes: dict[tuple[str, str, int], dict] = {}
            for source in self.plan.http_inputs:
                parts = urlsplit(source.url)
                secure = source.secure
                place = ("https" if secure else "http", parts.hostname or "127.0.0.1", parts.port or (443 if secure else 80))
                routes.setdefault(place, {})[parts.path or "/"] = self._handler(source)
            for (scheme, host, port), paths in routes.items():
                runner = loop.run_until_complete(self._runner(paths))
                loop.run_until_complete(runner.setup())
                context = self._tls(host, port) if scheme == "https" else None
                site = web.TCPSite(runner, host, port, reuse_address=True, reuse_port=self.processes > 1, ssl_context=context)
                loop.run_until_complete(site.start())
                self._runners.append(runner)
            self._committer = loop.create_task(self._commit())
        except BaseException as exc:  # a port taken: the instance fails and the worker reports it
            self._error = exc
            for runner in self._runners:
                with contextlib.suppress(Exception):
                    loop.run_until_complete(runner.cleanup())
            loop.close()
            self._started.set()
            self._done.set()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._shutdown())
            loop.close()
            self._done.set()

    def _tls(self, host: str, port: int):
        """The TLS context of an https:// receiver (deployment.config.receiverTls); ConfigError without one."""
        from sp_dagster.config.tls import server_context

        if self.settings.receiver_tls is None:
            raise ConfigError(
                f"{self.plan.name}: https://{host}:{port} needs a certificate: set deployment.config.receiverTls (certFile, keyFile) on this node"
            )
        cert, key = self.settings.receiver_tls
        return server_context(cert, key, "deployment.config.receiverTls")

    async def _runner(self, paths: dict):
        """A low-level aiohttp server for one host:port, dispatching POSTs by path (made on the loop)."""
        from aiohttp import web

        loop = asyncio.get_running_loop()

        def request_factory(message, payload, protocol, writer, task):
            return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=MAX_BODY)

        async def dispatch(request: web.BaseRequest) -> web.StreamResponse:
            handle = paths.get(request.path)
            if handle is None:
                return web.Response(status=404, text="no receiver at this path")
            if request.method != "POST":
                return web.Response(status=405, text="POST events here", headers={"Allow": "POST"})
            return await handle(request)

        return web.ServerRunner(web.Server(dispatch, request_factory=request_factory), access_log=None)

    def _handler(self, source):
        from aiohttp import web

        codec = mapper_for(source.mapping, source.attributes)
        topic = f"{HTTP_PREFIX}{source.stream}"
        refusal = f"the event does not decode with @map(type='{source.mapping.type}'): "

        async def handle(request: web.BaseRequest) -> web.Response:
            if source.basic_auth and not self._authorized(request.headers.get("Authorization")):
                self.refused += 1
                return web.Response(status=401, text="valid basic authentication is required", headers={"WWW-Authenticate": 'Basic realm="sp-dagster"'})
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                self.refused += 1
                return web.Response(status=413, text=f"the body is over the receiver's limit of {MAX_BODY} bytes; send fewer events per request")
            try:
                rows = codec.decode(body)
            except EventDecodeError as exc:
                self.refused += 1
                return web.Response(status=400, text=f"{refusal}{exc}")
            if self._closing:
                return web.Response(status=503, text="the receiver is stopping; retry")
            answer = asyncio.get_running_loop().create_future()
            self._waiting.append((topic, rows, answer))
            self._arrived.set()
            error = await answer
            if isinstance(error, MessageTooLarge):
                self.refused += 1
                return web.Response(status=413, text=f"the request can never be stored: {error}")
            if error:
                return web.Response(status=503, text=f"the event could not be stored: {error}; retry")
            self.accepted += 1
            return web.Response(status=200, text="OK")

        return handle

    def _authorized(self, header: str | None) -> bool:
        if not header:
            return False
        sent = header.encode("utf-8", "surrogateescape")
        if any(hmac.compare_digest(sent, expected) for expected in self._expected):
            return True
        if not header[:6].lower() == "basic ":  # another scheme, or a form of Basic other clients write
            return False
        try:
            user, _colon, password = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        expected = self.users.get(user)
        return expected is not None and hmac.compare_digest(expected.encode(), password.encode())

    async def _commit(self) -> None:
        """The group commit: while requests wait, publish them as one batch and answer them once durable."""
        loop = asyncio.get_running_loop()
        arrived = self._arrived
        while not self._closing:
            await arrived.wait()
            arrived.clear()
            while self._waiting and not self._closing:
                batch = self._take()
                error, publisher = None, self.publisher
                assert publisher is not None
                try:
                    self._publish(batch, publisher)
                    await loop.run_in_executor(self._flusher, publisher.flush, self.settings.flush_timeout_s)
                except MessageTooLarge as exc:
                    # _publish finds it before queuing any: publish the requests one by one, so only the one at fault is refused
                    if len(batch) > 1:
                        self._waiting[:0] = batch
                        self._alone = len(batch)
                        continue
                    error = exc
                except Exception as exc:  # the broker is away: the clients retry
                    log.warning("%s: publishing %s failed: %s", self.plan.name, counted(len(batch), "request"), exc)
                    error = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
                self.batches += 1
                for _topic, _rows, answer in batch:
                    if not answer.done():
                        answer.set_result(error)

    def _take(self) -> list[tuple[str, list, asyncio.Future]]:
        """The waiting requests, oldest first, up to about `max_events` events (at least one request)."""
        waiting, limit = self._waiting, self.settings.max_events
        if self._alone:
            self._alone -= 1
            limit = 1
        events, count = 0, 0
        for _topic, rows, _answer in waiting:
            events += len(rows)
            count += 1
            if events >= limit:
                break
        batch, self._waiting = waiting[:count], waiting[count:]
        return batch

    def _publish(self, batch: list[tuple[str, list, asyncio.Future]], publisher) -> None:
        """Run a batch's events through the engine (each request one send) and queue the outputs."""
        first = max(self._sequence + 1, time.time_ns() // 1000)
        self._sequence = first + len(batch) - 1
        key = self.origin_key
        out = self.runtime.process_decoded([(topic, rows, key, first + n) for n, (topic, rows, _answer) in enumerate(batch)], _now_ms())
        out = pack(out, self._batched)  # the requests' events in one message per partition
        largest = getattr(publisher, "max_message_bytes", None)  # checked before any is queued, so a batch refused is refused whole
        too_large = [m for m in out if len(m.value) > largest] if largest is not None else []
        if too_large:
            raise publisher.too_large(len(too_large[0].value), too_large[0].topic)
        publisher.produce_all(((m.topic, m.value, m.key, m.partition, m.timestamp, m.origin) for m in out), ORIGIN_HEADER)

    async def _shutdown(self) -> None:
        """Stop taking requests, let the batch in flight finish, answer what still waits with 503."""
        self._closing = True
        for runner in self._runners:
            for site in list(runner.sites):
                with contextlib.suppress(Exception):
                    await site.stop()
        waiting, self._waiting = self._waiting, []
        for _topic, _rows, answer in waiting:
            if not answer.done():
                answer.set_result("the receiver is stopping")
        committer = self._committer
        if committer is not None:
            self._arrived.set()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(committer, self.settings.flush_timeout_s + 5)
        for runner in self._runners:
            with contextlib.suppress(Exception):
                await runner.cleanup()

    # -- the control side (the caller's thread) --------------------------------------------------

    def start(self) -> None:
        """Start the HTTP server (once); raise when it cannot listen."""
        if self.publisher is not None:
            return
        self.publisher = self.transport.raw_publisher()
        self._thread = threading.Thread(target=self._serve, name=f"http-receiver-{self.plan.name}", daemon=True)
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            raise self._error
        if self.processes > 1 and not self.process_index:
            from sp_dagster.worker.receivers.processes import ReceiverProcesses

            self._helpers = ReceiverProcesses(self.plan, self.messaging, self.settings, self.users, self.processes - 1).start()
        if not self.process_index:
            log.info("%s: receiving at %s", self.plan.name, ", ".join(receiver_urls(self.plan)))

    def run(self) -> str:
        """Serve until told to stop (or the lease runs out); returns why it stopped."""
        last_metrics = 0.0
        try:
            self.start()  # inside: a helper process that cannot start must not leave this server listening
            while True:
                if any(command[0] == "stop" for command in self.control.commands()):
                    return "stopped"
                if not self.control.lease_ok():
                    log.warning("%s: the worker's lease on this instance ran out: stopping", self.plan.name)
                    return "lease lost"
                if self._helpers is not None:
                    self._helpers.poll()
                if time.monotonic() - last_metrics >= self.settings.metrics_interval_s:
                    self.control.metrics(self.metrics())
                    last_metrics = time.monotonic()
                if self._done.wait(self.settings.idle_wait_s):
                    raise RuntimeError("the receiver's HTTP server stopped")
        finally:
            self.close()

    @property
    def waiting(self) -> int:
        """How many requests wait for the next batch."""
        return len(self._waiting)

    @property
    def helper_pids(self) -> list[int]:
        """The process ids of the helper processes serving beside this one (worker.count)."""
        return self._helpers.pids if self._helpers is not None else []

    def metrics(self) -> dict:
        """Requests accepted and refused, and where the instance listens (its helper processes' counts included)."""
        counts = {
            "accepted_total": self.accepted,
            "refused_total": self.refused,
            "batches_total": self.batches,
            "rows_in_total": self.runtime.rows_in,
            "rows_out_total": self.runtime.rows_out,
        }
        for helper in self._helpers.newest if self._helpers is not None else ():
            for name in counts:
                counts[name] += helper.get(name, 0)
        return {"mode": "receiver", "receiver_urls": list(receiver_urls(self.plan)), **counts, "processes": self.processes, "delivery": "at-least-once"}

    def close(self) -> None:
        """Stop the server and its helper processes (answering what waits with 503), release the publisher and the engine."""
        if self._helpers is not None:
            self._helpers.stop(self.settings.flush_timeout_s)
            self._helpers = None
        loop = self._loop
        if loop is not None and not self._done.is_set():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(self.settings.flush_timeout_s + 10)
        self._flusher.shutdown(wait=True)
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

    def lease_left(self) -> float:
        """Seconds the node may still run its instances."""
        return self._lease()

    def metrics(self, values: dict) -> None:
        """Keep the loop's newest metrics."""
        self.newest = values


class HostedReceiver:
    """A receiver instance on a thread of this process, with the handle a worker keeps of an instance."""

    mode = "receiver"

    def __init__(
        self, plan: InstancePlan, transport: Transport, settings, *, users=(), lease_remaining=lambda: 30.0, own_transport: bool = False, messaging=None
    ):
        self.control = LocalControl(lease_remaining)
        self.loop = ReceiverLoop(plan, transport, settings, control=self.control, users=users, messaging=messaging)
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


def _now_ms() -> int:
    return int(time.time() * 1000)
