"""timeBatch(t) windows (in playback) and lengthBatch(n) windows under sum/count/avg selectors.
The clock moves only with the timestamps sent, so every batch boundary of a run is known up
front: the run is cut there and every closed batch's aggregates are computed at once
(batch.aggregators).
"""

from __future__ import annotations

from itertools import repeat

import numpy as np
import pyarrow as pa

from sp_dagster.engine.batch.aggregators import EXACT, Ops, _new_state, compute, integer_sum
from sp_dagster.engine.batch.base import Output, segment
from sp_dagster.engine.batch.windows.length import LengthAggregateKernel, analyse
from sp_dagster.engine.clock import TimerQueue
from sp_dagster.engine.events import RESET, StreamEvent
from sp_dagster.engine.windows.length import LengthBatchWindow
from sp_dagster.engine.windows.time import TimeBatchWindow


class TimeBatchAggregateKernel(LengthAggregateKernel):
    """`@app:playback ... from S[...]#window.timeBatch(t[, start]) select <attributes, sum/count/avg> [group by a]`.

    The event path keeps arrivals in the open batch; when the clock reaches the window's next
    emit time its timer flushes the batch: a RESET (the aggregates start over) then the batch's
    events, so the selector emits one row per group (the group's last event, groups in
    first-seen order) with the group's aggregates over the batch. Here each batch's rows are
    delivered when the clock move that fires its timer is: this kernel handles its own timer
    (`timers`), so send_each.py lets a segment run past it.
    """

    @classmethod
    def build(cls, receiver, runtime):
        if not runtime.playback:
            return None
        parts = analyse(receiver, TimeBatchWindow)
        if parts is None:
            return None
        window = parts[1]
        if window.stream_current or window.expired is not None or window.period <= 0:
            return None
        return cls(receiver, *parts)

    @property
    def timers(self) -> TimerQueue | None:
        """The timer queue this kernel fires itself."""
        return self.window.timers

    # -- what the event path would do differently

    def span(self, run) -> int:
        return run.count + 1

    def extent(self, run, start, end):
        window = self.window
        if window.next_emit == -1 or list(window.timers.times) != [window.next_emit] or window.clock.now() >= window.next_emit:
            return start  # the first event arms the timer (event path); anything else unusual too
        if not self.run_fits(run) or not self.window_fits(window, self.aggregators):
            return start
        return end

    def window_fits(self, window, aggregators) -> bool:
        if window.pending is self:
            held = self._open
            columns = held[0]
        else:
            columns = None
        for aggregator, index in zip(aggregators, self.arguments):
            if index is None:
                continue
            if columns is not None:
                values = columns[index].to_numpy()
                if integer_sum(aggregator) and len(values) and int(np.abs(values).sum()) >= EXACT // 2:
                    return False
                continue
            for event in window.current:
                value = event.data[index]
                if value is None or (value == 0 and isinstance(value, float) and np.signbit(value)):
                    return False
            if integer_sum(aggregator) and sum(abs(e.data[index]) for e in window.current) >= EXACT // 2:
                return False
        return True

    # -- the segment

    def run(self, run, start, end):
        window = self.window
        chunk, times, owner = segment(run, start, end, self.filters)
        batch = chunk.batch
        period, first_emit = window.period, window.next_emit
        clock = np.maximum.accumulate(np.maximum(run.chunk_times[start:end], window.clock.now()))
        passed = np.where(clock >= first_emit, (clock - first_emit) // period + 1, 0)  # boundaries passed by each chunk
        last = int(passed[-1])
        # the open batch so far, then the arrivals: batch number of every event
        held_columns, held_times = self._open_batch(batch)
        columns = [pa.concat_arrays([h, c]) for h, c in zip(held_columns, batch.columns)]
        all_times = np.concatenate((held_times, times))
        numbers = np.concatenate((np.zeros(len(held_times), np.int64), passed[owner - start]))
        closed = int(np.searchsorted(numbers, last, side="left"))  # events of batches that close here
        out, out_times, out_batch = self._closed(columns, all_times, numbers[:closed])
        out_owner = start + np.searchsorted(passed, out_batch, side="right")  # the chunk that fires the batch's timer
        # the state the event path leaves: the open batch, the next emit time armed, the aggregates of the last batch
        window.next_emit = first_emit + period * last
        window.timers.times.clear()
        window.timers.times.append(window.next_emit)
        self._open = ([c.slice(closed) for c in columns], all_times[closed:])
        window.pending = self
        return Output(self.query, out, out_times, out_owner)

    def _open_batch(self, batch):
        """The open batch (columns, timestamps) as this kernel left it, or from the window's events."""
        window = self.window
        if window.pending is self:
            return self._open
        events = window.current
        types = batch.schema.types
        columns = [pa.array([e.data[i] for e in events], types[i]) for i in range(batch.num_columns)]
        return columns, np.array([e.timestamp for e in events], np.int64)

    def _closed(self, columns, all_times, numbers):
        """Rows of the batches that close in the segment (events numbered by batch): rows,
        timestamps and the batch of every row."""
        out_schema = self.out_schema
        if not len(numbers):
            return pa.RecordBatch.from_pylist([], schema=out_schema), all_times[:0], numbers
        size = len(numbers)
        wanted = {i: columns[i].slice(0, size) for i in {self.group, *self.arguments} if i is not None}
        group_keys, group_codes = self._groups(wanted, size)
        combined, codes = np.unique(numbers * len(group_keys) + group_codes, return_inverse=True)
        codes = codes.reshape(-1)
        keys = [group_keys[c % len(group_keys)] for c in combined.tolist()]
        ops = Ops(codes, np.ones(size, np.int64), keys, [])
        fresh = [({}, code) for code in range(len(keys))]  # a RESET starts every batch over
        results = []
        counts = ops.running_int(np.zeros(len(keys), np.int64), np.ones(size, np.int64))
        for aggregator, index in zip(self.aggregators, self.arguments):
            value = None if index is None else wanted[index].to_numpy()
            result, _ = compute(aggregator, ops, value, fresh)
            results.append(result)
        winners = self._winners(numbers, codes)
        out_columns = []
        for (kind, index), field in zip(self.columns, out_schema):
            if kind == "input":
                out_columns.append(columns[index].take(pa.array(winners)))
            else:
                out_columns.append(pa.array(results[index][winners], field.type))
        out = pa.RecordBatch.from_arrays(out_columns, schema=out_schema)
        self._final_states(numbers, codes, keys, counts, wanted, ops)
        return out, all_times[winners], numbers[winners]

    def _final_states(self, numbers, codes, keys, counts, wanted, ops) -> None:
        """Every aggregator holds the groups of the last batch that closed (first-seen order)."""
        last_batch = numbers[-1]
        first = int(np.searchsorted(numbers, last_batch, side="left"))
        batch_codes = codes[first:]
        seen, order = np.unique(batch_codes, return_index=True)
        seen = seen[np.argsort(order, kind="stable")]
        ends = ops.ends[seen] - 1
        final_position = ops.order[ends]  # each group's last event
        for aggregator, index in zip(self.aggregators, self.arguments):
            if index is None:
                totals = repeat(0)
            elif integer_sum(aggregator):
                totals = ops.running_int(np.zeros(len(keys), np.int64), wanted[index].to_numpy().astype(np.int64))[final_position].tolist()
            else:
                totals = ops.running_float(np.zeros(len(keys), np.float64), wanted[index].to_numpy().astype(np.float64))[final_position].tolist()
            aggregator.states = {
                keys[code]: _new_state(aggregator, count, total) for code, count, total in zip(seen.tolist(), counts[final_position].tolist(), totals)
            }

    def settle(self, window) -> None:
        """Make the open batch this kernel holds the window's events again."""
        columns, times = self._open
        size = len(times)
        rows = zip(*[c.to_pylist() for c in columns]) if columns else repeat((), size)
        window.current = list(map(StreamEvent, times.tolist(), rows))
        window.reset = StreamEvent(window.current[0].timestamp, window.current[0].data, RESET) if size else None
        window.pending = None


class LengthBatchAggregateKernel(TimeBatchAggregateKernel):
    """`from S[...]#window.lengthBatch(n) select <attributes, sum/count/avg> [group by a]`: every
    n-th arrival flushes the batch, its rows one chunk of their own (as the window sends each flush)."""

    @classmethod
    def build(cls, receiver, runtime):
        parts = analyse(receiver, LengthBatchWindow)
        if parts is None:
            return None
        window = parts[1]
        if window.stream_current or window.expired is not None or window.length < 1:
            return None
        return cls(receiver, *parts)

    @property
    def timers(self) -> TimerQueue | None:
        """None: a length batch flushes on arrivals, with no timer to fire."""
        return None

    def extent(self, run, start, end):
        if not self.run_fits(run) or not self.window_fits(self.window, self.aggregators):
            return start
        return end

    def run(self, run, start, end):
        window = self.window
        chunk, times, owner = segment(run, start, end, self.filters)
        held_columns, held_times = self._open_batch(chunk.batch)
        columns = [pa.concat_arrays([h, c]) for h, c in zip(held_columns, chunk.batch.columns)]
        all_times = np.concatenate((held_times, times))
        held, length = len(held_times), window.length
        numbers = np.arange(len(all_times)) // length
        closed = len(all_times) // length * length  # events of batches that fill up here
        out, out_times, out_batch = self._closed(columns, all_times, numbers[:closed])
        out_owner = owner[(out_batch + 1) * length - 1 - held]  # the arrival that fills the batch
        window.count = len(all_times) - closed
        self._open = ([c.slice(closed) for c in columns], all_times[closed:])
        window.pending = self
        return Output(self.query, out, out_times, out_owner, out_batch)
