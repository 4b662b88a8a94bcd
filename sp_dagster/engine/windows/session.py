"""session(gap [, key] [, allowedLatency]): events grouped into sessions separated by gaps."""

from __future__ import annotations

from sp_dagster.engine.clock import TimerQueue
from sp_dagster.engine.events import CURRENT, EXPIRED
from sp_dagster.engine.javahash import hash_order
from sp_dagster.engine.windows.base import WindowProcessor, dump_events, load_events

DEFAULT_KEY = "default-key"


class Session:
    """The events of one session and its start, end and alive-until times."""

    __slots__ = ("events", "start", "end", "alive")

    def __init__(self):
        self.events: list = []
        self.start = self.end = self.alive = 0

    def set(self, start: int, end: int, alive: int) -> None:
        """Set the session's times."""
        self.start, self.end, self.alive = start, end, alive

    def clear(self) -> None:
        """Drop the events (times are kept, as Siddhi does)."""
        self.events = []

    def dump(self):
        """Plain-data form."""
        return [dump_events(self.events), self.start, self.end, self.alive]

    @staticmethod
    def load(state) -> Session:
        """Inverse of dump()."""
        session = Session()
        events, session.start, session.end, session.alive = state
        session.events = load_events(events)
        return session


class SessionWindow(WindowProcessor):
    """Current events pass at once; a session's events expire together when it times out."""

    name = "session"
    mode = "group"
    uses_timers = True
    timers: TimerQueue  # uses_timers: WindowProcessor made the queue

    def configure(self):
        self.arity(1, 2, 3)
        self.gap = self.duration(0, "session.gap")
        self.key = None
        self.latency = 0
        if len(self.params) == 3:
            self.key = self.attribute(1, ("string",), "session.key").row
            self.latency = self.duration(2, "allowed.latency")
        elif len(self.params) == 2:
            if self.params[1].executor.constant:
                self.latency = self.duration(1, "allowed.latency")
            else:
                self.key = self.attribute(1, ("string",), "session.key").row
        if self.latency > self.gap:
            raise self.error("allowed.latency must not be greater than the session gap")
        self.sessions: dict[str, tuple[Session, Session]] = {}

    def process(self, chunk):
        out, expired = [], []
        for event in chunk:
            ts = event.timestamp
            end, alive = ts + self.gap, ts + self.gap + self.latency
            if event.type == CURRENT:
                key = self.key(event) if self.key is not None else DEFAULT_KEY
                current, previous = self.sessions.setdefault(key, (Session(), Session()))
                clone = event.copy(EXPIRED)
                keep = True
                if not current.events:
                    current.events.append(clone)
                    current.set(ts, end, alive)
                    self.timers.notify_at(end)
                elif ts >= current.start:
                    if ts <= current.end:
                        current.set(current.start, end, alive)
                        current.events.append(clone)
                        self.timers.notify_at(end)
                    elif self.latency > 0:
                        self._to_previous(key, expired)
                        current.clear()
                        current.set(ts, end, alive)
                        current.events.append(clone)
                        self.timers.notify_at(end)
                else:
                    keep = self._late(key, ts, clone)
                if keep:
                    out.append(event)
            else:
                self._current_timeout(ts, expired)
                if self.latency > 0:
                    self._previous_timeout(ts, expired)
        out.extend(expired)
        self.forward(out)

    def _ordered(self, ends: dict[str, int]) -> list[tuple[str, int]]:
        keys = hash_order(ends)
        return sorted(((k, ends[k]) for k in keys), key=lambda item: item[1])

    def _current_timeout(self, ts: int, expired: list) -> None:
        ends = {k: cur.end for k, (cur, _) in self.sessions.items() if cur.events}
        for key, session_end in self._ordered(ends):
            current, previous = self.sessions[key]
            if not (current.events and ts >= session_end):
                break
            if self.latency > 0:
                previous.events.extend(current.events)
                previous.set(current.start, current.end, current.alive)
                self.timers.notify_at(current.alive)
            else:
                expired.extend(current.events)
            current.clear()

    def _previous_timeout(self, ts: int, expired: list) -> None:
        ends = {k: prev.end for k, (_, prev) in self.sessions.items() if prev.events}
        for key, _ in self._ordered(ends):
            previous = self.sessions[key][1]
            if not (previous.events and ts >= previous.alive):
                break
            expired.extend(previous.events)
            previous.clear()

    def _to_previous(self, key: str, expired: list) -> None:
        current, previous = self.sessions[key]
        if previous.events:
            expired.extend(previous.events)
        previous.events = list(current.events)
        previous.set(current.start, current.end, current.alive)
        self.timers.notify_at(current.alive)

    def _merge(self, previous: Session, following: Session) -> None:
        if previous.events and previous.end >= following.start - self.gap:
            following.events[0:0] = previous.events
            following.start = previous.start
            previous.clear()

    def _late(self, key: str, ts: int, clone) -> bool:
        """A late event (before the current session): join a session or be dropped."""
        current, previous = self.sessions[key]
        if ts >= current.start - self.gap:
            current.events.insert(0, clone)
            current.start = ts
            if self.latency > 0:
                self._merge(previous, current)
            return True
        if self.latency <= 0 or not previous.events or ts < previous.start - self.gap:
            return False
        previous.events.append(clone)
        if ts <= previous.end - self.gap and ts < previous.start:
            previous.start = ts
        else:
            previous.end = ts + self.gap
            previous.alive = ts + self.gap + self.latency
            self._merge(previous, current)
        return True

    def held(self):
        return [e for current, previous in self.sessions.values() for e in previous.events + current.events]

    def dump(self):
        return [[key, current.dump(), previous.dump()] for key, (current, previous) in self.sessions.items()]

    def load(self, state):
        self.sessions = {key: (Session.load(cur), Session.load(prev)) for key, cur, prev in state}


WINDOWS = {"session": SessionWindow}
