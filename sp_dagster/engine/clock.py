"""The engine's clock and timers: playback (event time), the wall clock, or a wall clock a host drives.
Windows and rate limiters ask a Scheduler to notify them at a time; schedulers fire in the order
they were created, which is query order, as Siddhi's rules have it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable


class Clock:
    """Base clock: current time in epoch milliseconds and the schedulers it drives."""

    playback = False

    def __init__(self) -> None:
        self.schedulers: list[Scheduler] = []
        self.lock: threading.RLock = threading.RLock()

    def now(self) -> int:
        """The current time (ms)."""
        raise NotImplementedError

    def scheduler(self, name: str = "") -> Scheduler:
        """A new scheduler, firing after every scheduler created before it."""
        scheduler = Scheduler(self, name)
        self.schedulers.append(scheduler)
        return scheduler

    def fire_due(self) -> None:
        """Run every timer that is due now, scheduler by scheduler."""
        for scheduler in self.schedulers:
            scheduler.fire_due()

    def next_due(self) -> int | None:
        """The earliest time any timer is armed for, or None."""
        times = [t for t in (s.next_due() for s in self.schedulers) if t is not None]
        return min(times) if times else None

    def wake(self, when: int) -> None:
        """A timer was armed for `when` (the wall clock reschedules its thread)."""

    def advance(self, timestamp: int) -> None:
        """Move time to `timestamp`, firing the timers due by then (clocks that follow events)."""
        raise NotImplementedError

    def start(self) -> None:
        """Start firing timers (the wall clock's thread)."""

    def stop(self) -> None:
        """Stop firing timers."""

    def snapshot(self):
        """Plain-data state of the clock."""
        return None

    def restore(self, state) -> None:
        """Inverse of snapshot()."""


class ManualClock(Clock):
    """Time that moves only when its owner calls advance(); timers fire then, never on their own."""

    def __init__(self, start: int = 0) -> None:
        super().__init__()
        self.current = start

    def now(self) -> int:
        return self.current

    def advance(self, timestamp: int) -> None:
        """Move time forward to `timestamp` (never back), firing the timers now due."""
        if timestamp > self.current:
            self.current = timestamp
            self.fire_due()

    def snapshot(self):
        return self.current

    def restore(self, state) -> None:
        self.current = state


class PlaybackClock(ManualClock):
    """Event time: the largest event timestamp sent so far (starts at 0)."""

    playback = True


class DrivenClock(ManualClock):
    """The wall clock moved by a host: starts at the system time; advance() fires every due timer.

    For a host that has no room for WallClock's thread (a Spark task): it asks next_due() when to
    come back and moves time with advance().
    """

    def __init__(self, start: int | None = None) -> None:
        super().__init__(int(time.time() * 1000) if start is None else start)

    def advance(self, timestamp: int) -> None:
        """Move time forward to `timestamp` (never back) and fire every timer due, even ones armed
        in the past since the last call (the wall clock's thread would have fired them at once)."""
        self.current = max(self.current, timestamp)
        self.fire_due()


class WallClock(Clock):
    """System time; a daemon thread fires timers when they fall due."""

    def __init__(self, source: Callable[[], float] = time.time) -> None:
        super().__init__()
        self._source = source
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._woken = False

    def now(self) -> int:
        return int(self._source() * 1000)

    def wake(self, when: int) -> None:
        with self._changed:
            self._woken = True
            self._changed.notify()

    def start(self) -> None:
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="sp-dagster-engine-timers", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None

    def _run(self) -> None:
        # the runtime lock and the condition are never held together, so send() (which holds
        # the lock and wakes this thread) cannot deadlock with it
        while True:
            with self.lock:
                due = self.next_due()
                if due is not None and due <= self.now():
                    self.fire_due()
                    continue
            with self._changed:
                if self._stopping:
                    return
                if not self._woken:
                    wait = 1.0 if due is None else min(1.0, (due - self.now()) / 1000)
                    self._changed.wait(timeout=max(wait, 0.0))
                self._woken = False


class Scheduler:
    """Timers of one processor of one query: one FIFO queue per partition instance.

    The query's partition instances share it, each with its own queue. Schedulers fire in the
    order they were created (query order), so when time moves, due timers run query by query,
    each query all of its own before the next, and within a query the partition instances with
    the earliest due time first: Siddhi's rules.
    """

    def __init__(self, clock: Clock, name: str = "") -> None:
        self.clock = clock
        self.name = name
        self.queues: list[TimerQueue] = []

    def queue(self, target: Callable[[int], None]) -> TimerQueue:
        """A new queue whose due times call `target(time)`."""
        queue = TimerQueue(self, target)
        self.queues.append(queue)
        return queue

    def discard(self, queue: TimerQueue) -> None:
        """Forget a queue (its processor has stopped)."""
        if queue in self.queues:
            self.queues.remove(queue)

    def next_due(self) -> int | None:
        """The earliest armed time, or None."""
        heads = [q.times[0] for q in self.queues if q.times]
        return min(heads) if heads else None

    def fire_due(self) -> None:
        """Fire every due queue, earliest head first (ties in creation order)."""
        now = self.clock.now()
        due = [q for q in self.queues if q.times and q.times[0] <= now]
        if len(due) > 1:
            due.sort(key=lambda q: q.times[0])
        for queue in due:
            queue.fire()


class TimerQueue:
    """Times to notify one processor instance at, in the order they were armed (like Siddhi)."""

    __slots__ = ("scheduler", "target", "times")

    def __init__(self, scheduler: Scheduler, target: Callable[[int], None]) -> None:
        self.scheduler = scheduler
        self.target = target
        self.times: deque[int] = deque()

    def notify_at(self, when: int) -> None:
        """Call the target with `when` once the clock reaches it."""
        self.times.append(when)
        self.scheduler.clock.wake(when)

    def fire(self) -> None:
        """Deliver every armed time that is due, including ones armed while firing."""
        clock = self.scheduler.clock
        while self.times and self.times[0] <= clock.now():
            self.target(self.times.popleft())

    def snapshot(self) -> list[int]:
        """The armed times."""
        return list(self.times)

    def restore(self, times: list[int]) -> None:
        """Re-arm saved times."""
        self.times = deque(times)
