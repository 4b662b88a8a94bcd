"""Joins: two inputs (streams behind windows, or tables), matched on arrival, as Siddhi does.

Each stream side runs its own chain (filters, its window, or a zero-length window when it
has none) ending in a JoinSide. For every event its window emits, the JoinSide looks into
the other side's window (or table) and hands the joined events of that one event to the
selector as a chunk (all chunks of one window output go on as one selector call); outer sides emit unmatched events with the other side null, and only
`unidirectional` sides (or every stream side when there is none) trigger. A joined event's
data is the left attributes followed by the right ones.
"""

from __future__ import annotations

from sp_dagster.engine.events import CURRENT, EXPIRED, RESET, TIMER, StreamEvent
from sp_dagster.engine.expressions import JoinedScope, StreamScope, compile_expression
from sp_dagster.engine.processors import Processor
from sp_dagster.engine.schema import Schema
from sp_dagster.siddhi import ast


class EmptyWindow(Processor):
    """A windowless join side: each event is current, then expires at once; nothing is held."""

    def process(self, chunk):
        out = []
        for event in chunk:
            if event.type == CURRENT:
                out.append(event)
                out.append(event.copy(EXPIRED))
        if out:
            self.next.process(out)

    def held(self):
        return ()


class JoinSide(Processor):
    """Matches each event of one side with what the other side holds, and emits the results."""

    def __init__(self, left: bool, outer: bool, trigger: bool, width: tuple[int, int], condition):
        self.left = left
        self.outer = outer
        self.trigger = trigger
        self.nulls = ((None,) * width[1], (None,) * width[0])[not left]  # the other side, absent
        self.condition = condition
        self.other = None  # the other side's window (held()) or table view (held_for(event))

    def process(self, chunk):
        if not self.trigger:
            return
        condition = self.condition
        # a table side gives the rows that may match each event (held_for); a window, all it holds
        lookup = getattr(self.other, "held_for", None)
        chunks = []
        for event in chunk:
            kind = event.type
            if kind == TIMER:
                continue
            if kind == RESET:
                chunks.append([StreamEvent(event.timestamp, None, RESET)])
                continue
            out = []
            for found in self.other.held() if lookup is None else lookup(event):
                data = event.data + found.data if self.left else found.data + event.data
                joined = StreamEvent(event.timestamp, data, kind)
                if condition is None or condition(joined) is True:
                    out.append(joined)
            if not out and self.outer:
                data = event.data + self.nulls if self.left else self.nulls + event.data
                out.append(StreamEvent(event.timestamp, data, kind))
            if out:
                chunks.append(out)
        if chunks:
            self.next.process_chunks(chunks)


def join_scope(join: ast.JoinInput, left: Schema, right: Schema, context) -> JoinedScope:
    """The scope of a join: left attributes, then right ones, each named by stream and alias."""
    return JoinedScope([(_names(join.left), left, 0), (_names(join.right), right, len(left))], context)


def join_sides(join: ast.JoinInput, scope: JoinedScope, left_schema: Schema, right_schema: Schema, tables: set[str]):
    """The two JoinSides of `join` (left, right), without their `other` yet."""
    condition = compile_expression(join.on, scope).row if join.on is not None else None
    width = (len(left_schema), len(right_schema))
    sides = []
    for is_left, source in ((True, join.left), (False, join.right)):
        name = "left" if is_left else "right"
        outer = join.join_type in ("full_outer", f"{name}_outer")
        trigger = source.stream.stream not in tables and join.unidirectional in (None, name)
        sides.append(JoinSide(is_left, outer, trigger, width, condition))
    return sides


def side_scope(source: ast.JoinSource, schema: Schema, context) -> StreamScope:
    """The scope of one side's own filters and window parameters."""
    return StreamScope(schema, _names(source), context, inner=source.stream.inner)


def _names(source: ast.JoinSource) -> tuple[str, ...]:
    return (source.stream.stream,) + ((source.alias,) if source.alias else ())
