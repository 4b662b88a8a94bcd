"""The kernel interface, the outputs kernels hand back, and a stream's plan of kernels."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa

from sp_dagster.engine.batch.eligibility import blind_output
from sp_dagster.engine.clock import TimerQueue
from sp_dagster.engine.events import ArrowChunk, StreamEvent

#: Segments computed per kernel class (tests check that the kernels they mean to test ran).
RUNS: Counter = Counter()


class Output:
    """A query's output rows for a segment of chunks: `owner[i]` is the chunk row i belongs to.

    Rows are given column-wise (an Arrow batch and timestamps); each chunk's rows go to the
    query's output (its callbacks, then its target stream) as one chunk, as the event path
    sends them (or one chunk per value of `split`, a pattern's per event).
    """

    def __init__(self, query, batch: pa.RecordBatch, timestamps: np.ndarray, owner: np.ndarray, split: np.ndarray | None = None):
        self.query = query
        self.batch = batch
        self.timestamps = timestamps
        self.owner = owner
        self.split = split  # rows of one owner with different split values go as separate chunks
        self._events: list[StreamEvent] | None = None
        self._cursor = 0

    def deliver(self, chunk: int) -> None:
        """Send the rows of chunk `chunk` (chunks are delivered in increasing order)."""
        owner, start = self.owner, self._cursor
        if start >= len(owner) or owner[start] != chunk:
            return
        end = int(np.searchsorted(owner, chunk, side="right"))
        self._cursor = end
        if self._events is None:
            columns = [column.to_pylist() for column in self.batch.columns]
            rows = list(zip(*columns)) if columns else [()] * self.batch.num_rows
            self._events = [StreamEvent(t, r, output=r) for t, r in zip(self.timestamps.tolist(), rows)]
        if self.split is None:
            self.query.output.send(self._events[start:end])
            return
        split = self.split
        cuts = [start, *(np.flatnonzero(split[start + 1 : end] != split[start : end - 1]) + start + 1).tolist(), end]
        for first, last in zip(cuts, cuts[1:]):
            self.query.output.send(self._events[first:last])

    def deliver_all(self, send_of: np.ndarray) -> None:
        """Send every row as one chunk (only where nobody can tell chunks apart); `send_of[owner]`
        names the send each row stems from."""
        if self.batch.num_rows:
            self.query.output.send_arrow(ArrowChunk(self.batch, pa.array(self.timestamps, pa.int64()), send_of[self.owner]))


def segment(run, start: int, end: int, filters) -> tuple[ArrowChunk, np.ndarray, np.ndarray]:
    """Chunks start..end-1 of `run` as one ArrowChunk through vectorised `filters`, with the
    timestamps and owning chunk of every row kept."""
    lo, hi = int(run.bounds[start]), int(run.bounds[end])
    times = run.times[lo:hi]
    owner = np.repeat(np.arange(start, end), np.diff(run.bounds[start : end + 1]))
    chunk = ArrowChunk(run.batch().slice(lo, hi - lo), pa.array(times, pa.int64()))
    chunk, kept = apply_filters(chunk, filters)
    if kept is not None:
        times, owner = times[kept], owner[kept]
    return chunk, times, owner


def apply_filters(chunk: ArrowChunk, filters) -> tuple[ArrowChunk, np.ndarray | None]:
    """`chunk` through vectorised `filters`; the rows kept (indices), or None when all are."""
    kept = None
    for processor in filters:
        mask = processor.vector(chunk)
        if isinstance(mask, pa.Scalar):
            if mask.as_py() is True:
                continue
            keep = np.zeros(len(chunk), bool)
        else:
            keep = np.asarray(mask.fill_null(False).to_numpy(zero_copy_only=False), bool)
        chunk = ArrowChunk(chunk.batch.filter(keep), chunk.timestamps.filter(keep))
        index = np.flatnonzero(keep)
        kept = index if kept is None else kept[index]
    return chunk, kept


class Kernel:
    """Computes one query's outputs over a segment of a run.

    A kernel belongs to one query that reads a stream nothing in the app writes: only sends feed
    it, so nothing can reach the query while a segment is being delivered. `extent` says how far
    into a run it can go (not past a timer of its own); `run` computes the outputs of a segment,
    leaves the query's state as the event path would, and returns an Output that delivers them
    chunk by chunk (or all at once where nobody can tell chunks apart).
    """

    #: the timer queue a kernel fires itself (StreamPlan), or None
    timers: TimerQueue | None = None

    def __init__(self, query):
        self.query = query

    @classmethod
    def build(cls, receiver, runtime) -> Kernel | None:
        """A kernel for subscriber `receiver`, or None when this class cannot compute it."""
        raise NotImplementedError

    def extent(self, run, start: int, end: int) -> int:
        """How far (a chunk index in start..end) this kernel can compute from `start`."""
        return end

    def run(self, run, start: int, end: int) -> Output:
        """The outputs of chunks start..end-1; the query's state moves past them."""
        raise NotImplementedError

    def blind(self) -> bool:
        """True when nothing downstream can tell this kernel's output chunks apart."""
        return blind_output(self.query)


class StreamPlan:
    """The kernels of one stream's subscribers, by subscriber id.

    A kernel with `timers` (a timer queue) fires them itself: segments run past them, and
    its outputs for a chunk are delivered when the clock move of that chunk would fire them
    (`timed`), before any subscriber sees the chunk.
    """

    def __init__(self, kernels: dict[int, Kernel]):
        self.kernels = kernels
        self.timed = [key for key, kernel in kernels.items() if getattr(kernel, "timers", None) is not None]
        self.owned = {id(kernels[key].timers) for key in self.timed}

    def next_due(self, clock) -> int | None:
        """The earliest time a timer no kernel fires itself is armed for, or None."""
        if not self.owned:
            return clock.next_due()
        owned = self.owned
        times = [q.times[0] for s in clock.schedulers for q in s.queues if q.times and id(q) not in owned]
        return min(times) if times else None

    def extent(self, run, start: int, end: int) -> int:
        """How far every kernel can go from `start`."""
        for kernel in self.kernels.values():
            end = kernel.extent(run, start, end)
            if end <= start:
                break
        return end

    def run(self, run, start: int, end: int) -> dict[int, Output]:
        """Every kernel's outputs for the segment."""
        outputs = {}
        for key, kernel in self.kernels.items():
            RUNS[type(kernel).__name__] += 1
            outputs[key] = kernel.run(run, start, end)
        return outputs

    def blind(self, junction) -> bool:
        """True when the segment may be delivered whole: one subscriber, with a kernel, buffers only."""
        if len(junction.receivers) != 1 or id(junction.receivers[0]) not in self.kernels:
            return False
        if any(not getattr(callback, "blind", False) for callback in junction.callbacks):
            return False
        return self.kernels[id(junction.receivers[0])].blind()
