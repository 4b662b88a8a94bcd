"""length(n) and lengthBatch(n[, stream.current.event]) windows."""

from __future__ import annotations

from collections import deque

from sp_dagster.engine.events import CURRENT, EXPIRED, RESET
from sp_dagster.engine.windows.base import WindowProcessor, dump_events, load_events


class LengthWindow(WindowProcessor):
    """Keeps the last n events; each arrival beyond n expires the oldest, just before it."""

    name = "length"

    def configure(self):
        self.arity(1)
        self.length = self.constant(0, ("int",), "window.length")
        self.count = 0
        self.queue: deque = deque()

    def process(self, chunk):
        now = self.clock.now()
        out = []
        for event in chunk:
            clone = event.copy(EXPIRED)
            if self.count < self.length:
                self.count += 1
                self.queue.append(clone)
                out.append(event)
            elif self.queue:
                first = self.queue.popleft()
                first.timestamp = now
                out.append(first)
                out.append(event)
                self.queue.append(clone)
            else:  # length 0: the event expires at once, then the aggregates reset
                out.append(event)
                out.append(clone)
                out.append(event.copy(RESET))
        self.forward(out)

    def held(self):
        return self.queue

    def dump(self):
        return [self.count, dump_events(self.queue)]

    def load(self, state):
        self.count, events = state
        self.queue = deque(load_events(events))


class LengthBatchWindow(WindowProcessor):
    """Collects n events and emits them together (expiring the previous batch first)."""

    name = "lengthBatch"
    mode = "batch"

    def configure(self):
        self.arity(1, 2)
        self.length = self.constant(0, ("int",), "window.length")
        self.stream_current = self.constant(1, ("bool",), "stream.current.event") if len(self.params) > 1 else False
        self.count = 0
        self.current: list | None = None if self.stream_current else []
        self.expired: list | None = [] if self.expects_expired else None
        self.reset = None

    def process(self, chunk):
        now = self.clock.now()
        chunks, out = [], []
        for event in chunk:
            if self.length == 0:
                out.append(event)
                if self.expects_expired:
                    out.append(event.copy(EXPIRED, now))
                out.append(event.copy(RESET, now))
            else:
                if self.reset is None:
                    self.reset = event.copy(RESET)
                if self.stream_current:
                    self._stream_current(event, out, now)
                else:
                    self._full_batch(event, out, now)
            if out:
                chunks.append(out)
                out = []
        for part in chunks:
            self.next.process(part)

    def _flush_expired_and_reset(self, out, now):
        if self.expects_expired and self.expired:
            for expired in self.expired:
                expired.timestamp = now
            out.extend(self.expired)
            self.expired = []
        if self.reset is not None:
            self.reset.timestamp = now
            out.append(self.reset)
            self.reset = None

    def _full_batch(self, event, out, now):
        self.current.append(event.copy())
        self.count += 1
        if self.count == self.length:
            self._flush_expired_and_reset(out, now)
            if self.current:
                if self.expired is not None:
                    self.expired.extend(e.copy(EXPIRED) for e in self.current)
                out.extend(self.current)
                self.current = []
            self.count = 0

    def _stream_current(self, event, out, now):
        self.count += 1
        if self.count == self.length + 1:
            self._flush_expired_and_reset(out, now)
            self.count = 1
        out.append(event)
        if self.expired is not None:
            self.expired.append(event.copy(EXPIRED))

    def held(self):
        return self.expired or ()

    def dump(self):
        return [self.count, dump_events(self.current), dump_events(self.expired), dump_events([self.reset] if self.reset else [])]

    def load(self, state):
        self.count, current, expired, reset = state
        self.current, self.expired = load_events(current), load_events(expired)
        self.reset = load_events(reset)[0] if reset else None


WINDOWS = {"length": LengthWindow, "lengthBatch": LengthBatchWindow}
