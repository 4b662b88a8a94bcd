"""`output snapshot every T`: at the end of every period, the query's current state.
Siddhi picks one of seven limiters by the query's shape (snapshot_limiter): with a window, the rows
still in it; without one, the last row (per group).
"""

from __future__ import annotations

from sp_dagster.engine.events import CURRENT, EXPIRED, RESET, TIMER, StreamEvent
from sp_dagster.engine.ratelimit import Periodic, dump_rows, load_rows
from sp_dagster.siddhi import ast


class SnapshotLimiter(Periodic):
    """Base: flush a snapshot whenever an event's time (or the timer) reaches the period end.

    The snapshot goes out before that event is taken in.
    """

    def process(self, chunk):
        outs = []
        for event in chunk:
            if self.period_over(event.timestamp):
                outs.append([_copy(e) for e in self.rows()])
            if event.type != TIMER:
                self.arrived()
                self.take(event)
        for out in outs:
            self.emit(out)

    def rows(self) -> list[StreamEvent]:
        """The rows of the current snapshot."""
        raise NotImplementedError

    def take(self, event: StreamEvent) -> None:
        """Fold one selector output event into the state."""
        raise NotImplementedError

    def dump(self):
        """The rows and aggregates kept, as plain data."""
        raise NotImplementedError

    def load(self, saved) -> None:
        """Inverse of dump()."""
        raise NotImplementedError

    def snapshot(self):
        return [self.timer_state(), self.dump()]

    def restore(self, state):
        timers, saved = state
        self.restore_timers(timers)
        self.load(saved)


def _copy(event: StreamEvent, output: tuple | None = None) -> StreamEvent:
    return StreamEvent(event.timestamp, event.data, CURRENT, event.output if output is None else output, event.key)


class LastRow(SnapshotLimiter):
    """No window, no group by: the last current row."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.last = None

    def rows(self):
        return [self.last] if self.last is not None else []

    def take(self, event):
        if event.type == CURRENT:
            self.last = event

    def dump(self):
        return dump_rows(self.rows())

    def load(self, saved):
        self.last = (load_rows(saved) or [None])[0]


class LastRowPerGroup(SnapshotLimiter):
    """No window, group by: the last current row of every group (first-seen order)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.latest: dict = {}

    def rows(self):
        return list(self.latest.values())

    def take(self, event):
        if event.type == CURRENT:
            self.latest[event.key] = event

    def dump(self):
        return dump_rows(self.latest.values())

    def load(self, saved):
        self.latest = {e.key: e for e in load_rows(saved)}


class LastAggregate(LastRow):
    """Window, only aggregates: the last current row, cleared by expiry or reset."""

    def take(self, event):
        self.last = event if event.type == CURRENT else None


class WindowRows(SnapshotLimiter):
    """Window, no aggregates: the rows in the window (an expired row removes its equal)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events: list = []

    def rows(self):
        return self.events

    def take(self, event):
        if event.type == CURRENT:
            self.events.append(event)
        elif event.type == EXPIRED:
            for index, held in enumerate(self.events):
                if held.output == event.output:
                    del self.events[index]
                    break
        elif event.type == RESET:
            self.events = []

    def dump(self):
        return dump_rows(self.events)

    def load(self, saved):
        self.events = load_rows(saved)


class WindowRowsWithAggregates(WindowRows):
    """Window, some aggregates: the window's rows, aggregate columns at their latest values.

    `groups` False: one set of latest aggregate values; True: one per group, and one row per
    group in the snapshot.
    """

    def __init__(self, *args, positions: list[int], groups: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.positions = positions
        self.groups = groups
        self.values: dict = {}

    def _same(self, a: StreamEvent, b: StreamEvent) -> bool:
        return all(x == y for i, (x, y) in enumerate(zip(a.output, b.output)) if i not in self.positions)

    def take(self, event):
        key = event.key if self.groups else None
        if event.type == CURRENT:
            self.events.append(event)
            self.values[key] = {p: event.output[p] for p in self.positions}
        elif event.type == EXPIRED:
            for index, held in enumerate(self.events):
                if self._same(held, event):
                    del self.events[index]
                    self.values[key] = {p: event.output[p] for p in self.positions}
                    break
        elif event.type == RESET:
            self.events = []
            self.values = {}

    def rows(self):
        out, seen = [], set()
        for event in self.events:
            key = event.key if self.groups else None
            if self.groups:
                if key in seen:
                    continue
                seen.add(key)
            values = self.values.get(key, {})
            output = tuple(values.get(i, v) if i in self.positions else v for i, v in enumerate(event.output))
            out.append(_copy(event, output))
        return out

    def dump(self):
        return [dump_rows(self.events), list(self.values.items())]

    def load(self, saved):
        events, values = saved
        self.events = load_rows(events)
        self.values = dict(values)


class GroupAggregates(SnapshotLimiter):
    """Window, group by, only aggregates: each group's latest row while the group has rows."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.groups: dict = {}  # key -> [count, last event]

    def take(self, event):
        if event.type == RESET:
            self.groups = {}
            return
        holder = self.groups.setdefault(event.key, [0, None])
        if event.type == CURRENT:
            holder[0] += 1
            holder[1] = event
        elif event.type == EXPIRED:
            holder[0] -= 1
            holder[1] = event

    def rows(self):
        out = []
        for key in list(self.groups):
            count, last = self.groups[key]
            if count <= 0:
                del self.groups[key]
            else:
                out.append(last)
        return out

    def dump(self):
        return [[key, count, dump_rows([last])] for key, (count, last) in self.groups.items()]

    def load(self, saved):
        self.groups = {key: [count, load_rows(last)[0]] for key, count, last in saved}


def snapshot_limiter(query, period: int, scheduler) -> SnapshotLimiter:
    """The snapshot limiter Siddhi would choose for `query` (a QueryRuntime being built).

    With a window, the rows still in it (per group with group by), aggregate columns at their
    latest values; without a window, the last row (per group).
    """
    selector = query.selector
    attributes = query.query.selector.attributes
    positions = [
        i for i, attribute in enumerate(attributes) if isinstance(attribute.expression, ast.FunctionCall) and attribute.expression in _aggregate_calls(selector)
    ]
    windowed = query.window is not None
    grouped = bool(query.query.selector.group_by)
    every = len(positions) == len(selector.output_schema) and positions
    args = (query.output, period, query.context.clock, scheduler)
    if not windowed:
        return (LastRowPerGroup if grouped else LastRow)(*args)
    if every:
        return (GroupAggregates if grouped else LastAggregate)(*args)
    if positions:
        return WindowRowsWithAggregates(*args, positions=positions, groups=grouped)
    return WindowRows(*args)


def _aggregate_calls(selector) -> list:
    return [aggregator.node for aggregator in selector.aggregation.aggregators]
