"""length(n) and lengthBatch(n[, stream.current.event]) windows."""

from __future__ import annotations

from collections import deque

from sp_dagster.engine.events import EXPIRED, RESET, StreamEvent
from sp_dagster.engine.windows.base import BatchWindow, WindowProcessor, dump_events, load_events


class LengthWindow(WindowProcessor):
    """Keeps the last n events; each arrival beyond n expires the oldest, just before it."""

    name = "length"

    def configure(self):
        self.arity(1)
        self.length = self.constant(0, ("int",), "window.length")
        self.count = 0
        self.queue: deque = deque()

    def process(self, chunk):
        if self.pending is not None:
            self.pending.settle(self)
        now = self.clock.now()
        out = []
        for event in chunk:
            clone = StreamEvent(event.timestamp, event.data, EXPIRED)
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
        self.settle()
        return self.queue

    def dump(self):
        self.settle()
        return [self.count, dump_events(self.queue)]

    def load(self, state):
        self.pending = None
        self.count, events = state
        self.queue = deque(load_events(events))


class LengthBatchWindow(BatchWindow):
    """Collects n events and emits them together (expiring the previous batch first)."""

    name = "lengthBatch"

    def configure(self):
        self.arity(1, 2)
        self.length = self.constant(0, ("int",), "window.length")
        self.stream_current = self.constant(1, ("bool",), "stream.current.event") if len(self.params) > 1 else False
        self.count = 0
        self.start_batches()

    def process(self, chunk):
        if self.pending is not None:
            self.pending.settle(self)
        now = self.clock.now()
        chunks, out = [], []
        for event in chunk:
            if self.length == 0:
                out.append(event)
                if self.expects_expired:
                    out.append(event.copy(EXPIRED, now))
                out.append(event.copy(RESET, now))
            elif self.stream_current:
                self.note(event)
                self.count += 1
                if self.count == self.length + 1:
                    self.flush(out, now)
                    self.count = 1
                out.append(event)
                if self.expired is not None:
                    self.expired.append(event.copy(EXPIRED))
            else:
                self.note(event)
                self.current.append(event.copy())  # pyright: ignore[reportOptionalMemberAccess] # a list unless stream_current
                self.count += 1
                if self.count == self.length:
                    self.flush(out, now)
                    self.count = 0
            if out:
                chunks.append(out)
                out = []
        for part in chunks:
            self.next.process(part)

    def held(self):
        self.settle()
        return super().held()

    def dump(self):
        self.settle()
        return [self.count, self.dump_batches()]

    def load(self, state):
        self.pending = None
        self.count, batches = state
        self.load_batches(batches)


WINDOWS = {"length": LengthWindow, "lengthBatch": LengthBatchWindow}
