"""`every e1=S[c1] -> e2=S[c2] [within t]` on one stream, over a whole segment.
Every e1 of a segment is found at once (c1 as a vector) and the partials scan forward together
among the events that can complete them: those of their partition key (lanes) or of their value
of an attribute c2 requires equal to e1's (an equality index).
"""

from __future__ import annotations

import operator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sp_dagster.engine.batch.base import Kernel, Output
from sp_dagster.engine.events import StreamEvent
from sp_dagster.engine.patterns import Partial, PatternInput, PatternProcessor
from sp_dagster.engine.query import QueryOutput
from sp_dagster.engine.ratelimit import PassThrough
from sp_dagster.siddhi import ast
from sp_dagster.siddhi.types import widest

INTEGER, FLOATING = ("int", "long"), ("float", "double")
_OPS = {"==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt, ">=": operator.ge, "<=": operator.le}


class PatternKernel(Kernel):
    """A two-state `every e1 -> e2` pattern on one stream, selecting attributes of e1 and e2.

    The event path keeps a list of partial matches: one per e1 taken so far (oldest first), then a
    fresh one waiting for an e1. Each event first drops the partials older than `within`, then
    every partial waiting for e2 whose c2 holds for (e1, event) completes (oldest first: one
    output chunk per event), and if c1 holds the event becomes a new e1. So each e1 completes
    with the first later event that passes c2 before it expires. Here the partials scan forward
    together, one step per round, among the events that can complete them: those of its own
    partition key (lanes, when the pattern is inside a partition), or of its own value of an
    attribute c2 requires equal to e1's (`symbol == e1.symbol`, an equality index). Runs with
    nulls where the kernel reads, or with timestamps that go back, are left to the event path.
    """

    @classmethod
    def build(cls, receiver, runtime):
        if not isinstance(receiver, PatternInput) or not receiver.together:
            return None
        query = next((q for q in runtime.queries.values() if any(r is receiver for _, r in q.subscriptions)), None)
        return cls.of(query, runtime) if query is not None else None

    @classmethod
    def of(cls, query, runtime):
        """The kernel of pattern query `query` (a QueryRuntime), or None when it has another shape."""
        processor = query.processors[0] if query.processors else None
        if not isinstance(processor, PatternProcessor) or processor.sequence or processor.timers:
            return None
        node = query.query.input
        element = node.element
        if not isinstance(element, ast.StateChain) or len(element.elements) != 2:
            return None
        first, second = element.elements
        if not isinstance(first, ast.EveryState) or not isinstance(first.element, ast.StreamState) or not isinstance(second, ast.StreamState):
            return None
        first = first.element
        for state in (first, second):
            if state.quantifier is not None or state.stream.inner or any(not isinstance(h, ast.Filter) for h in state.stream.handlers):
                return None
        if first.stream.stream != second.stream.stream or first.event is None or first.event == second.event:
            return None
        if first.stream.stream in (first.event, second.event):
            return None  # a name that is both a stream and an event: the scope's first state
        if query.query.rate is not None or not isinstance(query.limiter, PassThrough) or type(query.output) is not QueryOutput:
            return None
        selector, selected = query.selector, query.query.selector
        if selector.contains_aggregator or selector.group_by or selector.having is not None or selected.star:
            return None
        if selector.order_by or selector.limit is not None or selector.offset is not None or not selector.current_on or selector.expired_on:
            return None
        schema = processor.states[0].schema
        if not schema.arrow_capable:
            return None
        names = {first.event: 0}
        if second.event is not None:
            names[second.event] = 1
        compiler = _Compiler(schema, names)
        c1 = compiler.condition(first.stream.handlers, own=0)
        c2 = compiler.condition(second.stream.handlers, own=1)
        if c1 is None or c2 is None:
            return None
        columns = []
        for attribute in selected.attributes:
            target = _selected(attribute.expression, schema, names)
            if target is None:
                return None
            columns.append(target)
        within = node.within.millis if node.within is not None else None
        return cls(query, processor, compiler, c1, c2, columns, within, _equality(second.stream.handlers, schema, names))

    def __init__(self, query, processor, compiler, c1, c2, columns, within, equal):
        super().__init__(query)
        self.processor = processor
        self.compiler = compiler
        self.c1, self.c2 = c1, c2
        self.columns = columns  # per output attribute: (0: e1 / 1: e2, attribute index)
        self.within = within
        self.equal = equal  # an attribute c2 needs equal in e1 and e2 (the index), or None
        self.filters = []
        self.out_schema = query.selector.output_schema.arrow_schema()
        self.read = sorted(compiler.read | {i for _, i in columns} | ({equal} if equal is not None else set()))

    @classmethod
    def inner(cls, query, runtime):
        """The kernel of a partition's inner query `query`, or None."""
        return cls.of(query, runtime)

    def lane(self, query):
        """What one instance of the query keeps: its pattern processor."""
        return query.processors[0]

    # -- what the event path would do differently

    def run_fits(self, run) -> bool:
        """No nulls where the kernel reads, timestamps that never go back (once per run)."""
        checked = run.cache.get(id(self))
        if checked is None:
            batch = run.batch()
            checked = not any(batch.column(i).null_count for i in self.read) and bool(np.all(run.times[1:] >= run.times[:-1]))
            run.cache[id(self)] = checked
        return checked

    def lane_fits(self, processor, run=None) -> bool:
        """The processor holds what this kernel understands: e1 partials (oldest first), then a fresh one."""
        pending = processor.pending
        if not pending or pending[-1][1] != 0 or not processor.is_fresh(pending[-1][0]):
            return False
        first = int(run.times[0]) if run is not None and run.count else None
        for partial, step in pending[:-1]:
            if step != 1 or len(partial.slots[0]) != 1 or partial.slots[1] or partial.start is None:
                return False
            data = partial.slots[0][0].data
            if any(data[i] is None for i in self.read) or (first is not None and partial.start > first):
                return False
        return True

    def extent(self, run, start, end):
        return end if self.run_fits(run) and self.lane_fits(self.processor, run) else start

    def run(self, run, start, end):
        lo, hi = int(run.bounds[start]), int(run.bounds[end])
        batch = run.batch().slice(lo, hi - lo)
        owner = np.repeat(np.arange(start, end), np.diff(run.bounds[start : end + 1]))
        out, times, owners, split = self.compute(batch, run.times[lo:hi], owner, None, [self.processor])
        return Output(self.query, out, times, owners, split)

    def compute(self, batch: pa.RecordBatch, times: np.ndarray, owner: np.ndarray, lane: np.ndarray | None, lanes: list):
        """Outputs (batch, timestamps, owner, event) of the events of `batch`, event i going to the
        processor `lanes[lane[i]]` (one processor when `lane` is None); processors left as the event path leaves them."""
        count = batch.num_rows
        lane = np.zeros(count, np.int64) if lane is None else lane
        # held e1 partials (per processor, oldest first), then the segment's events
        held = [(code, partial) for code, processor in enumerate(lanes) for partial, _ in processor.pending[:-1]]
        width = batch.num_columns
        types = batch.schema.types
        held_columns = [pa.array([p.slots[0][0].data[i] for _, p in held], types[i]) for i in range(width)]
        table = pa.RecordBatch.from_arrays([pa.concat_arrays([h, c]) for h, c in zip(held_columns, batch.columns)], schema=batch.schema)
        base = len(held)
        values = self.compiler.arrays(table, self.read)
        all_times = np.concatenate((np.array([p.start for _, p in held], np.int64), times))
        # every e1: held ones, then the segment's events that pass c1 (creation order)
        events = np.arange(base, base + count)
        passed = np.flatnonzero(_mask(self.c1(values, None, events), count))
        e1 = np.concatenate((np.arange(base), base + passed))
        e1_lane = np.concatenate((np.array([code for code, _ in held], np.int64), lane[passed]))
        # where each partial looks next: the events of its lane (and of its value of the equality attribute)
        scope = lane if self.equal is None else lane * (int(values[self.equal].max(initial=0)) + 1) + values[self.equal][base:]
        scope_e1 = e1_lane if self.equal is None else e1_lane * (int(values[self.equal].max(initial=0)) + 1) + values[self.equal][e1]
        order = np.argsort(scope, kind="stable")
        sorted_scope = scope[order]
        position = np.empty(count, np.int64)
        position[order] = np.arange(count)
        pointer = np.concatenate((np.searchsorted(sorted_scope, scope_e1[:base], side="left"), position[passed] + 1))
        matched = np.full(len(e1), -1, np.int64)
        expired = np.zeros(len(e1), bool)
        active = np.arange(len(e1))
        while len(active):
            at = pointer[active]
            inside = at < count
            inside[inside] = sorted_scope[at[inside]] == scope_e1[active[inside]]
            active, at = active[inside], at[inside]
            if not len(active):
                break
            candidate = order[at]
            if self.within is not None:
                late = all_times[base + candidate] - all_times[e1[active]] > self.within
                expired[active[late]] = True
                active, at, candidate = active[~late], at[~late], candidate[~late]
            hit = _mask(self.c2(values, e1[active], base + candidate), len(active))
            matched[active[hit]] = candidate[hit]
            active = active[~hit]
            pointer[active] = at[~hit] + 1
        out, out_times, out_owner, out_event = self._rows(table, all_times, e1, matched, base, owner)
        self._write_back(lanes, held, e1, e1_lane, matched, expired, table, all_times, base, lane, times)
        return out, out_times, out_owner, out_event

    def _rows(self, table, all_times, e1, matched, base, owner):
        """One row per completed partial, by completing event, oldest e1 first."""
        done = np.flatnonzero(matched >= 0)
        done = done[np.lexsort((done, matched[done]))]
        first, second = e1[done], base + matched[done]
        columns = []
        for (slot, index), _field in zip(self.columns, self.out_schema):
            columns.append(table.column(index).take(pa.array(first if slot == 0 else second)))
        out = pa.RecordBatch.from_arrays(columns, schema=self.out_schema)
        return out, np.maximum(all_times[first], all_times[second]), owner[matched[done]], matched[done]

    def _write_back(self, lanes, held, e1, e1_lane, matched, expired, table, all_times, base, lane, times) -> None:
        """Every processor's partials: the e1s neither completed nor expired (oldest first), then a fresh one."""
        alive = (matched < 0) & ~expired
        last = np.full(len(lanes), np.iinfo(np.int64).min)
        np.maximum.at(last, lane, times)  # the last event each processor saw (timestamps never go back)
        if self.within is not None:  # which drops what is older than `within` before it is processed
            seen = last[e1_lane] != np.iinfo(np.int64).min
            alive &= ~(seen & (last[e1_lane] - all_times[e1] > self.within))
        keep = np.flatnonzero(alive)
        new = keep[keep >= len(held)]
        made = dict(zip(new.tolist(), zip(*table.take(pa.array(e1[new])).to_pydict().values()))) if len(new) else {}
        pending = [[] for _ in lanes]
        for index in keep.tolist():
            if index < len(held):
                partial = held[index][1]
            else:
                at = int(all_times[e1[index]])
                partial = Partial([[StreamEvent(at, made[index])], []], at, at)
            pending[int(e1_lane[index])].append((partial, 1))
        for code in np.flatnonzero(last != np.iinfo(np.int64).min).tolist():
            processor = lanes[code]
            processor.pending = pending[code] + [processor.pending[-1]]
            processor.now = int(last[code])


def _mask(value, size: int) -> np.ndarray:
    array = np.asarray(value, bool)
    return np.broadcast_to(array, (size,)) if array.ndim == 0 else array


def _selected(expression, schema, names) -> tuple[int, int] | None:
    """(state, attribute) of a selected `e1.x` / `e2.x` / `x` (the first state's)."""
    if not isinstance(expression, ast.Variable) or expression.index is not None:
        return None
    index = schema.index(expression.name)
    if index is None:
        return None
    if expression.stream is None:
        return 0, index
    slot = names.get(expression.stream)
    return None if slot is None else (slot, index)


def _equality(handlers, schema, names) -> int | None:
    """An attribute the second state's filters need equal to e1's (`x == e1.x` at the top level)."""
    for handler in handlers:
        for term in _conjuncts(handler.condition):
            if isinstance(term, ast.BinaryOp) and term.op == "==":
                left, right = term.left, term.right
                if (
                    isinstance(left, ast.Variable)
                    and isinstance(right, ast.Variable)
                    and left.index is None
                    and right.index is None
                    and right.name == left.name
                ):
                    refs = {names.get(s.stream, 1) if s.stream is not None else 1 for s in (left, right)}
                    index = schema.index(left.name)
                    if refs == {0, 1} and index is not None and schema.types[index] in ("string", "int", "long", "bool"):
                        return index
    return None


def _conjuncts(node):
    if isinstance(node, ast.BinaryOp) and node.op == "and":
        yield from _conjuncts(node.left)
        yield from _conjuncts(node.right)
    else:
        yield node


class _Compiler:
    """Conditions as vectors over (e1, candidate) pairs of rows of one table, compared as the
    event path compares (numbers widened as Java widens them)."""

    def __init__(self, schema, names):
        self.schema = schema
        self.names = names
        self.read: set[int] = set()
        self.strings: dict[int, list] = {}

    def arrays(self, table: pa.RecordBatch, read) -> dict[int, np.ndarray]:
        """The columns conditions read: numbers as they compare, strings as codes of one dictionary."""
        arrays = {}
        for index in read:
            column = table.column(index)
            kind = self.schema.types[index]
            if kind == "string":
                encoded = pc.dictionary_encode(column)  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes it at import
                arrays[index] = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
                arrays[("dictionary", index)] = {v: i for i, v in enumerate(encoded.dictionary.to_pylist())}
            elif kind in FLOATING:
                arrays[index] = column.to_numpy(zero_copy_only=False).astype(np.float64)
            elif kind == "bool":
                arrays[index] = column.to_numpy(zero_copy_only=False).astype(bool)
            else:
                arrays[index] = column.to_numpy(zero_copy_only=False).astype(np.int64)
        return arrays

    def condition(self, handlers, own: int):
        """f(arrays, e1 rows, candidate rows) -> bool vector for the filters of state `own`, or None."""
        parts = [self._compile(h.condition, own) for h in handlers]
        if any(p is None or p[0] != "bool" for p in parts):
            return None
        functions = [p[1] for p in parts]
        if not functions:
            return lambda a, i, j: True
        if len(functions) == 1:
            return functions[0]
        return lambda a, i, j: np.logical_and.reduce([f(a, i, j) for f in functions])

    def _compile(self, node, own):
        """(type, f) or None."""
        if isinstance(node, ast.Constant):
            if node.value is None:
                return None
            return ("constant", node.type, node.value)
        if isinstance(node, ast.Variable):
            if node.index is not None:
                return None
            index = self.schema.index(node.name)
            if index is None or self.schema.types[index] not in (*INTEGER, *FLOATING, "string", "bool"):
                return None
            slot = own if node.stream is None else self.names.get(node.stream)
            if slot is None or (slot == 1 and own == 0):
                return None
            self.read.add(index)
            kind = self.schema.types[index]
            pick = (lambda a, i, j: a[index][j]) if slot == own else (lambda a, i, j: a[index][i])
            return (kind, pick, index)
        if isinstance(node, ast.Not):
            inner = self._compile(node.operand, own)
            if inner is None or inner[0] != "bool" or len(inner) != 2:
                return None
            f = inner[1]
            return ("bool", lambda a, i, j: np.logical_not(f(a, i, j)))
        if isinstance(node, ast.BinaryOp) and node.op in ("and", "or"):
            left, right = self._compile(node.left, own), self._compile(node.right, own)
            if left is None or right is None or left[0] != "bool" or right[0] != "bool" or len(left) != 2 or len(right) != 2:
                return None
            lf, rf = left[1], right[1]
            combine = np.logical_and if node.op == "and" else np.logical_or
            return ("bool", lambda a, i, j: combine(lf(a, i, j), rf(a, i, j)))
        if isinstance(node, ast.BinaryOp) and node.op in _OPS:
            return self._comparison(node, own)
        return None

    def _comparison(self, node, own):
        left, right = self._compile(node.left, own), self._compile(node.right, own)
        if left is None or right is None:
            return None
        if left[0] == "constant" and right[0] == "constant":
            return None
        test = _OPS[node.op]
        lk = left[1] if left[0] == "constant" else left[0]
        rk = right[1] if right[0] == "constant" else right[0]
        numeric = (*INTEGER, *FLOATING)
        if lk in numeric and rk in numeric:
            wide = widest(lk, rk)
            if wide == "float" and (lk in INTEGER and left[0] != "constant" or rk in INTEGER and right[0] != "constant"):
                return None  # an int column widened to a 32-bit float: not what numpy compares
            dtype = np.float64 if wide in FLOATING else np.int64
            lf, rf = self._operand(left, wide), self._operand(right, wide)
            if lf is None or rf is None:
                return None
            return ("bool", lambda a, i, j: test(np.asarray(lf(a, i, j), dtype), np.asarray(rf(a, i, j), dtype)))
        if lk != rk or node.op not in ("==", "!="):
            return None
        if lk == "bool":
            lf, rf = self._operand(left, "bool"), self._operand(right, "bool")
            assert lf is not None and rf is not None  # a bool column, or a bool constant: both have operands
            return ("bool", lambda a, i, j: test(lf(a, i, j), rf(a, i, j)))
        if lk != "string":
            return None
        # strings: codes of one dictionary (a constant not in it matches nothing)
        if left[0] == "constant" or right[0] == "constant":
            variable, constant = (right, left[2]) if left[0] == "constant" else (left, right[2])
            vf, index = variable[1], variable[2]
            return ("bool", lambda a, i, j: test(vf(a, i, j), a[("dictionary", index)].get(constant, -1)))
        lf, rf = left[1], right[1]
        if left[2] != right[2]:
            return None  # two string attributes: codes of different dictionaries
        return ("bool", lambda a, i, j: test(lf(a, i, j), rf(a, i, j)))

    @staticmethod
    def _operand(part, wide):
        if part[0] == "constant":
            value = part[2]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return None if wide != "bool" or not isinstance(value, bool) else (lambda a, i, j: value)
            if wide == "float":
                from sp_dagster.engine.values import f32

                value = f32(float(value))
            elif wide == "double":
                value = float(value)
            return lambda a, i, j: value
        return part[1]
