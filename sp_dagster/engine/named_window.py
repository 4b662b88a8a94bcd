"""Named windows (`define window W (...) fn(args) [output all|current|expired events]`).
Mirrors Siddhi's Window: one window instance per app, shared by every query that uses it; what it
emits goes to the junction named W, filtered by the output clause, and joins probe what it holds.
"""

from __future__ import annotations

from sp_dagster.engine.events import CURRENT, EXPIRED, ArrowChunk, StreamEvent, as_events
from sp_dagster.engine.expressions import StreamScope, compile_expression
from sp_dagster.engine.junction import StreamJunction
from sp_dagster.engine.processors import Processor
from sp_dagster.engine.schema import Schema
from sp_dagster.engine.windows import WINDOWS, Param, WindowContext
from sp_dagster.siddhi import ast


class NamedWindow:
    """One `define window`: its window processor, and the junction its output goes to.

    `from W ...` queries, partitions and stream callbacks on W receive its current and expired
    events at the junction, one chunk per window output. A join probes `held()` (the interface
    tables share). snapshot() and restore() cover the window's events and timers.
    """

    def __init__(self, definition: ast.WindowDefinition, context):
        self.name = definition.name
        self.definition = definition
        self.schema = Schema.of((a.name, a.type) for a in definition.attributes)
        self.output = definition.output_event_type or "all"
        self.junction = StreamJunction(self.name, self.schema)
        node = definition.window
        scope = StreamScope(self.schema, (self.name,), context)
        params = [Param(arg, compile_expression(arg, scope)) for arg in node.args]
        window_class = WINDOWS[node.name]  # support.check_supported has rejected unknown windows
        # named windows are built before any query: their timers fire before the queries' when time moves
        scheduler = context.clock.scheduler(f"window:{self.name}") if window_class.uses_timers else None
        expired_on = self.output != "current"  # Siddhi: outputExpectsExpiredEvents
        window_context = WindowContext(context.clock, scheduler, expired_on, node, self.schema, findable=True)
        self.processor = window_class(params, window_context)
        self.processor.next = _Publisher(self.junction, self.output in ("all", "current"), expired_on)
        self.mode = self.processor.mode

    def add(self, events) -> None:
        """Add rows (StreamEvents of any type, or an ArrowChunk) to the window, as current events."""
        chunk = [StreamEvent(e.timestamp, e.data) for e in as_events(events)]
        if chunk:
            self.processor.process(chunk)

    def held(self):
        """The events the window holds now (what joins look into)."""
        return self.processor.held()

    def snapshot(self):
        """The window's events and timers, as plain data."""
        return self.processor.snapshot()

    def restore(self, state) -> None:
        """Inverse of snapshot()."""
        self.processor.restore(state)

    def stop(self) -> None:
        """Release the window's timers."""
        self.processor.stop()


class _Publisher(Processor):
    """The last step of a named window: keeps the event types its output clause names."""

    def __init__(self, junction: StreamJunction, current: bool, expired: bool):
        self.junction = junction
        self.current = current
        self.expired = expired

    def process(self, chunk):
        out = [StreamEvent(e.timestamp, e.data, e.type) for e in chunk if (e.type == CURRENT and self.current) or (e.type == EXPIRED and self.expired)]
        if out:
            self.junction.send(out)


class WindowOutput:
    """A query's `insert into W`: query callbacks first, then the rows go into the window.

    Expired rows come in as current ones, as Siddhi's InsertIntoWindowCallback turns them.
    """

    def __init__(self, window: NamedWindow, callbacks: list):
        self.window = window
        self.callbacks = callbacks

    def send(self, chunk) -> None:
        """Deliver a chunk of selector output (current, expired and RESET events)."""
        for callback in self.callbacks:
            callback.receive(chunk)
        if isinstance(chunk, ArrowChunk):
            self.window.add(chunk)
            return
        rows = [StreamEvent(e.timestamp, e.output) for e in chunk if e.type == CURRENT or e.type == EXPIRED]
        if rows:
            self.window.add(rows)

    send_arrow = send


class EventByEvent:
    """Feeds a named window's output to a join side one event at a time (a window self-join).

    In `from W as a join W as b` only the left side is fed, as Siddhi's one-slot multi-receiver
    does; filters on a named-window side of a join are not applied (Siddhi swaps that side's
    chain for a pass-through to the window).
    """

    def __init__(self, head: Processor):
        self.head = head

    def receive(self, chunk) -> None:
        for event in as_events(chunk):
            self.head.process([event])


def named_windows(app: ast.App, context) -> dict[str, NamedWindow]:
    """Build every named window of `app`, registering its output junction as a stream."""
    windows = {}
    for definition in app.definitions:
        if isinstance(definition, ast.WindowDefinition):
            window = windows[definition.name] = NamedWindow(definition, context)
            context.schemas[window.name] = window.schema
            context.junctions[window.name] = window.junction
    return windows
