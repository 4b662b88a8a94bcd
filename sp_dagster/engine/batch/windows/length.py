"""length(n) windows under sum/count/avg selectors (with or without group by), over a whole segment.
The adds and removes of a segment are laid out in the event path's order once, the aggregates
computed per group at once (batch.aggregators), and the winners of every chunk picked out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import repeat
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sp_dagster.engine.batch.aggregators import EXACT, SUPPORTED, Ops, compute, integer_sum
from sp_dagster.engine.batch.base import Kernel, Output, segment
from sp_dagster.engine.batch.eligibility import plain_query
from sp_dagster.engine.events import EXPIRED, StreamEvent
from sp_dagster.engine.processors import FilterProcessor, Processor
from sp_dagster.engine.windows.base import WindowProcessor
from sp_dagster.engine.windows.length import LengthWindow
from sp_dagster.siddhi import ast

_WindowT = TypeVar("_WindowT", bound=WindowProcessor)

#: Attribute types a group-by key may have here (their Python values are the keys).
KEY_TYPES = ("string", "int", "long", "bool")
NUMERIC = ("int", "long", "float", "double")


class LengthAggregateKernel(Kernel):
    """`from S[...]#window.length(n) select <attributes, sum/count/avg> [group by a]`.

    Per arrival the event path expires the oldest event when the window is full, then adds the
    new one; the selector (batch mode) emits per chunk one row per group (the group's last
    current event, groups in first-seen order), or one row per chunk without group by.
    """

    @classmethod
    def build(cls, receiver, runtime):
        parts = analyse(receiver, LengthWindow)
        if parts is None or parts[1].length < 1:
            return None
        return cls(receiver, *parts)

    @classmethod
    def inner(cls, query, runtime):
        """The kernel of a partition's inner query `query`, or None."""
        return cls.build(query, runtime)

    def lane(self, query):
        """What one instance of the query keeps: its window and aggregators."""
        return query.processors[-1], query.selector.aggregation.aggregators

    def lane_fits(self, lane, run=None) -> bool:
        """What one instance holds fits the kernel."""
        return self.window_fits(*lane)

    def __init__(self, query, filters, window, arguments, columns, group):
        super().__init__(query)
        self.filters = filters
        self.window = window
        self.arguments = arguments
        self.columns = columns
        self.group = group
        self.aggregators = query.selector.aggregation.aggregators
        self.out_schema = query.selector.output_schema.arrow_schema()
        self._held: dict[int, tuple] = {}  # id(window) -> what it held after the last segment (see _held_columns)

    # -- what the event path would do differently

    def extent(self, run, start, end):
        return end if self.run_fits(run) and self.window_fits(self.window, self.aggregators) else start

    def run_fits(self, run) -> bool:
        """No nulls where aggregates read, no -0.0, integer sums far from overflowing (once per run)."""
        checked = run.cache.get(id(self))
        if checked is None:
            checked = run.cache[id(self)] = self._run_fits(run)
        return checked

    def _run_fits(self, run) -> bool:
        batch = run.batch()
        for aggregator, index in zip(self.aggregators, self.arguments):
            if index is None:
                continue
            column = batch.column(index)
            if column.null_count:
                return False
            values = column.to_numpy()
            if values.dtype.kind == "f" and np.any((values == 0) & np.signbit(values)):
                return False
            if integer_sum(aggregator) and len(values) and int(np.abs(values).max()) * self.span(run) >= EXACT:
                return False
        return True

    def span(self, run) -> int:
        """How many values an integer sum may add up at most (with one to spare)."""
        return self.window.length + 1

    def window_fits(self, window, aggregators) -> bool:
        """What `window` holds (and its aggregators' sums) fits too: no nulls, no -0.0, no huge sums."""
        if self._valid(window) is not None:
            return True  # held events the kernel itself wrote (checked as arrivals)
        for aggregator, index in zip(aggregators, self.arguments):
            if index is None:
                continue
            for event in window.queue:
                value = event.data[index]
                if value is None or (value == 0 and isinstance(value, float) and np.signbit(value)):
                    return False
            if integer_sum(aggregator) and any(abs(s.sum) >= EXACT // 2 for s in aggregator.states.values()):
                return False
        return True

    # -- the segment

    def run(self, run, start, end):
        chunk, times, owner = segment(run, start, end, self.filters)
        out, out_times, out_owner, _ = self.compute(chunk.batch, times, owner, np.zeros(len(times), np.int64), [(self.window, self.aggregators)])
        return Output(self.query, out, out_times, out_owner)

    def compute(self, batch: pa.RecordBatch, times: np.ndarray, owner: np.ndarray, lane: np.ndarray, lanes: list):
        """Outputs (batch, timestamps, owner) of `batch`'s arrivals; arrival i goes to lane `lane[i]`.

        A lane is one instance of the query, (window, aggregators): the query itself, or one
        partition key's. Owners must increase with i and a chunk (owner) feeds one lane. Every
        touched lane's window and aggregator states are left as the event path leaves them.
        """
        arrivals = batch.num_rows
        out_schema = self.out_schema
        if arrivals == 0:
            return pa.RecordBatch.from_pylist([], schema=out_schema), times[:0], owner[:0], None
        length, count = self.window.length, len(lanes)
        # held events of every lane: their global index (held columns, then arrivals)
        everything, held_index, held_offset, held_count = self._held_columns([window for window, _ in lanes], batch, times)
        base = len(everything[1]) - arrivals
        columns = {i: everything[0][i] for i in {self.group, *self.arguments} if i is not None}
        per_lane = np.bincount(lane, minlength=count)
        lane_start = np.concatenate(([0], np.cumsum(per_lane)[:-1]))
        by_lane = np.argsort(lane, kind="stable")
        rank = np.empty(arrivals, np.int64)
        rank[by_lane] = np.arange(arrivals) - np.repeat(lane_start, per_lane)
        q = held_count[lane]
        position = q + rank  # in the lane's held events then its arrivals
        removes = position >= length
        gone = position - length  # the position that expires before arrival i
        from_held = gone < q
        gone_held = held_index[np.clip(held_offset[lane] + gone, 0, max(len(held_index) - 1, 0))] if len(held_index) else np.zeros(arrivals, np.int64)
        gone_new = base + by_lane[np.clip(lane_start[lane] + gone - q, 0, arrivals - 1)]
        expiring = np.where(from_held, gone_held, gone_new)
        add_at = np.arange(arrivals) + np.cumsum(removes)
        total = arrivals + int(removes.sum())
        ops_at = np.empty(total, np.int64)
        signs = np.empty(total, np.int64)
        ops_at[add_at], signs[add_at] = base + np.arange(arrivals), 1
        ops_at[add_at[removes] - 1], signs[add_at[removes] - 1] = expiring[removes], -1
        # groups: (lane, group key) of every held event and arrival
        size = base + arrivals
        lane_of = np.empty(size, np.int64)
        if len(held_index):
            lane_of[held_index] = np.repeat(np.arange(count), held_count)
        lane_of[base:] = lane
        group_keys, group_codes = self._groups(columns, size)
        combined, codes = np.unique(lane_of[ops_at] * len(group_keys) + group_codes[ops_at], return_inverse=True)
        codes = codes.reshape(-1)
        keys = [group_keys[c % len(group_keys)] for c in combined.tolist()]
        owners = (combined // len(group_keys)).tolist()
        values = [None if index is None else columns[index].to_numpy()[ops_at] for index in self.arguments]
        ops = Ops(codes, signs, keys, values)
        add_ops = np.flatnonzero(signs > 0)
        results, appliers = [], []
        for slot, value in enumerate(values):
            stores = [(lanes[o][1][slot].states, key) for o, key in zip(owners, keys)]
            result, apply = compute(self.aggregators[slot], ops, value, stores)
            results.append(result[add_ops])
            appliers.append(apply)
        winners = self._winners(owner, codes[add_ops])
        out_columns = []
        for (kind, index), field in zip(self.columns, out_schema):
            if kind == "input":
                out_columns.append(batch.column(index).take(pa.array(winners)))
            else:
                out_columns.append(pa.array(results[index][winners], field.type))
        out = pa.RecordBatch.from_arrays(out_columns, schema=out_schema)
        for apply in appliers:
            apply()
        self._write_windows(lanes, everything, times, lane, rank, per_lane, held_index, held_offset, held_count, base)
        return out, times[winners], owner[winners], None

    def _write_windows(self, lanes, columns, times, lane, rank, per_lane, held_index, held_offset, held_count, base) -> None:
        """Every touched lane's window: its last n events, kept column-wise (the window settles
        them into events, EXPIRED clones as the event path keeps them, when something reads it)."""
        length = self.window.length
        kept = rank >= per_lane[lane] - length  # arrivals still held at the end
        new_index = np.flatnonzero(kept)
        new_lane = lane[new_index]
        # what each lane holds at the end, as global indices: its held events then arrivals, the last n
        total = held_count + per_lane
        held_lane = np.repeat(np.arange(len(lanes)), held_count)
        held_position = np.arange(len(held_index)) - np.repeat(held_offset, held_count)
        keep_held = (held_position >= total[held_lane] - length) & (per_lane[held_lane] > 0)
        final_lane = np.concatenate((held_lane[keep_held], new_lane))
        final_global = np.concatenate((held_index[keep_held], base + new_index))
        final_global = final_global[np.argsort(final_lane, kind="stable")]
        final_count = np.bincount(final_lane, minlength=len(lanes))
        final_bounds = np.concatenate(([0], np.cumsum(final_count))).tolist()
        touched = np.flatnonzero(per_lane > 0).tolist()
        if not touched:
            return
        take = pa.array(final_global)
        kept_columns = ([c.take(take) for c in columns[0]], columns[1][final_global])
        held = self._held
        for code in touched:
            window = lanes[code][0]
            first = final_bounds[code]
            window.count = final_bounds[code + 1] - first
            window.pending = self
            held[id(window)] = (kept_columns, first, window.count, None, None, None)

    def settle(self, window) -> None:
        """Make the events this kernel holds for `window` its queue again."""
        (columns, times), first, size = self._held[id(window)][:3]
        rows = zip(*[c.slice(first, size).to_pylist() for c in columns]) if columns else repeat((), size)
        queue = deque(map(StreamEvent, times[first : first + size].tolist(), rows, repeat(EXPIRED, size)))
        window.queue = queue
        window.pending = None
        self._held[id(window)] = ((columns, times), first, size, queue, queue[0] if queue else None, queue[-1] if queue else None)

    def _valid(self, window):
        """What this kernel holds for `window`, while the window holds just that, or None."""
        entry = self._held.get(id(window))
        if entry is None:
            return None
        if window.pending is self:
            return entry
        queue = window.queue
        if entry[3] is queue and len(queue) == entry[2] and (not queue or (queue[0] is entry[4] and queue[-1] is entry[5])):
            return entry
        return None

    def _held_columns(self, windows, batch, times):
        """Every column of every lane's held events, then the arrivals' (and their timestamps);
        where each lane's held events are (global index, offset into that index, count).

        A lane's held part comes from what the kernel kept after the last segment while the
        window still holds just that; else from its events."""
        width = batch.num_columns
        types = batch.schema.types
        counts = np.empty(len(windows), np.int64)
        generations: dict[int, list] = {}  # id(kept columns) -> [kept, firsts, sizes]
        sources = []  # per lane: (generation id or None, where its events start in that part)
        built = []
        for code, window in enumerate(windows):
            entry = self._valid(window)
            if entry is not None:
                kept, first, size = entry[:3]
                generation = generations.setdefault(id(kept), [kept, [], [], 0])
                sources.append((id(kept), generation[3]))
                generation[1].append(first)
                generation[2].append(size)
                generation[3] += size
                counts[code] = size
            else:
                queue = window.queue
                sources.append((None, len(built)))
                built.extend(queue)
                counts[code] = len(queue)
        pieces = [[] for _ in range(width)]
        stamps = []
        offsets, at = {}, 0
        for key, (kept, firsts, sizes, size) in generations.items():
            offsets[key] = at
            take = _ranges(np.array(firsts, np.int64), np.array(sizes, np.int64))
            for i in range(width):
                pieces[i].append(kept[0][i].take(pa.array(take)))
            stamps.append(kept[1][take])
            at += size
        offsets[None] = at
        if built:
            for i in range(width):
                pieces[i].append(pa.array([e.data[i] for e in built], types[i]))
            stamps.append(np.array([e.timestamp for e in built], np.int64))
        for i in range(width):
            pieces[i].append(batch.column(i))
        stamps.append(times)
        columns = [pa.concat_arrays(p) if len(p) > 1 else p[0] for p in pieces]
        starts = np.array([offsets[key] + start for key, start in sources], np.int64)
        held_index = _ranges(starts, counts)
        held_offset = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        return (columns, np.concatenate(stamps)), held_index, held_offset, counts

    def _groups(self, columns: dict[int, pa.Array], size: int) -> tuple[list, np.ndarray]:
        """Group keys, and the group code of every held event then every arrival (`size` in all)."""
        if self.group is None:
            return [None], np.zeros(size, np.int64)
        encoded = pc.dictionary_encode(columns[self.group])  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes it at import
        keys = encoded.dictionary.to_pylist()
        indices = encoded.indices
        if indices.null_count:
            keys.append(None)
            return keys, indices.fill_null(len(keys) - 1).to_numpy().astype(np.int64)
        return keys, indices.to_numpy().astype(np.int64)

    def _winners(self, owner: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """Arrivals that yield a row: per chunk, each group's last (in order of the group's first)."""
        count = len(owner)
        if self.group is None:
            last = np.flatnonzero(np.append(owner[1:] != owner[:-1], True))
            return last
        if np.all(owner[1:] != owner[:-1]):  # every chunk one arrival: every arrival wins
            return np.arange(count)
        combined = owner.astype(np.int64) * (int(codes.max(initial=0)) + 1) + codes
        _, first = np.unique(combined, return_index=True)
        _, last_reversed = np.unique(combined[::-1], return_index=True)
        last = count - 1 - last_reversed
        return last[np.argsort(first, kind="stable")]


def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """starts[0]..starts[0]+sizes[0]-1, then starts[1].., ... as one array."""
    total = int(sizes.sum())
    if not total:
        return np.zeros(0, np.int64)
    offsets = np.cumsum(sizes) - sizes
    return np.repeat(starts - offsets, sizes) + np.arange(total)


def analyse(receiver, window_class: type[_WindowT]) -> tuple[Sequence[Processor], _WindowT, list[int | None], list[tuple[str, int]], int | None] | None:
    """(filters, window, arguments, columns, group) of `from S[...]#window.<window_class>(...) select
    <attributes, sum/count/avg> [group by a]`, or None when `receiver` is not such a query."""
    query = plain_query(receiver)
    window = query.processors[-1] if query is not None and query.processors else None
    if query is None or not isinstance(window, window_class):
        return None
    filters = query.processors[:-1]
    if not all(isinstance(p, FilterProcessor) and p.vector is not None for p in filters):
        return None
    selector, node = query.selector, query.query.selector
    if not selector.batching or not selector.current_on or selector.expired_on or node.star:
        return None
    if selector.having is not None or selector.order_by or selector.limit is not None or selector.offset is not None:
        return None
    schema = window.context.schema
    if not schema.arrow_capable:
        return None
    aggregators = selector.aggregation.aggregators
    if not aggregators or not all(type(a) in SUPPORTED for a in aggregators):
        return None
    arguments = []
    for aggregator in aggregators:
        index = _attribute(aggregator.node.args[0], schema) if aggregator.node.args else None
        if aggregator.node.args and (index is None or schema.types[index] not in NUMERIC):
            return None
        arguments.append(index)
    columns = []  # per output attribute: ("input", index) or ("aggregate", index)
    for attribute, executor in zip(node.attributes, selector.executors):
        expression = attribute.expression
        if isinstance(expression, ast.Variable) and (index := _attribute(expression, schema)) is not None:
            columns.append(("input", index))
        elif isinstance(expression, ast.FunctionCall) and len(executor.aggregators) == 1:
            columns.append(("aggregate", aggregators.index(executor.aggregators[0])))
        else:
            return None
    group = None
    if node.group_by:
        if len(node.group_by) != 1:
            return None
        group = _attribute(node.group_by[0], schema)
        if group is None or schema.types[group] not in KEY_TYPES:
            return None
    return filters, window, arguments, columns, group


def _attribute(node, schema) -> int | None:
    return schema.index(node.name) if isinstance(node, ast.Variable) and node.index is None else None
