"""Sequential batch sends: a run of sends to one stream, with exactly the outputs of sending them one by one.
`AppRuntime.send_each` lands here. Subscribers with a kernel (sp_dagster.engine.batch) compute a
segment of chunks at once (_fast); without kernels every chunk takes the event path (_reference).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from sp_dagster.engine.batch import plan_stream
from sp_dagster.engine.errors import EngineError
from sp_dagster.engine.events import ArrowChunk, StreamEvent


class Run:
    """The rows, timestamps and send/chunk boundaries of one sequential batch send.

    A run is cut into *chunks*, what operators and callbacks see: each send is one chunk, and in
    playback a send whose rows carry different timestamps is cut at every change of timestamp,
    as `AppRuntime.send` cuts it.
    """

    def __init__(self, rows: list[tuple] | None, batch: pa.RecordBatch | None, times: np.ndarray, sizes: np.ndarray, playback: bool, schema: pa.Schema | None):
        self.arrow_schema = schema
        self.cache: dict = {}  # what kernels work out once per run
        self._rows = rows
        self._batch = batch
        self.times = times
        self.count = len(times)
        if len(sizes) == self.count:  # every row its own send: every row its own chunk
            starts = np.arange(self.count, dtype=np.int64)
            self.send_of, self.opens = starts, np.ones(self.count, bool)
        else:
            send_starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
            if playback and self.count:
                changes = np.flatnonzero(times[1:] != times[:-1]) + 1
                starts = np.union1d(send_starts, changes)
            else:
                starts = send_starts
            self.send_of = np.searchsorted(send_starts, starts, side="right") - 1
            self.opens = np.isin(starts, send_starts)
        #: first row of every chunk (and one past the last row at the end); the send each chunk
        #: belongs to (send_of); True where a chunk is a send's first (opens)
        self.bounds = np.append(starts, self.count).astype(np.int64)
        self.chunk_times = times[starts] if self.count else times[:0]

    @property
    def chunks(self) -> int:
        """How many chunks the run has."""
        return len(self.bounds) - 1

    @property
    def rows(self) -> list[tuple]:
        """The rows as tuples (built once)."""
        if self._rows is None:
            assert self._batch is not None  # a run is made from its rows or its batch
            columns = [column.to_pylist() for column in self._batch.columns]
            self._rows = list(zip(*columns)) if columns else [()] * self.count
        return self._rows

    def batch(self) -> pa.RecordBatch:
        """The rows as one Arrow record batch (built once; only for streams with an Arrow form)."""
        if self._batch is None:
            arrow_schema = self.arrow_schema
            assert arrow_schema is not None  # only a stream with an Arrow form is batched
            columns = list(zip(*self._rows)) if self._rows else [[] for _ in arrow_schema]
            arrays = [pa.array(list(column), type=field.type) for column, field in zip(columns, arrow_schema)]
            self._batch = pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)
        return self._batch

    def events(self, chunk: int) -> list[StreamEvent]:
        """Chunk `chunk` as StreamEvents (what a subscriber without a kernel receives)."""
        start, end = int(self.bounds[chunk]), int(self.bounds[chunk + 1])
        rows, times = self.rows, self.times
        return [StreamEvent(int(times[i]), rows[i]) for i in range(start, end)]


def send_each(
    runtime,
    stream: str,
    rows: Sequence[Sequence] | pa.RecordBatch,
    timestamps: Sequence[int] | pa.Array | np.ndarray | None,
    sizes: Sequence[int] | np.ndarray | None = None,
    before: Callable[[int], None] | None = None,
) -> None:
    """Send a run of sends to `stream` (see AppRuntime.send_each)."""
    schema = runtime.schema(stream)
    junction = runtime.context.junctions[stream]
    rows_list, batch = runtime.conform(stream, schema, rows)
    count = batch.num_rows if batch is not None else len(rows_list)
    sizes_array = np.ones(count, np.int64) if sizes is None else np.asarray(sizes, dtype=np.int64)
    if sizes_array.size and (sizes_array.min() < 1 or int(sizes_array.sum()) != count):
        raise EngineError(f"send sizes must be positive and add up to the {count} rows sent to '{stream}'")
    if count == 0:
        return
    at_once = before is None  # nobody needs to hear when a send starts: blind segments may go whole

    def mark(index: int) -> None:
        runtime.send_index = index  # what collectors that are not handed `sends` read
        if before is not None:
            before(index)

    with runtime.lock:
        try:
            _run(runtime, stream, junction, schema, rows_list, batch, timestamps, sizes_array, mark, at_once)
        finally:
            runtime.send_index = None


def _run(runtime, stream, junction, schema, rows_list, batch, timestamps, sizes_array, before, at_once: bool) -> None:
    count = int(sizes_array.sum())
    if not runtime.started:  # the first send starts the app: what that fires is send 0's
        before(0)
        first, before = before, (lambda i: i and first(i))
        runtime.start()
    if timestamps is None:
        times = np.full(count, runtime.clock.now(), np.int64)
    else:
        times = np.asarray(timestamps.to_numpy(zero_copy_only=False) if isinstance(timestamps, (pa.Array, pa.ChunkedArray)) else timestamps, dtype=np.int64)
        if len(times) != count:
            raise EngineError(f"{count} events but {len(times)} timestamps sent to '{stream}'")
    run = Run(rows_list, batch, times, sizes_array, runtime.playback, schema.arrow_schema() if schema.arrow_capable else None)
    plan = plan_stream(runtime, junction) if schema.arrow_capable else None
    if plan is None:
        _reference(runtime, junction, run, before)
    else:
        _fast(runtime, junction, run, plan, before, at_once)


def _reference(runtime, junction, run: Run, before) -> None:
    """Every chunk through the event-at-a-time path, in order."""
    clock, playback = runtime.clock, runtime.playback
    send_of, opens, times = run.send_of, run.opens, run.chunk_times
    for chunk in range(run.chunks):
        if opens[chunk]:
            before(int(send_of[chunk]))
        if playback:
            clock.advance(int(times[chunk]))
        junction.send(run.events(chunk))


def _fast(runtime, junction, run: Run, plan, before, at_once: bool) -> None:
    """Segments of chunks through the kernels, delivered chunk by chunk (or at once where nobody can tell).

    The kernels compute their outputs for a *segment* of chunks at once, leaving their state
    exactly as the event path would; then, chunk by chunk, the clock moves, `before(i)` is called
    when a send starts, and every subscriber's output for that chunk is delivered in subscription
    order (subscribers without a kernel get the chunk itself), then the stream's callbacks. In
    playback a segment never reaches past a timer that falls due, so no timer fires inside it
    except ones armed by what the delivery itself runs (other queries, by the event path).
    """
    clock, playback = runtime.clock, runtime.playback
    chunk, total = 0, run.chunks
    advancing = _advancing(run, clock.now()) if playback else None
    while chunk < total:
        end = total
        if playback:
            end = _segment_end(run, advancing, chunk, plan.next_due(clock))
        if end > chunk:
            end = plan.extent(run, chunk, end)
        if end <= chunk:
            if run.opens[chunk]:
                before(int(run.send_of[chunk]))
            if playback:
                clock.advance(int(run.chunk_times[chunk]))
            junction.send(run.events(chunk))
            chunk += 1
            continue
        outputs = plan.run(run, chunk, end)
        if at_once and plan.blind(junction):
            _deliver_at_once(runtime, junction, run, plan, outputs, chunk, end)
        else:
            _deliver(runtime, junction, run, plan, outputs, chunk, end, before)
        chunk = end


def _advancing(run: Run, now: int) -> tuple[np.ndarray, np.ndarray]:
    """Chunks whose timestamp moves the playback clock forward (their times increase strictly)."""
    times = run.chunk_times
    previous = np.maximum.accumulate(np.concatenate(([now], times[:-1])))
    index = np.flatnonzero(times > previous)
    return index, times[index]


def _segment_end(run: Run, advancing, chunk: int, due: int | None) -> int:
    """The first chunk at or after `chunk` whose clock move makes a timer fall due (or the end)."""
    if due is None:
        return run.chunks
    index, times = advancing
    first = np.searchsorted(index, chunk)
    hit = first + np.searchsorted(times[first:], due, side="left")
    return int(index[hit]) if hit < len(index) else run.chunks


def _deliver(runtime, junction, run: Run, plan, outputs, start: int, end: int, before) -> None:
    clock, playback = runtime.clock, runtime.playback
    receivers = list(junction.receivers)
    callbacks = junction.callbacks
    timed = [outputs[key] for key in plan.timed]  # what a kernel's own timers emit, as the clock moves
    for chunk in range(start, end):
        if run.opens[chunk]:
            before(int(run.send_of[chunk]))
        if playback:
            clock.advance(int(run.chunk_times[chunk]))
            for output in timed:
                output.deliver(chunk)
        events = None
        for receiver in receivers:
            output = outputs.get(id(receiver))
            if output is not None:
                output.deliver(chunk)
            else:
                if events is None:
                    events = run.events(chunk)
                receiver.receive(events)
        if callbacks:
            if events is None:
                events = run.events(chunk)
            for callback in callbacks:
                callback.receive(events)


def _deliver_at_once(runtime, junction, run: Run, plan, outputs, start: int, end: int) -> None:
    """Nobody can tell chunks apart (one kernel subscriber, buffers only): deliver the segment whole.

    Only where nobody asked for `before`. Callbacks get ArrowChunks whose `sends` name each row's
    send; chunk by chunk, `runtime.send_index` names the send being delivered instead.
    """
    if runtime.playback:
        runtime.clock.advance(int(run.chunk_times[start:end].max()))
    for output in outputs.values():
        output.deliver_all(run.send_of)
    if junction.callbacks:
        lo, hi = int(run.bounds[start]), int(run.bounds[end])
        batch = run.batch().slice(lo, hi - lo)
        sends = np.repeat(run.send_of[start:end], np.diff(run.bounds[start : end + 1]))  # each row's send, as add_receiver promises
        whole = ArrowChunk(batch, pa.array(run.times[lo:hi], pa.int64()), sends)
        for callback in junction.callbacks:
            callback.receive(whole)
