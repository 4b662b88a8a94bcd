"""Windows on a timestamp attribute: externalTime and externalTimeBatch."""

from __future__ import annotations

from collections import deque

from sp_dagster.engine.clock import TimerQueue
from sp_dagster.engine.events import CURRENT, EXPIRED, RESET, TIMER
from sp_dagster.engine.values import java_int_rem
from sp_dagster.engine.windows.base import WindowProcessor, dump_events, load_events
from sp_dagster.siddhi import ast


class ExternalTimeWindow(WindowProcessor):
    """A sliding window whose clock is a long attribute of the events."""

    name = "externalTime"

    def configure(self):
        self.arity(2)
        self.timestamp = self.attribute(0, ("long",), "timestamp").row
        self.keep = self.duration(1, "window.time")
        self.queue: deque = deque()

    def process(self, chunk):
        out = []
        for event in chunk:
            now = self.timestamp(event)
            while self.queue and self.timestamp(self.queue[0]) - now + self.keep <= 0:
                expired = self.queue.popleft()
                expired.timestamp = now
                out.append(expired)
            if event.type == CURRENT:
                self.queue.append(event.copy(EXPIRED))
            out.append(event)
        self.forward(out)

    def held(self):
        return self.queue

    def dump(self):
        return dump_events(self.queue)

    def load(self, state):
        self.queue = deque(load_events(state))


class ExternalTimeBatchWindow(WindowProcessor):
    """Batches on a long attribute's time, with an optional start grid and flush timeout."""

    name = "externalTimeBatch"
    mode = "batch"
    uses_timers = True
    timers: TimerQueue  # uses_timers: WindowProcessor made the queue

    def configure(self):
        self.arity(2, 3, 4, 5)
        self.timestamp_executor = self.attribute(0, ("long",), "timestamp")
        self.timestamp = self.timestamp_executor.row
        self.keep = self.duration(1, "window.time")
        self.start_enabled = len(self.params) >= 3
        self.start_time = 0
        self.start_variable = None
        if self.start_enabled:
            start = self.params[2]
            if start.executor.constant:
                self.start_time = self.constant(2, ("int", "long"), "start.time")
            elif start.executor.type == "long":
                self.start_variable = start.executor.row
            else:
                raise self.error("start.time must be an int or long constant or a long attribute", 2)
        self.timeout = self.duration(3, "timeout") if len(self.params) >= 4 else 0
        self.replace_timestamp = self.constant(4, ("bool",), "replace.with.batchend") if len(self.params) == 5 else False
        if self.replace_timestamp:
            node = self.params[0].node
            assert isinstance(node, ast.Variable)  # self.attribute(0, ...) checked it
            index = self.context.schema.index(node.name)
            assert index is not None  # the attribute is the input's
            self.timestamp_index = index
        self.store_expired = self.expects_expired or self.context.findable
        self.current: list = []
        self.expired: list | None = [] if (self.expects_expired or self.timeout > 0 or self.context.findable) else None
        self.reset = None
        self.end_time = -1
        self.last_scheduled = 0
        self.last_event_time = 0
        self.flushed = False

    def process(self, chunk):
        if not chunk:
            return
        chunks: list[list] = []
        self._init_timing(chunk[0])
        for event in chunk:
            if event.type == TIMER:
                if self.last_scheduled <= event.timestamp:
                    if not self.flushed:
                        self._flush(chunks, self.last_event_time, True)
                        self.flushed = True
                    elif self.current:
                        self._append(chunks, self.last_event_time, True)
                    self.last_scheduled = self.clock.now() + self.timeout
                    self.timers.notify_at(self.last_scheduled)
                continue
            if event.type != CURRENT:
                continue
            event_time = self.timestamp(event)
            if self.last_event_time < event_time:
                self.last_event_time = event_time
            if event_time < self.end_time:
                self._add(event)
            else:
                if self.flushed:
                    self._append(chunks, self.last_event_time, False)
                    self.flushed = False
                else:
                    self._flush(chunks, self.last_event_time, False)
                self.end_time = self._end_time(self.last_event_time)
                self._add(event)
                if self.timeout > 0:
                    self.last_scheduled = self.clock.now() + self.timeout
                    self.timers.notify_at(self.last_scheduled)
        for part in chunks:
            self.next.process(part)

    def _end_time(self, now: int) -> int:
        return now + (self.keep - java_int_rem(now - self.start_time, self.keep))

    def _init_timing(self, first):
        if self.end_time >= 0:
            return
        if self.start_enabled:
            if self.start_variable is None:
                self.end_time = self._end_time(self.timestamp(first))
            else:
                self.start_time = self.start_variable(first)
                self.end_time = self.start_time + self.keep
        else:
            self.start_time = self.timestamp(first)
            self.end_time = self.start_time + self.keep
        if self.timeout > 0:
            self.last_scheduled = self.clock.now() + self.timeout
            self.timers.notify_at(self.last_scheduled)

    def _add(self, event):
        clone = event.copy()
        if self.replace_timestamp:
            data = list(clone.data)
            data[self.timestamp_index] = self.end_time
            clone.data = tuple(data)
        self.current.append(clone)
        if self.reset is None:
            self.reset = event.copy(RESET)

    def _flush(self, chunks, now, preserve_current):
        out = []
        if self.expects_expired and self.expired:
            for expired in self.expired:
                expired.timestamp = now
            out.extend(self.expired)
        if self.expired is not None:
            self.expired = []
        if self.current:
            assert self.reset is not None  # set by the batch's first event
            self.reset.timestamp = now
            out.append(self.reset)
            self.reset = None
        self._close_batch(chunks, out, preserve_current)

    def _append(self, chunks, now, preserve_current):
        """After a timeout flush: emit the batch again, with everything it has had since."""
        out = []
        if self.current:
            resent = []
            for expired in self.expired or ():
                if self.expects_expired:
                    out.append(expired.copy(timestamp=now))
                resent.append(expired.copy(CURRENT))
            assert self.reset is not None  # set by the batch's first event
            out.append(self.reset.copy(RESET, now))
            out.extend(resent)
        self._close_batch(chunks, out, preserve_current)

    def _close_batch(self, chunks, out, preserve_current):
        if self.current:
            if preserve_current or self.store_expired:
                assert self.expired is not None  # kept whenever batches are preserved or stored
                self.expired.extend(e.copy(EXPIRED) for e in self.current)
            out.extend(self.current)
        self.current = []
        if out:
            chunks.append(out)

    def held(self):
        return self.expired or ()

    def dump(self):
        return {
            "start": self.start_time,
            "end": self.end_time,
            "scheduled": self.last_scheduled,
            "last": self.last_event_time,
            "current": dump_events(self.current),
            "expired": dump_events(self.expired),
            "reset": dump_events([self.reset] if self.reset else []),
            "flushed": self.flushed,
        }

    def load(self, state):
        self.start_time, self.end_time = state["start"], state["end"]
        self.last_scheduled, self.last_event_time = state["scheduled"], state["last"]
        self.current, self.expired = load_events(state["current"]), load_events(state["expired"])
        reset = state["reset"]
        self.reset = load_events(reset)[0] if reset else None
        self.flushed = state["flushed"]


WINDOWS = {"externalTime": ExternalTimeWindow, "externalTimeBatch": ExternalTimeBatchWindow}
