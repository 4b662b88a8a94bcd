"""Windows on the engine clock: time, timeBatch, timeLength and delay."""

from __future__ import annotations

from collections import deque

from sp_dagster.engine.events import CURRENT, EXPIRED, RESET
from sp_dagster.engine.values import java_int_rem
from sp_dagster.engine.windows.base import WindowProcessor, dump_events, load_events


def _expire_due(queue: deque, now: int, keep: int, out: list) -> int:
    """Move events whose time is up (ts + keep <= now) from `queue` to `out`; count them."""
    moved = 0
    while queue and queue[0].timestamp - now + keep <= 0:
        expired = queue.popleft()
        expired.timestamp = now
        out.append(expired)
        moved += 1
    return moved


class TimeWindow(WindowProcessor):
    """Keeps events for a duration; an event expires at exactly its time + duration."""

    name = "time"
    uses_timers = True

    def configure(self):
        self.arity(1)
        self.keep = self.duration(0, "window.time")
        self.queue: deque = deque()
        self.last_timestamp = -(2**63)

    def process(self, chunk):
        out = []
        for event in chunk:
            now = self.clock.now()
            _expire_due(self.queue, now, self.keep, out)
            if event.type == CURRENT:
                self.queue.append(event.copy(EXPIRED))
                if self.last_timestamp < event.timestamp:
                    self.timers.notify_at(event.timestamp + self.keep)
                    self.last_timestamp = event.timestamp
                out.append(event)
        self.forward(out)

    def held(self):
        return self.queue

    def dump(self):
        return [dump_events(self.queue), self.last_timestamp]

    def load(self, state):
        events, self.last_timestamp = state
        self.queue = deque(load_events(events))


class TimeBatchWindow(WindowProcessor):
    """Collects events for a duration and emits them together; optional start time grid."""

    name = "timeBatch"
    mode = "batch"
    uses_timers = True

    def configure(self):
        self.arity(1, 2, 3)
        self.period = self.duration(0, "window.time")
        self.start_time = None
        self.stream_current = False
        if len(self.params) == 2:
            if self.params[1].executor.type == "bool":
                self.stream_current = self.constant(1, ("bool",), "stream.current.event")
            else:
                self.start_time = self.constant(1, ("int", "long"), "start.time")
        elif len(self.params) == 3:
            self.start_time = self.constant(1, ("int", "long"), "start.time")
            self.stream_current = self.constant(2, ("bool",), "stream.current.event")
        self.next_emit = -1
        self.current: list | None = None if self.stream_current else []
        self.expired: list | None = [] if self.expects_expired else None
        self.reset = None

    def process(self, chunk):
        now = self.clock.now()
        if self.next_emit == -1:
            if self.start_time is not None:
                self.next_emit = now + (self.period - java_int_rem(now - self.start_time, self.period))
            else:
                self.next_emit = now + self.period
            self.timers.notify_at(self.next_emit)
        send = now >= self.next_emit
        if send:
            self.next_emit += self.period
            self.timers.notify_at(self.next_emit)
        out = []
        for event in chunk:
            if event.type != CURRENT:
                continue
            if self.reset is None:
                self.reset = event.copy(RESET)
            if not self.stream_current:
                self.current.append(event.copy())
            else:
                if self.expired is not None:
                    self.expired.append(event.copy(EXPIRED))
                out.append(event)
        if send:
            if self.expects_expired and self.expired:
                for expired in self.expired:
                    expired.timestamp = now
                out.extend(self.expired)
                self.expired = []
            if self.reset is not None:
                out.append(self.reset)
                self.reset = None
            if self.current:
                if self.expired is not None:
                    self.expired.extend(e.copy(EXPIRED) for e in self.current)
                out.extend(self.current)
                self.current = []
        self.forward(out)

    def held(self):
        return self.expired or ()

    def dump(self):
        return [self.next_emit, dump_events(self.current), dump_events(self.expired), dump_events([self.reset] if self.reset else [])]

    def load(self, state):
        self.next_emit, current, expired, reset = state
        self.current, self.expired = load_events(current), load_events(expired)
        self.reset = load_events(reset)[0] if reset else None


class TimeLengthWindow(WindowProcessor):
    """At most n events, each kept at most a duration."""

    name = "timeLength"
    uses_timers = True

    def configure(self):
        self.arity(2)
        self.keep = self.duration(0, "window.time")
        self.length = self.constant(1, ("int",), "window.length")
        self.queue: deque = deque()
        self.count = 0

    def process(self, chunk):
        now = self.clock.now()
        out = []
        for event in chunk:
            self.count -= _expire_due(self.queue, now, self.keep, out)
            if event.type == CURRENT:
                clone = event.copy(EXPIRED)
                if self.count < self.length:
                    self.count += 1
                    self.queue.append(clone)
                elif self.queue:
                    first = self.queue.popleft()
                    first.timestamp = now
                    out.append(first)
                    self.queue.append(clone)
                self.timers.notify_at(clone.timestamp + self.keep)
                out.append(event)
        self.forward(out)

    def held(self):
        return self.queue

    def dump(self):
        return [dump_events(self.queue), self.count]

    def load(self, state):
        events, self.count = state
        self.queue = deque(load_events(events))


class DelayWindow(WindowProcessor):
    """Holds each event for a duration, then emits it as a current event."""

    name = "delay"
    uses_timers = True

    def configure(self):
        self.arity(1)
        self.delay = self.duration(0, "window.delay")
        self.queue: deque = deque()
        self.last_timestamp = -(2**63)

    def process(self, chunk):
        out = []
        for event in chunk:
            _expire_due(self.queue, self.clock.now(), self.delay, out)
            if event.type == CURRENT:
                self.queue.append(event.copy())
                if self.last_timestamp < event.timestamp:
                    self.timers.notify_at(event.timestamp + self.delay)
                    self.last_timestamp = event.timestamp
        self.forward(out)

    def held(self):
        return self.queue

    def dump(self):
        return [dump_events(self.queue), self.last_timestamp]

    def load(self, state):
        events, self.last_timestamp = state
        self.queue = deque(load_events(events))


WINDOWS = {
    "time": TimeWindow,
    "timeBatch": TimeBatchWindow,
    "timeLength": TimeLengthWindow,
    "delay": DelayWindow,
}
