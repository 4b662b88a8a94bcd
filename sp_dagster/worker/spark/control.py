"""The line between a worker's driver and the long-running tasks that run its instances: the driver
listens on one authenticated TCP socket (`ControlServer`), each task connects back with its
instance's token (`DriverControl`). A task stops by itself, without a checkpoint, when its lease runs
out or the line breaks: an instance never runs on without a worker that holds it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0


class TaskLink:
    """The driver's end of one task's line: its newest checkpoint, metrics, and whether it finished."""

    def __init__(self, token: str, checkpoint: bytes | None, on_checkpoint: Callable[[bytes], None], *, held: bool = False):
        self.token = token
        self.latest_checkpoint = checkpoint
        self.held = held  # a prepared task: connected and waiting, started only by release()
        self.on_checkpoint = on_checkpoint
        self.metrics: dict = {}
        self.reason: str | None = None
        self.finished = threading.Event()  # the task said it stopped, or its line broke
        self.abandoned = False  # the driver gave the task up: one that connects now is turned away
        self._conn: Connection | None = None
        self._send_lock = threading.Lock()

    @property
    def connected(self) -> bool:
        """True while a task is on the line."""
        return self._conn is not None

    def attach(self, conn: Connection | Any) -> None:
        """A task (or Spark's retry of it) connected: answer with the newest checkpoint and listen."""
        with self._send_lock:
            if self.abandoned:
                log.info("task %s connected after it was given up: turned away", self.token[:8])
                conn.close()  # the task ends at its hello, having done nothing
                return
            old, self._conn = self._conn, conn
            self.finished.clear()
            if not self.held:
                conn.send(("start", self.latest_checkpoint))
        if old is not None:
            old.close()
        threading.Thread(target=self._listen, args=(conn,), name=f"link-{self.token[:8]}", daemon=True).start()

    def _listen(self, conn: Connection) -> None:
        try:
            while True:
                kind, *body = conn.recv()
                if kind == "metrics":
                    self.metrics = body[0]
                elif kind == "checkpoint":
                    self.latest_checkpoint = body[0]
                    self.on_checkpoint(body[0])
                elif kind == "stopped":
                    self.reason = body[0]
                    break
        except (EOFError, OSError):
            self.reason = self.reason or "the task's line broke"
        except Exception as exc:  # a checkpoint that could not be written: the task goes on, the next one may
            log.error("task %s: %s", self.token[:8], exc)
        finally:
            with self._send_lock:
                if self._conn is conn:
                    self._conn = None
            conn.close()
            self.finished.set()

    def release(self, checkpoint: bytes | None) -> None:
        """Start a held task from `checkpoint` (now, or as soon as it connects)."""
        with self._send_lock:
            self.latest_checkpoint, self.held = checkpoint, False
            if self._conn is not None:
                try:
                    self._conn.send(("start", checkpoint))
                except (OSError, ValueError):
                    pass  # its line broke: the listener ends the link, and the instance's failure is reported

    def abandon(self) -> None:
        """Turn away a task that connects from now on (one on the line keeps it)."""
        with self._send_lock:
            self.abandoned = True

    def send(self, message: tuple) -> bool:
        """Send a message to the task; False when no task is on the line."""
        with self._send_lock:
            if self._conn is None:
                return False
            try:
                self._conn.send(message)
                return True
            except (OSError, ValueError):
                return False


class ControlServer:
    """The driver's listener: tasks connect here; leases go out from here.

    One authenticated TCP socket (`multiprocessing.connection`, a random key per worker process); each
    task connects back with its instance's token. Over the line:

        task -> driver   ("hello", token)                  first; the driver answers ("start", checkpoint or None),
                                                           at once, or once released when the task was held
                         ("metrics", {...})                about every second
                         ("checkpoint", bytes)             the newest checkpoint (kept on disk by the driver)
                         ("stopped", reason)               last
        driver -> task   ("lease", seconds)                renewed every half second while the worker's heartbeat holds
                         ("stop", save)                    finish (with a last checkpoint when save)
                         ("checkpoint",)                   checkpoint now
    """

    def __init__(self, advertised_host: str = "127.0.0.1", bind_host: str | None = None, lease: Callable[[], float] = lambda: 30.0):
        self.authkey = os.urandom(16)
        self._listener = Listener((bind_host or advertised_host, 0), authkey=self.authkey)
        self.address: tuple[str, int] = (advertised_host, int(self._listener.address[1]))
        self.lease = lease
        self._links: dict[str, TaskLink] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="control-accept", daemon=True).start()
        threading.Thread(target=self._renew, name="control-leases", daemon=True).start()

    def open(self, checkpoint: bytes | None, on_checkpoint: Callable[[bytes], None], *, held: bool = False) -> TaskLink:
        """A line for one task to come, with the checkpoint it starts from (held: from the one release() gives)."""
        link = TaskLink(uuid.uuid4().hex, checkpoint, on_checkpoint, held=held)
        with self._lock:
            self._links[link.token] = link
        return link

    def forget(self, link: TaskLink) -> None:
        """The task is over, or given up: refuse it from now on (a task already on the line keeps it)."""
        with self._lock:
            self._links.pop(link.token, None)
        link.abandon()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn = self._listener.accept()
            except OSError:
                if self._closed.is_set():
                    return
                continue
            except Exception as exc:  # a client with the wrong key
                log.warning("control line: refused a connection: %s", exc)
                continue
            try:
                if not conn.poll(HELLO_TIMEOUT_S):
                    raise ValueError("no hello")
                kind, token = conn.recv()
                with self._lock:
                    link = self._links.get(token) if kind == "hello" else None
                if link is None:
                    raise ValueError("unknown task")
                conn.send(("lease", self.lease()))
                link.attach(conn)
            except Exception as exc:
                log.warning("control line: dropped a task connection: %s", exc)
                conn.close()

    def _renew(self) -> None:
        while not self._closed.wait(0.5):
            seconds = self.lease()
            with self._lock:
                links = list(self._links.values())
            for link in links:
                link.send(("lease", seconds))

    def close(self) -> None:
        """Stop listening (tasks still on the line lose it and stop)."""
        self._closed.set()
        self._listener.close()


class DriverControl:
    """A task's end of the line (the `Control` an InstanceLoop talks to)."""

    def __init__(self, address: tuple[str, int], authkey: bytes, token: str):
        self._conn = Client(address, authkey=authkey)
        self._conn.send(("hello", token))
        self._deadline = time.monotonic()
        self._pending: list[tuple] = []
        self.lost = False
        self.start_checkpoint: bytes | None = None
        self.stopped_before_start = False  # a held task given up: it ends having opened nothing
        while True:  # the driver answers with a lease and the checkpoint to start from
            kind, *body = self._conn.recv()
            if kind == "lease":
                self._deadline = time.monotonic() + body[0]
            elif kind == "start":
                self.start_checkpoint = body[0]
                break
            elif kind == "stop":
                self.stopped_before_start = True
                break

    def _drain(self) -> None:
        if self.lost:
            return
        try:
            while self._conn.poll(0):
                message = self._conn.recv()
                if message[0] == "lease":
                    self._deadline = time.monotonic() + message[1]
                else:
                    self._pending.append(message)
        except (EOFError, OSError):
            self.lost = True

    def commands(self) -> list[tuple]:
        """Commands received since the last call."""
        self._drain()
        pending, self._pending = self._pending, []
        return pending

    def lease_left(self) -> float:
        """Seconds the lease still runs (0 once it ran out or the driver is gone)."""
        self._drain()
        return 0.0 if self.lost else max(0.0, self._deadline - time.monotonic())

    def lease_ok(self) -> bool:
        """False once the lease ran out or the driver is gone."""
        self._drain()
        return not self.lost and time.monotonic() < self._deadline

    def _send(self, message: tuple) -> None:
        if self.lost:
            return
        try:
            self._conn.send(message)
        except (OSError, ValueError):
            self.lost = True

    def checkpoint(self, data: bytes) -> None:
        """Send the newest checkpoint to the driver."""
        self._send(("checkpoint", data))

    def metrics(self, values: dict) -> None:
        """Send current metrics to the driver."""
        self._send(("metrics", values))

    def close(self, reason: str) -> None:
        """Say why the task ends, and hang up."""
        self._send(("stopped", reason))
        self._conn.close()
