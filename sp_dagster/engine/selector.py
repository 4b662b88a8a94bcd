"""The query selector: projection, aggregation, group by, having, order by, limit, offset.
Mirrors Siddhi's QuerySelector, and like it processes a chunk in batch mode (one output per group
per chunk) except under a snapshot rate limiter.
"""

from __future__ import annotations

import functools
import operator

import pyarrow as pa

from sp_dagster.engine.aggregators import AggregationContext
from sp_dagster.engine.errors import app_error
from sp_dagster.engine.events import CURRENT, EXPIRED, RESET, ArrowChunk, StreamEvent
from sp_dagster.engine.executor import Vector
from sp_dagster.engine.expressions import Executor, OutputScope, Scope, compile_expression, materialize
from sp_dagster.engine.processors import Processor
from sp_dagster.engine.schema import Schema
from sp_dagster.engine.values import java_compare
from sp_dagster.siddhi import SiddhiQLError, ast


class Selector(Processor):
    """Turns input events into output rows and hands chunks to the rate limiter.

    In batch mode, with group by, one output per group (the group's last event, groups in
    first-seen order); with aggregators but no group by, one output per chunk (its last event);
    otherwise every event. Only the event types the output asks for (current, expired) are
    emitted; RESET events reset the aggregators.
    """

    def __init__(
        self,
        selector: ast.Selector,
        input_schema: Schema,
        scope: Scope,
        *,
        current_on: bool,
        expired_on: bool,
        track_future: bool,
    ):
        self.current_on = current_on
        self.expired_on = expired_on
        self._batching = True
        self.aggregation = AggregationContext(track_future)
        scope.aggregation = self.aggregation
        if selector.star:
            self.executors = [_input_attribute(i, t) for i, t in enumerate(input_schema.types)]
            names = list(input_schema.names)
        else:
            self.executors, names = [], []
            for attribute in selector.attributes:
                names.append(attribute.name)
                self.executors.append(compile_expression(attribute.expression, scope))
        self.output_schema = Schema(tuple(names), tuple(e.type for e in self.executors))
        scope.aggregation = None  # group by keys cannot aggregate
        self.group_by = [compile_expression(v, scope).row for v in selector.group_by]
        scope.aggregation = self.aggregation
        output_scope = OutputScope(self.output_schema, scope, self.aggregation)
        self.having = None
        if selector.having is not None:
            self.having = compile_expression(selector.having, output_scope).row
        self.order_by = []
        for order in selector.order_by:
            index = self.output_schema.index(order.variable.name)
            if index is not None:
                read = operator.itemgetter(index)
                self.order_by.append((lambda e, read=read: read(e.output), -1 if order.order == "desc" else 1))
                continue
            try:  # an input attribute that is not selected: Siddhi orders by the event's value
                read = compile_expression(order.variable, scope).row
            except SiddhiQLError:
                raise app_error(f"order by '{order.variable.name}': not an output attribute of this query", order) from None
            self.order_by.append((read, -1 if order.order == "desc" else 1))
        self.limit = _count(selector.limit, "limit")
        self.offset = _count(selector.offset, "offset")
        self.contains_aggregator = bool(self.aggregation.aggregators)
        self.rows = [e.row for e in self.executors]
        self.build_row = compile_row(self.executors, self.aggregation)  # an event's output row, in one compiled call
        arrows = [e.arrow for e in self.executors]
        vectorized = all(v is not None for v in arrows)
        #: the executors' vector functions (read only when accepts_arrow, which needs every one)
        self.vectors: list[Vector] = [v for v in arrows if v is not None] if vectorized else []
        self.accepts_arrow = (
            not self.contains_aggregator
            and not self.group_by
            and self.having is None
            and not self.order_by
            and self.limit is None
            and self.offset is None
            and current_on
            and vectorized
        )
        self._sort_key = functools.cmp_to_key(self._compare)
        self._choose()

    @property
    def batching(self) -> bool:
        """Batch mode (one output per group per chunk); a snapshot rate limiter turns it off."""
        return self._batching

    @batching.setter
    def batching(self, value: bool) -> None:
        self._batching = value
        self._choose()

    def _choose(self) -> None:
        """Bind _select to the form this selector's clauses call for (decided once, not per chunk)."""
        if self._batching:
            if self.group_by:
                select = self._batch_group_by if self.having is not None else self._batch_last
            elif self.contains_aggregator:
                select = self._batch_no_group_by if self.having is not None else self._batch_last_one
            else:
                select = self._no_group_by
        elif self.group_by:
            select = self._group_by
        else:
            select = self._no_group_by
        self._select = select

    # -- evaluation

    def _evaluate(self, event: StreamEvent, key=None) -> StreamEvent:
        if self.contains_aggregator:
            self.aggregation.apply(event, key)
        return self._row(event, key)

    def _row(self, event: StreamEvent, key) -> StreamEvent:
        return StreamEvent(event.timestamp, event.data, event.type, self.build_row(event), key)

    def _select(self, chunk) -> list | None:
        """The output of one chunk (bound in _choose)."""
        raise NotImplementedError

    def _keep(self, out: StreamEvent) -> bool:
        return self.having is None or self.having(out) is True

    def _wanted(self, kind: int) -> bool:
        return (kind == CURRENT and self.current_on) or (kind == EXPIRED and self.expired_on)

    def _group_key(self, event: StreamEvent):
        if len(self.group_by) == 1:
            return self.group_by[0](event)
        return tuple(g(event) for g in self.group_by)

    @staticmethod
    def _no_key(event: StreamEvent):
        return None

    # -- processing

    def process(self, chunk):
        out = self._select(chunk)
        if out:
            self.next.process(out)

    def process_chunks(self, chunks: list[list[StreamEvent]]) -> None:
        """Select each chunk on its own (as a batch), then pass everything on as one chunk."""
        out = []
        for chunk in chunks:
            out.extend(self._select(chunk) or ())
        if out:
            self.next.process(out)

    def process_arrow(self, chunk: ArrowChunk):
        rows = chunk.batch.num_rows
        columns = [materialize(v(chunk), rows, e.type) for v, e in zip(self.vectors, self.executors)]
        batch = pa.RecordBatch.from_arrays(columns, schema=self.output_schema.arrow_schema())
        self.next.process_arrow(ArrowChunk(batch, chunk.timestamps))

    def _no_group_by(self, chunk):
        out = []
        for event in chunk:
            kind = event.type
            if kind == CURRENT or kind == EXPIRED:
                result = self._evaluate(event)
                if self._wanted(kind) and self._keep(result):
                    out.append(result)
            elif kind == RESET:
                self.aggregation.reset()
                out.append(event)
        return self._order_offset_limit(out)

    def _group_by(self, chunk):
        out = []
        for event in chunk:
            kind = event.type
            if kind == CURRENT or kind == EXPIRED:
                key = self._group_key(event)
                result = self._evaluate(event, key)
                if self._wanted(kind) and self._keep(result):
                    if self.limit is None or len(out) < self.limit:
                        out.append(result)
            elif kind == RESET:
                self.aggregation.reset()
        return out

    def _batch_no_group_by(self, chunk):
        if self.having is None:
            return self._batch_last_one(chunk)
        last = None
        for event in chunk:
            kind = event.type
            if kind == CURRENT or kind == EXPIRED:
                result = self._evaluate(event)
                if self._keep(result) and self._wanted(kind):
                    last = result
            elif kind == RESET:
                self.aggregation.reset()
        if last is None:
            return None
        if (self.offset is None or self.offset == 0) and (self.limit is None or self.limit > 0):
            return [last]
        return None

    def _batch_group_by(self, chunk):
        if self.having is None:
            return self._batch_last(chunk)
        groups: dict = {}
        for event in chunk:
            kind = event.type
            if kind == CURRENT or kind == EXPIRED:
                key = self._group_key(event)
                result = self._evaluate(event, key)
                if self._keep(result) and self._wanted(kind):
                    groups[key] = result
            elif kind == RESET:
                self.aggregation.reset()
        if not groups:
            return None
        return self._order_offset_limit(list(groups.values()))

    def _batch_last_one(self, chunk):
        """_batch_last without group by: aggregate every event, the row of the last wanted one."""
        aggregation = self.aggregation
        processes = aggregation.processes
        current_on, expired_on = self.current_on, self.expired_on
        winner = None
        values: list = []
        applied = False
        for event in chunk:
            kind = event.type
            if kind == CURRENT or kind == EXPIRED:
                values = [process(event, None) for process in processes]
                applied = True
                if (kind == CURRENT and current_on) or (kind == EXPIRED and expired_on):
                    winner = (event, values)
            elif kind == RESET:
                aggregation.reset()
        if applied:
            aggregation.key, aggregation.values = None, values
        if winner is None or not ((self.offset is None or self.offset == 0) and (self.limit is None or self.limit > 0)):
            return None
        event, aggregation.values = winner
        return [StreamEvent(event.timestamp, event.data, event.type, self.build_row(event), None)]

    def _batch_last(self, chunk):
        """Batch mode without having: aggregate every event, build rows only for the winners
        (one per group with group by, else one per chunk)."""
        aggregation = self.aggregation
        processes = aggregation.processes
        current_on, expired_on = self.current_on, self.expired_on
        grouped = bool(self.group_by)
        group_key = (self.group_by[0] if len(self.group_by) == 1 else self._group_key) if grouped else self._no_key
        winners: dict = {}
        values: list = []
        key = None
        applied = False
        for event in chunk:
            kind = event.type
            if kind == CURRENT or kind == EXPIRED:
                key = group_key(event)
                values = [process(event, key) for process in processes]  # aggregation.apply, inline
                applied = True
                if (kind == CURRENT and current_on) or (kind == EXPIRED and expired_on):
                    winners[key] = (event, values)
            elif kind == RESET:
                aggregation.reset()
        if applied:
            aggregation.key, aggregation.values = key, values
        if not winners:
            return None
        build = self.build_row
        out = []
        for key, (event, values) in winners.items():
            aggregation.values = values
            out.append(StreamEvent(event.timestamp, event.data, event.type, build(event), key))
        if not grouped:
            if (self.offset is None or self.offset == 0) and (self.limit is None or self.limit > 0):
                return out
            return None
        if self.order_by or self.offset is not None or self.limit is not None:
            return self._order_offset_limit(out)
        return out

    def _order_offset_limit(self, out):
        if self.order_by and out:
            out = self._order(out)
        if self.offset is not None:
            out = self._apply_offset(out, self.offset)
        if self.limit is not None:
            out = self._apply_limit(out, self.limit)
        return out

    def _compare(self, a: StreamEvent, b: StreamEvent) -> int:
        for read, direction in self.order_by:
            x, y = read(a), read(b)
            if x is None or y is None:
                result = (x is not None) - (y is not None)
            else:
                result = java_compare(x, y)
            if result:
                return direction * result
        return 0

    def _order(self, out):
        # runs of one event type are sorted separately, as Siddhi does
        ordered, run = [], []
        for event in out:
            if run and run[-1].type != event.type:
                ordered.extend(sorted(run, key=self._sort_key))
                run = []
            run.append(event)
        ordered.extend(sorted(run, key=self._sort_key))
        return ordered

    def _apply_offset(self, out, offset: int):
        kept, skipped = [], 0
        for i, event in enumerate(out):
            if event.type in (CURRENT, EXPIRED):
                if skipped < offset:
                    if self._wanted(event.type):
                        skipped += 1
                    continue
                kept.extend(out[i:])
                break
            kept.append(event)
        return kept

    def _apply_limit(self, out, limit: int):
        kept, count = [], 0
        for event in out:
            kind = event.type
            if kind in (CURRENT, EXPIRED):
                # Siddhi's precedence: expired events pass whenever expired output is on
                if (limit > count and kind == CURRENT and self.current_on) or (kind == EXPIRED and self.expired_on):
                    count += 1
                    kept.append(event)
            else:
                kept.append(event)
        return kept

    # -- state

    def snapshot(self):
        return self.aggregation.snapshot()

    def restore(self, state) -> None:
        self.aggregation.restore(state)


def _input_attribute(index: int, kind: str) -> Executor:
    executor = Executor(kind, lambda e: e.data[index], lambda c: c.batch.column(index))
    executor.reads = ("data", index)
    return executor


def compile_row(executors: list[Executor], aggregation: AggregationContext):
    """One function from an event to its output row: `tuple(x.row(event) for x in executors)`,
    with plain reads (an input attribute, an aggregator's value) inlined instead of called."""
    names: dict = {"aggregation": aggregation}
    parts = []
    for position, executor in enumerate(executors):
        reads = executor.reads
        if reads is not None and reads[0] == "data":
            parts.append(f"d[{reads[1]}]")
        elif reads is not None and reads[0] == "values":
            parts.append(f"v[{reads[1]}]")
        else:
            names[f"f{position}"] = executor.row
            parts.append(f"f{position}(e)")
    lines = ["def build(e):"]
    if any(p.startswith("d[") for p in parts):
        lines.append("    d = e.data")
    if any(p.startswith("v[") for p in parts):
        lines.append("    v = aggregation.values")
    lines.append(f"    return ({''.join(p + ', ' for p in parts)})")
    exec("\n".join(lines), names)  # noqa: S102 (source made above from positions only)
    return names["build"]


def _count(node: ast.Expression | None, what: str) -> int | None:
    if node is None:
        return None
    if not isinstance(node, ast.Constant) or node.type not in ("int", "long"):
        raise app_error(f"{what} must be an integer constant", node)
    value = node.value
    assert isinstance(value, int)  # an int or long constant
    if value < 0:
        raise app_error(f"{what} cannot be negative, but found {value}", node)
    return value
