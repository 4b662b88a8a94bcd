"""Output rate limiting (`output [all|first|last] every N events | T`, `output snapshot every T`).
One class per Siddhi limiter, with Siddhi's rules; time-based ones run on the engine clock, so
playback time drives them too.
"""

from __future__ import annotations

from sp_dagster.engine.clock import Clock, Scheduler, TimerQueue
from sp_dagster.engine.events import CURRENT, EXPIRED, TIMER, ArrowChunk, StreamEvent
from sp_dagster.engine.processors import Processor
from sp_dagster.engine.values import java_int_rem


def dump_rows(events) -> list:
    """Selector output events as plain data."""
    return [[e.timestamp, e.data, e.type, e.output, e.key] for e in events]


def load_rows(state) -> list:
    """Inverse of dump_rows()."""
    return [StreamEvent(ts, data, kind, out, key) for ts, data, kind, out, key in state]


def _is_row(event) -> bool:
    return event.type == CURRENT or event.type == EXPIRED


class RateLimiter(Processor):
    """Base: `emit(chunk)` hands a chunk to the query's output (callbacks, target stream).

    Event counts include the events of all groups unless the limiter is per group (the
    `...GroupBy...` classes).
    """

    def __init__(self, output, value=None, clock: Clock | None = None, scheduler: Scheduler | None = None):
        self.output = output
        self.value = value
        self.clock = clock
        self.timers = scheduler.queue(self.on_timer) if (scheduler is not None and self.uses_timers) else None

    uses_timers = False

    def emit(self, chunk: list) -> None:
        """Send a chunk to the callbacks and the target."""
        if chunk:
            self.output.send(chunk)

    def on_timer(self, when: int) -> None:
        """A period has ended."""
        self.process([StreamEvent(when, None, TIMER)])

    def start(self) -> None:
        """Arm the first timer (time-based limiters)."""

    def stop(self) -> None:
        if self.timers is not None:
            self.timers.scheduler.discard(self.timers)


class PassThrough(RateLimiter):
    """No rate limiting: every chunk goes out as it is."""

    accepts_arrow = True

    def process(self, chunk):
        if chunk:
            self.output.send(chunk)

    def process_arrow(self, chunk: ArrowChunk):
        self.output.send_arrow(chunk)


# --------------------------------------------------------------------------- every N events


class AllPerEvent(RateLimiter):
    """`output [all] every N events`: collect N rows, then emit them together."""

    value: int  # the n of `every n events`

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.buffer: list = []
        self.counter = 0

    def process(self, chunk):
        out = []
        for event in chunk:
            if _is_row(event):
                self.buffer.append(event)
                self.counter += 1
                if self.counter == self.value:
                    out.extend(self.buffer)
                    self.buffer = []
                    self.counter = 0
        self.emit(out)

    def snapshot(self):
        return [self.counter, dump_rows(self.buffer)]

    def restore(self, state):
        self.counter, buffer = state
        self.buffer = load_rows(buffer)


class FirstPerEvent(RateLimiter):
    """`output first every N events`: the first of every N events."""

    value: int  # the n of `every n events`

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.counter = 0

    def process(self, chunk):
        out = []
        for event in chunk:  # Siddhi counts every event of the chunk here
            self.counter += 1
            if self.counter == 1:
                out.append(event)
            elif self.counter == self.value:
                self.counter = 0
        self.emit(out)

    def snapshot(self):
        return self.counter

    def restore(self, state):
        self.counter = state


class FirstGroupByPerEvent(RateLimiter):
    """`output first every N events` with group by: per group, the first of every N."""

    value: int  # the n of `every n events`

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.counts: dict = {}

    def process(self, chunk):
        out = []
        for event in chunk:
            count = self.counts.get(event.key)
            if count is None:
                self.counts[event.key] = 1
                out.append(event)
            elif count == self.value - 1:
                del self.counts[event.key]
            else:
                self.counts[event.key] = count + 1
        self.emit(out)

    def snapshot(self):
        return list(self.counts.items())

    def restore(self, state):
        self.counts = dict(state)


class LastPerEvent(RateLimiter):
    """`output last every N events`: the N-th event of every N, each in its own chunk."""

    value: int  # the n of `every n events`

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.counter = 0

    def process(self, chunk):
        outs = []
        for event in chunk:
            if _is_row(event):
                self.counter += 1
                if self.counter == self.value:
                    self.counter = 0
                    outs.append([event])
        for out in outs:
            self.emit(out)

    def snapshot(self):
        return self.counter

    def restore(self, state):
        self.counter = state


class LastGroupByPerEvent(RateLimiter):
    """`output last every N events` with group by: every N rows, each group's latest row."""

    value: int  # the n of `every n events`

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.counter = 0
        self.latest: dict = {}

    def process(self, chunk):
        out = []
        for event in chunk:
            if _is_row(event):
                self.latest[event.key] = event
                self.counter += 1
                if self.counter == self.value:
                    self.counter = 0
                    out.extend(self.latest.values())
                    self.latest = {}
        self.emit(out)

    def snapshot(self):
        return [self.counter, dump_rows(self.latest.values())]

    def restore(self, state):
        self.counter, latest = state
        self.latest = {e.key: e for e in load_rows(latest)}


# --------------------------------------------------------------------------- every T


class Periodic(RateLimiter):
    """A limiter that acts at the end of every period.

    On the wall clock the first period starts with the runtime; in playback it starts with
    the first row the limiter sees (event time has no meaningful start before that). Periods
    that pass while nothing happens are skipped: they would emit nothing new.
    """

    value: int  # the period (ms)
    clock: Clock
    timers: TimerQueue  # uses_timers: RateLimiter made the queue

    uses_timers = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.scheduled: int | None = None

    def start(self):
        if not self.clock.playback:
            self._arm(self.clock.now() + self.value)

    def _arm(self, when: int) -> None:
        self.scheduled = when
        self.timers.notify_at(when)

    def arrived(self) -> None:
        """A row arrived: in playback the first one starts the first period."""
        if self.scheduled is None:
            self._arm(self.clock.now() + self.value)

    def period_over(self, when: int) -> bool:
        """True (and the next period armed) when `when` has reached the end of the period."""
        if self.scheduled is None or when < self.scheduled:
            return False
        following = self.scheduled + self.value
        now = self.clock.now()
        if following <= now:
            following = now + self.value - java_int_rem(now - following, self.value)
        self._arm(following)
        return True

    def timer_state(self) -> list:
        """The period and armed timers, for snapshots."""
        return [self.scheduled, self.timers.snapshot()]

    def restore_timers(self, state: list) -> None:
        """Inverse of timer_state()."""
        self.scheduled, times = state
        self.timers.restore(times)


class AllPerTime(Periodic):
    """`output [all] every T`: everything collected in a period, at its end."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.buffer: list = []

    def process(self, chunk):
        out = []
        for event in chunk:
            if event.type == TIMER:
                if self.period_over(event.timestamp) and self.buffer:
                    out.extend(self.buffer)
                    self.buffer = []
            elif _is_row(event):
                self.arrived()
                self.buffer.append(event)
        self.emit(out)

    def snapshot(self):
        return [self.timer_state(), dump_rows(self.buffer)]

    def restore(self, state):
        timers, buffer = state
        self.restore_timers(timers)
        self.buffer = load_rows(buffer)


class LastPerTime(Periodic):
    """`output last every T`: the last row of each period, at its end."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.last = None

    def process(self, chunk):
        out = []
        for event in chunk:
            if event.type == TIMER:
                if self.period_over(event.timestamp) and self.last is not None:
                    out.append(self.last)
                    self.last = None
            elif _is_row(event):
                self.arrived()
                self.last = event
        self.emit(out)

    def snapshot(self):
        return [self.timer_state(), dump_rows([self.last] if self.last else [])]

    def restore(self, state):
        timers, last = state
        self.restore_timers(timers)
        self.last = (load_rows(last) or [None])[0]


class LastGroupByPerTime(Periodic):
    """`output last every T` with group by: each group's last row of the period."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.latest: dict = {}

    def process(self, chunk):
        out = []
        for event in chunk:
            if event.type == TIMER:
                if self.period_over(event.timestamp) and self.latest:
                    out.extend(self.latest.values())
                    self.latest = {}
            elif _is_row(event):
                self.arrived()
                self.latest[event.key] = event
        self.emit(out)

    def snapshot(self):
        return [self.timer_state(), dump_rows(self.latest.values())]

    def restore(self, state):
        timers, latest = state
        self.restore_timers(timers)
        self.latest = {e.key: e for e in load_rows(latest)}


class FirstPerTime(RateLimiter):
    """`output first every T`: a chunk's first row, then nothing until T after that row."""

    value: int  # the period (ms)
    clock: Clock

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.output_time = None

    def process(self, chunk):
        now = self.clock.now()
        if chunk and (self.output_time is None or self.output_time + self.value <= now):
            self.output_time = now
            self.emit([chunk[0]])

    def snapshot(self):
        return self.output_time

    def restore(self, state):
        self.output_time = state


class FirstGroupByPerTime(RateLimiter):
    """`output first every T` with group by: the same, per group."""

    value: int  # the period (ms)
    clock: Clock

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.output_times: dict = {}

    def process(self, chunk):
        now = self.clock.now()
        out = []
        for event in chunk:
            last = self.output_times.get(event.key)
            if last is None or last + self.value <= now:
                self.output_times[event.key] = now
                out.append(event)
        self.emit(out)

    def snapshot(self):
        return list(self.output_times.items())

    def restore(self, state):
        self.output_times = dict(state)


EVENT_LIMITERS = {
    ("all", False): AllPerEvent,
    ("all", True): AllPerEvent,
    ("first", False): FirstPerEvent,
    ("first", True): FirstGroupByPerEvent,
    ("last", False): LastPerEvent,
    ("last", True): LastGroupByPerEvent,
}
TIME_LIMITERS = {
    ("all", False): AllPerTime,
    ("all", True): AllPerTime,
    ("first", False): FirstPerTime,
    ("first", True): FirstGroupByPerTime,
    ("last", False): LastPerTime,
    ("last", True): LastGroupByPerTime,
}
