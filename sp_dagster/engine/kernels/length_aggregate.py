"""length(n) windows under sum/count/avg selectors (with or without group by), over a whole segment.

Per arrival the event path expires the oldest event when the window is full, then adds the
new one; the selector (batch mode) emits per chunk one row per group (the group's last
current event, groups in first-seen order), or one row per chunk without group by. Here the
adds and removes of a segment are laid out in that order once, the aggregates computed per
group at once (kernels.aggregates), and the winners of every chunk picked out.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sp_dagster.engine.events import EXPIRED, StreamEvent
from sp_dagster.engine.kernels.aggregates import EXACT, SUPPORTED, Ops, compute, integer_sum
from sp_dagster.engine.kernels.base import Kernel, Output, segment
from sp_dagster.engine.kernels.eligibility import plain_query
from sp_dagster.engine.processors import FilterProcessor
from sp_dagster.engine.windows.length import LengthWindow
from sp_dagster.siddhi import ast

#: Attribute types a group-by key may have here (their Python values are the keys).
KEY_TYPES = ("string", "int", "long", "bool")
NUMERIC = ("int", "long", "float", "double")


class LengthAggregateKernel(Kernel):
    """`from S[...]#window.length(n) select <attributes, sum/count/avg> [group by a]`."""

    @classmethod
    def build(cls, receiver, runtime):
        query = plain_query(receiver)
        if query is None or not query.processors or not isinstance(query.processors[-1], LengthWindow):
            return None
        filters, window = query.processors[:-1], query.processors[-1]
        if window.length < 1 or not all(isinstance(p, FilterProcessor) and p.vector is not None for p in filters):
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
        return cls(query, filters, window, arguments, columns, group)

    def __init__(self, query, filters, window, arguments, columns, group):
        super().__init__(query)
        self.filters = filters
        self.window = window
        self.arguments = arguments
        self.columns = columns
        self.group = group
        self.aggregators = query.selector.aggregation.aggregators

    # -- what the event path would do differently

    def extent(self, run, start, end):
        checked = run.cache.get(id(self))
        if checked is None:
            checked = run.cache[id(self)] = self._run_fits(run)
        return end if checked and self._window_fits() else start

    def _run_fits(self, run) -> bool:
        """No nulls where aggregates read, no -0.0, integer sums far from overflowing."""
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
            if integer_sum(aggregator) and len(values) and int(np.abs(values).max()) * (self.window.length + 1) >= EXACT:
                return False
        return True

    def _window_fits(self) -> bool:
        for aggregator, index in zip(self.aggregators, self.arguments):
            if index is None:
                continue
            for event in self.window.queue:
                value = event.data[index]
                if value is None or (value == 0 and isinstance(value, float) and np.signbit(value)):
                    return False
            if integer_sum(aggregator) and any(abs(s.sum) >= EXACT // 2 for s in aggregator.states.values()):
                return False
        return True

    # -- the segment

    def run(self, run, start, end):
        chunk, times, owner = segment(run, start, end, self.filters)
        arrivals = chunk.batch.num_rows
        out_schema = self.query.selector.output_schema.arrow_schema()
        if arrivals == 0:
            return Output(self.query, pa.RecordBatch.from_pylist([], schema=out_schema), times[:0], owner[:0])
        window = self.window
        held = list(window.queue)
        length, q = window.length, len(held)
        # adds of every arrival; a remove before each arrival that finds the window full
        full_from = max(0, min(arrivals, length - q))
        expiring = np.arange(full_from, arrivals) + q - length  # positions in held+arrivals
        adds = np.arange(arrivals) + q
        ops_at = np.concatenate((adds[:full_from], np.column_stack((expiring, adds[full_from:])).ravel()))
        signs = np.concatenate((np.ones(full_from, np.int64), np.tile(np.array([-1, 1], np.int64), arrivals - full_from)))
        add_ops = np.flatnonzero(signs > 0)
        columns_now = self._held_columns(window.queue, chunk.batch)  # held events then arrivals
        keys, codes = self._groups(columns_now, q + arrivals)
        groups = codes[ops_at]
        values = [None if index is None else columns_now[index].to_numpy()[ops_at] for index in self.arguments]
        ops = Ops(groups, signs, keys, values)
        results, appliers = [], []
        for aggregator, value in zip(self.aggregators, values):
            result, apply = compute(aggregator, ops, value)
            results.append(result[add_ops])
            appliers.append(apply)
        winners = self._winners(owner, codes[q:])
        columns = []
        for (kind, index), field in zip(self.columns, out_schema):
            if kind == "input":
                columns.append(chunk.batch.column(index).take(pa.array(winners)))
            else:
                columns.append(pa.array(results[index][winners], field.type))
        out = pa.RecordBatch.from_arrays(columns, schema=out_schema)
        # the state the event path leaves: the window's last n events, every group's aggregates
        for apply in appliers:
            apply()
        kept = min(length, arrivals)
        tail = chunk.batch.slice(arrivals - kept, kept)
        tail_rows = zip(*[c.to_pylist() for c in tail.columns]) if tail.num_columns else [()] * kept
        queue = deque(held[max(0, q + arrivals - length) :])
        queue.extend(map(StreamEvent, times[arrivals - kept :].tolist(), tail_rows, repeat(EXPIRED, kept)))
        window.queue = queue
        self._held = (queue, queue[0], queue[-1], {i: c.slice(len(c) - len(queue)) for i, c in columns_now.items()})
        window.count = min(length, window.count + arrivals)
        return Output(self.query, out, times[winners], owner[winners])

    def _held_columns(self, queue, batch) -> dict[int, pa.Array]:
        """The group and argument columns of the held events followed by the arrivals'.

        The held part is kept from the last segment while the window still holds exactly what
        that segment left (the event path appends new event objects, so identity tells)."""
        wanted = {i for i in (self.group, *self.arguments) if i is not None}
        cached = getattr(self, "_held", None)
        if cached is not None and cached[0] is queue and queue and queue[0] is cached[1] and queue[-1] is cached[2]:
            held = cached[3]
        else:
            types = batch.schema.types
            held = {i: pa.array([e.data[i] for e in queue], types[i]) for i in wanted}
        return {i: pa.concat_arrays([held[i], batch.column(i)]) for i in wanted}

    def _groups(self, columns: dict[int, pa.Array], size: int) -> tuple[list, np.ndarray]:
        """Group keys, and the group code of every held event then every arrival (`size` in all)."""
        if self.group is None:
            return [None], np.zeros(size, np.int64)
        encoded = pc.dictionary_encode(columns[self.group])
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


def _attribute(node, schema) -> int | None:
    return schema.index(node.name) if isinstance(node, ast.Variable) and node.index is None else None


