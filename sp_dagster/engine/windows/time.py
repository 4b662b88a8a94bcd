"""Windows on the engine clock: time, timeBatch, timeLength and delay."""

from __future__ import annotations

from collections import deque

from sp_dagster.engine.clock import TimerQueue
from sp_dagster.engine.events import CURRENT, EXPIRED
from sp_dagster.engine.values import java_int_rem
from sp_dagster.engine.windows.base import BatchWindow, WindowProcessor, dump_events, load_events


def _expire_due(queue: deque, now: int, keep: int, out: list) -> int:
    """Move events whose time is up (ts + keep <= now) from `queue` to `out`; count them."""
    moved = 0
    while queue and queue[0].timestamp - now + keep <= 0:
        expired = queue.popleft()
        expired.timestamp = now
        out.append(expired)
        moved += 1
    return moved


class _Holding(WindowProcessor):
    """Keeps events in arrival order for a duration, arming a timer per newer timestamp."""

    uses_timers = True
    timers: TimerQueue  # uses_timers: WindowProcessor made the queue
    parameter = ""

    def configure(self):
        self.arity(1)
        self.keep = self.duration(0, self.parameter)
        self.queue: deque = deque()
        self.last_timestamp = -(2**63)

    def hold(self, event, stored) -> None:
        """Keep `stored` (for `event`) until its time is up."""
        self.queue.append(stored)
        if self.last_timestamp < event.timestamp:
            self.timers.notify_at(event.timestamp + self.keep)
            self.last_timestamp = event.timestamp

    def held(self):
        return self.queue

    def dump(self):
        return [dump_events(self.queue), self.last_timestamp]

    def load(self, state):
        events, self.last_timestamp = state
        self.queue = deque(load_events(events))


class TimeWindow(_Holding):
    """Keeps events for a duration; an event expires at exactly its time + duration."""

    name = "time"
    parameter = "window.time"

    def process(self, chunk):
        out = []
        for event in chunk:
            _expire_due(self.queue, self.clock.now(), self.keep, out)
            if event.type == CURRENT:
                self.hold(event, event.copy(EXPIRED))
                out.append(event)
        self.forward(out)


class DelayWindow(_Holding):
    """Holds each event for a duration, then emits it as a current event."""

    name = "delay"
    parameter = "window.delay"

    def process(self, chunk):
        out = []
        for event in chunk:
            _expire_due(self.queue, self.clock.now(), self.keep, out)
            if event.type == CURRENT:
                self.hold(event, event.copy())
        self.forward(out)


class TimeBatchWindow(BatchWindow):
    """Collects events for a duration and emits them together; optional start time grid."""

    name = "timeBatch"
    uses_timers = True
    timers: TimerQueue  # uses_timers: WindowProcessor made the queue

    def configure(self):
        self.arity(1, 2, 3)
        self.period = self.duration(0, "window.time")
        self.start_time = None
        if len(self.params) == 2:
            if self.params[1].executor.type == "bool":
                self.stream_current = self.constant(1, ("bool",), "stream.current.event")
            else:
                self.start_time = self.constant(1, ("int", "long"), "start.time")
        elif len(self.params) == 3:
            self.start_time = self.constant(1, ("int", "long"), "start.time")
            self.stream_current = self.constant(2, ("bool",), "stream.current.event")
        self.next_emit = -1
        self.start_batches()

    def process(self, chunk):
        if self.pending is not None:
            self.pending.settle(self)
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
            self.note(event)
            if not self.stream_current:
                self.current.append(event.copy())  # pyright: ignore[reportOptionalMemberAccess] # a list unless stream_current
            else:
                if self.expired is not None:
                    self.expired.append(event.copy(EXPIRED))
                out.append(event)
        if send:
            self.flush(out, now, stamp_reset=False)
        self.forward(out)

    def held(self):
        self.settle()
        return super().held()

    def dump(self):
        self.settle()
        return [self.next_emit, self.dump_batches()]

    def load(self, state):
        self.pending = None
        self.next_emit, batches = state
        self.load_batches(batches)


class TimeLengthWindow(WindowProcessor):
    """At most n events, each kept at most a duration."""

    name = "timeLength"
    uses_timers = True
    timers: TimerQueue  # uses_timers: WindowProcessor made the queue

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


WINDOWS = {
    "time": TimeWindow,
    "timeBatch": TimeBatchWindow,
    "timeLength": TimeLengthWindow,
    "delay": DelayWindow,
}
