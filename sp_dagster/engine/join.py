"""Joins: two inputs (streams behind windows, or tables), matched on arrival, as Siddhi does.
Each stream side runs its own chain (filters, its window, or a zero-length window when it has
none) ending in a JoinSide, which joins every event its window emits with what the other side
holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from sp_dagster.engine.events import CURRENT, EXPIRED, RESET, TIMER, StreamEvent
from sp_dagster.engine.expressions import JoinedScope, StreamScope, compile_expression, locate
from sp_dagster.engine.processors import Processor
from sp_dagster.engine.schema import Schema
from sp_dagster.engine.windows.length import LengthWindow
from sp_dagster.siddhi import ast

if TYPE_CHECKING:
    from sp_dagster.engine.selector import Selector


class Held(Protocol):
    """What a join side looks into: the other side's window, table view or aggregation view."""

    def held(self) -> Sequence[StreamEvent]:
        """The events (rows) held now, in order."""
        ...


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
    """Matches each event of one side with what the other side holds, and emits the results.

    The joined events of one event go to the selector as a chunk, and all chunks of one window
    output as one selector call. Where the `on` condition requires `L.a == R.b` (a conjunct
    comparing one attribute of each side, of the same type: `keys`), the side indexes what the
    other holds by that attribute once per chunk, so each event is tested only against the held
    events with its key (in held order); the whole condition is still applied to them.
    """

    next: Selector
    #: the other side's window (held()) or table view (held_for(event)), wired when the query is built
    other: Held

    def __init__(self, left: bool, outer: bool, trigger: bool, width: tuple[int, int], condition, keys=None):
        self.left = left
        self.outer = outer
        self.trigger = trigger
        self.nulls = ((None,) * width[1], (None,) * width[0])[not left]  # the other side, absent
        self.condition = condition
        # (index of the key in this side's data, index in the other side's data), or None
        self.keys = keys

    def process(self, chunk):
        if not self.trigger:
            return
        condition = self.condition
        # a table side gives the rows that may match each event (held_for); a window, all it holds
        lookup = getattr(self.other, "held_for", None)
        if lookup is None and self.keys is not None:
            lookup = self._keyed_lookup(self.keys)
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
        else:
            unmatched = getattr(self.other, "unmatched", None)
            if unmatched is not None:
                unmatched(chunk)  # an aggregation side reports a trigger that matched nothing

    def _keyed_lookup(self, keys: tuple[int, int]):
        """A function from an event to the held events with its key, indexed on first use
        (or kept from the last chunk while the other side, a length window, holds the same)."""
        mine, theirs = keys
        index: dict | None = None

        def lookup(event):
            nonlocal index
            if index is None:
                index = self._index(theirs)
            key = event.data[mine]
            return () if key is None else index.get(key, ())

        return lookup

    def _index(self, theirs: int) -> dict:
        held = self.other.held()
        # a length window only appends and drops its oldest: the same deque, size and ends hold the same
        stamp = (id(held), len(held), held[0] if held else None, held[-1] if held else None) if type(self.other) is LengthWindow else None
        kept = getattr(self, "_kept", None)
        if stamp is not None and kept is not None and kept[0] == stamp and kept[1] is held:
            return kept[2]
        index: dict = {}
        for found in held:
            key = found.data[theirs]
            if key is not None:  # null never equals anything
                index.setdefault(key, []).append(found)
        self._kept = (stamp, held, index) if stamp is not None else None
        return index


def join_scope(join: ast.JoinInput, left: Schema, right: Schema, context) -> JoinedScope:
    """The scope of a join: left attributes, then right ones, each named by stream and alias."""
    return JoinedScope([(_names(join.left), left, 0), (_names(join.right), right, len(left))], context)


def join_sides(join: ast.JoinInput, scope: JoinedScope, left_schema: Schema, right_schema: Schema, tables: set[str]):
    """The two JoinSides of `join` (left, right), without their `other` yet."""
    condition = compile_expression(join.on, scope).row if join.on is not None else None
    width = (len(left_schema), len(right_schema))
    pair = _equality_key(join.on, scope) if join.on is not None else None
    sides = []
    for is_left, source in ((True, join.left), (False, join.right)):
        name = "left" if is_left else "right"
        outer = join.join_type in ("full_outer", f"{name}_outer")
        trigger = source.stream.stream not in tables and join.unidirectional in (None, name)
        keys = None if pair is None else (pair if is_left else (pair[1], pair[0]))
        sides.append(JoinSide(is_left, outer, trigger, width, condition, keys))
    return sides


def _equality_key(on: ast.Expression, scope: JoinedScope) -> tuple[int, int] | None:
    """(left index, right index) of a required `L.a == R.b` conjunct of `on`, if there is one."""
    if isinstance(on, ast.BinaryOp) and on.op == "and":
        return _equality_key(on.left, scope) or _equality_key(on.right, scope)
    if not (isinstance(on, ast.BinaryOp) and on.op == "==" and isinstance(on.left, ast.Variable) and isinstance(on.right, ast.Variable)):
        return None
    first, second = locate(on.left, scope.sides), locate(on.right, scope.sides)
    if first is None or second is None or first[0] == second[0]:  # one attribute of each side
        return None
    (_, left), (_, right) = sorted((first, second))
    kind = scope.sides[0][1].types[left]
    # compared as the same type, so == is Python's == on the values (and they hash)
    if kind != scope.sides[1][1].types[right] or kind == "object":
        return None
    return left, right


def side_scope(source: ast.JoinSource, schema: Schema, context) -> StreamScope:
    """The scope of one side's own filters and window parameters."""
    return StreamScope(schema, _names(source), context, inner=source.stream.inner)


def _names(source: ast.JoinSource) -> tuple[str, ...]:
    return (source.stream.stream,) + ((source.alias,) if source.alias else ())
