"""Whether this worker reaches the messaging layer, probed on a thread of its own and told in its
heartbeats: once probes have failed for the worker's fence window, it says `broker: unreachable`, and
the leader places its instances on workers that reach the broker, if any does
(docs/concepts/workers.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

REACHABLE, UNREACHABLE = "reachable", "unreachable"


class BrokerWatch:
    """Probes the messaging layer every `interval_s()` seconds (each probe bounded by it)."""

    def __init__(self, messaging, node_id: str, interval_s: Callable[[], float], window_s: Callable[[], float], clock=time.monotonic):
        self.messaging = messaging
        self.node_id = node_id
        self.interval_s = interval_s
        self.window_s = window_s
        self.clock = clock
        self.last_ok = clock()  # trusted until probed for a whole window (counted again from start())
        self.said = REACHABLE
        self.stop_event = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-watch", daemon=True)

    @property
    def state(self) -> str:
        """`reachable`, or `unreachable` once no probe has answered for the fence window."""
        return REACHABLE if self.clock() - self.last_ok < self.window_s() else UNREACHABLE

    def start(self) -> BrokerWatch:
        """Start probing; the fence window counts from now (starting Spark before this can take longer than it)."""
        self.last_ok = self.clock()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop probing (the probe under way ends within its bound)."""
        self.stop_event.set()

    def probe_once(self, transport) -> None:
        """One probe: a metadata request, bounded by the probe interval."""
        try:
            transport.list_topics()
        except Exception as exc:  # noqa: BLE001 - any failure to answer counts the same
            log.debug("worker %s: broker probe failed: %s", self.node_id, exc)
        else:
            self.last_ok = self.clock()
        now = self.state
        if now != self.said:
            self.said = now
            if now == UNREACHABLE:
                log.warning(
                    "worker %s: the messaging layer (%s) has not answered for %.0f s: its instances go to workers that reach it, if any does",
                    self.node_id,
                    self.messaging.bootstrap_servers,
                    self.window_s(),
                )
            else:
                log.info("worker %s: the messaging layer answers again", self.node_id)

    def _run(self) -> None:
        from sp_dagster.messaging import transport_for

        transport = None
        try:
            while not self.stop_event.is_set():
                started = self.clock()
                if transport is None:
                    try:
                        transport = transport_for(self.messaging, timeout=self.interval_s())
                    except Exception as exc:  # noqa: BLE001 - a client that cannot be made now may be later
                        log.debug("worker %s: no broker client for the probe: %s", self.node_id, exc)
                if transport is not None:
                    self.probe_once(transport)
                self.stop_event.wait(max(0.0, self.interval_s() - (self.clock() - started)))
        finally:
            if transport is not None:
                transport.close()
