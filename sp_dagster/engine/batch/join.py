"""One side of a windowed stream join (`from A#window.length(n) join B#window... on A.k == B.k`) over a segment.
While A is sent, B's window does not move, so what B holds is indexed by the key once and probed
by every arrival of A (JoinKernel).
"""

from __future__ import annotations

from collections import deque
from itertools import repeat

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sp_dagster.engine.batch.base import Kernel, Output, apply_filters
from sp_dagster.engine.events import EXPIRED, ArrowChunk, StreamEvent
from sp_dagster.engine.expressions import materialize
from sp_dagster.engine.join import JoinSide
from sp_dagster.engine.processors import FilterProcessor
from sp_dagster.engine.query import QueryOutput
from sp_dagster.engine.ratelimit import PassThrough
from sp_dagster.engine.windows.base import WindowProcessor
from sp_dagster.engine.windows.length import LengthWindow
from sp_dagster.siddhi import ast

KEY_TYPES = ("string", "int", "long", "bool")


class HeldLength:
    """The events of a length window, held column-wise by a kernel until the window is read.

    The other side's JoinKernel finds them here too (held_columns).
    """

    def __init__(self, columns: list[pa.Array], times: np.ndarray):
        self.columns = columns
        self.times = times

    def settle(self, window) -> None:
        size = len(self.times)
        rows = zip(*[c.to_pylist() for c in self.columns]) if self.columns else repeat((), size)
        window.queue = deque(map(StreamEvent, self.times.tolist(), rows, repeat(EXPIRED, size)))
        window.pending = None


def held_columns(window, schema: pa.Schema) -> tuple[list[pa.Array], np.ndarray]:
    """What `window` holds, column-wise (from a HeldLength without making events)."""
    pending = window.pending
    if isinstance(pending, HeldLength):
        return pending.columns, pending.times
    events = list(window.held())
    columns = [pa.array([e.data[i] for e in events], field.type) for i, field in enumerate(schema)]
    return columns, np.array([e.timestamp for e in events], np.int64)


class JoinKernel(Kernel):
    """One triggering side (filters, then a length window) of an inner join on `L.a == R.b`.

    While a segment of this side's sends is processed, the other side's window does not move
    (only this side is sent), so what it holds is indexed by the key once: each arrival enters
    this side's length window (the oldest expiring first) and is joined with the other side's
    held events of its key, in held order. A chunk's joined rows go out as one chunk (expired
    joins are computed by the event path but not selected: the query selects current events
    only). This side's window keeps its events column-wise until something reads it (HeldLength).
    """

    @classmethod
    def build(cls, receiver, runtime):
        head = getattr(receiver, "head", None)
        if head is None or type(receiver).__name__ != "_Head":
            return None
        query = next((q for q in runtime.queries.values() if any(r is receiver for _, r in q.subscriptions)), None)
        if query is None or len(query.join_sides) != 2:
            return None
        chain, processor = [], head
        while processor is not None and not isinstance(processor, JoinSide):
            chain.append(processor)
            processor = getattr(processor, "next", None)
        side = processor
        if side is None or not chain or type(chain[-1]) is not LengthWindow or chain[-1].length < 1:
            return None
        filters, window = chain[:-1], chain[-1]
        if not all(isinstance(p, FilterProcessor) and p.vector is not None for p in filters):
            return None
        join = query.query.input
        streams = (join.left.stream, join.right.stream)
        if streams[0].stream == streams[1].stream or any(s.inner for s in streams) or join.join_type != "inner":
            return None
        other = side.other
        if not isinstance(other, WindowProcessor) or hasattr(other, "held_for") or side.outer or side.keys is None:
            return None
        if not _pure_equality(join.on):
            return None
        selector = query.selector
        if not selector.accepts_arrow or selector.expired_on or query.query.rate is not None:
            return None
        if not isinstance(query.limiter, PassThrough) or type(query.output) is not QueryOutput:
            return None
        if any(isinstance(node, ast.In) for node in ast.walk(query.query)):
            return None
        mine = window.context.schema
        theirs = other.context.schema
        if not mine.arrow_capable or not theirs.arrow_capable or mine.types[side.keys[0]] not in KEY_TYPES:
            return None
        return cls(query, filters, window, side, other)

    def __init__(self, query, filters, window, side, other):
        super().__init__(query)
        self.filters = filters
        self.window = window
        self.side = side
        self.other = other
        self.schema = window.context.schema.arrow_schema()
        self.other_schema = other.context.schema.arrow_schema()
        self.out_schema = query.selector.output_schema.arrow_schema()

    def run(self, run, start, end):
        lo, hi = int(run.bounds[start]), int(run.bounds[end])
        times = run.times[lo:hi]
        owner = np.repeat(np.arange(start, end), np.diff(run.bounds[start : end + 1]))
        chunk, kept = apply_filters(ArrowChunk(run.batch().slice(lo, hi - lo), pa.array(times, pa.int64())), self.filters)
        if kept is not None:
            times, owner = times[kept], owner[kept]
        arrivals = chunk.batch
        out = self._joined(arrivals, times, owner) if self.side.trigger else None
        self._write_window(arrivals, times)
        if out is None:
            return Output(self.query, pa.RecordBatch.from_pylist([], schema=self.out_schema), times[:0], owner[:0])
        return out

    def _joined(self, arrivals: pa.RecordBatch, times: np.ndarray, owner: np.ndarray):
        """Each arrival with the other side's held events of its key (in held order)."""
        mine, theirs = self.side.keys
        other_columns, _ = held_columns(self.other, self.other_schema)
        held = len(other_columns[0]) if other_columns else 0
        count = arrivals.num_rows
        encoded = pc.dictionary_encode(pa.concat_arrays([other_columns[theirs], arrivals.column(mine)]))  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes it at import
        codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        held_codes, arrival_codes = codes[:held], codes[held:]
        by_key = np.argsort(held_codes, kind="stable")
        sorted_codes = held_codes[by_key]
        first = np.searchsorted(sorted_codes, arrival_codes, side="left")
        last = np.searchsorted(sorted_codes, arrival_codes, side="right")
        sizes = np.where(arrival_codes >= 0, last - first, 0)
        which = np.repeat(np.arange(count), sizes)
        offsets = np.arange(len(which)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        found = by_key[np.repeat(first, sizes) + offsets]
        left = [c.take(pa.array(which)) for c in arrivals.columns]
        right = [c.take(pa.array(found)) for c in other_columns]
        if not self.side.left:
            left, right = right, left
        joined = pa.RecordBatch.from_arrays(left + right, names=[f"c{i}" for i in range(len(left) + len(right))])
        stamps = times[which]
        selector = self.query.selector
        rows = joined.num_rows
        view = ArrowChunk(joined, pa.array(stamps, pa.int64()))
        columns = [materialize(v(view), rows, e.type) for v, e in zip(selector.vectors, selector.executors)]
        out = pa.RecordBatch.from_arrays(columns, schema=self.out_schema)
        return Output(self.query, out, stamps, owner[which])

    def _write_window(self, arrivals: pa.RecordBatch, times: np.ndarray) -> None:
        """The window's last n events: what it held, then the arrivals."""
        window = self.window
        if not arrivals.num_rows:
            return
        columns, held_times = held_columns(window, self.schema)
        length = window.length
        if arrivals.num_rows >= length:
            keep = [c.slice(arrivals.num_rows - length) for c in arrivals.columns]
            stamps = times[-length:]
        else:
            drop = max(0, len(held_times) + arrivals.num_rows - length)
            keep = [pa.concat_arrays([h.slice(drop), c]) for h, c in zip(columns, arrivals.columns)]
            stamps = np.concatenate((held_times[drop:], times))
        window.pending = HeldLength(keep, stamps)
        window.count = len(stamps)


def _pure_equality(on) -> bool:
    return isinstance(on, ast.BinaryOp) and on.op == "==" and isinstance(on.left, ast.Variable) and isinstance(on.right, ast.Variable)
