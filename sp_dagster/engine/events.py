"""Events and chunks: what flows between processors.
A chunk is a list of StreamEvents, processed in order as one unit (Siddhi's ComplexEventChunk);
a chunk of current events may also travel column-wise as an ArrowChunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

#: Event types: CURRENT (arrived), EXPIRED (leaving a window), TIMER (a scheduled time has come),
#: RESET (a batch window clears the aggregates).
CURRENT, EXPIRED, TIMER, RESET = 0, 1, 2, 3
TYPE_NAMES = ("CURRENT", "EXPIRED", "TIMER", "RESET")


class StreamEvent:
    """One event inside the engine: timestamp, input data, type, and the selector's output."""

    __slots__ = ("timestamp", "data", "type", "output", "key")

    def __init__(self, timestamp: int, data: tuple | None, type: int = CURRENT, output: tuple | None = None, key=None):
        self.timestamp = timestamp
        #: the input attributes; None only in a TIMER event, whose data nothing reads (declared a
        #: tuple so the per-event paths, which never see a TIMER's data, need no check)
        self.data: tuple = data  # pyright: ignore[reportAttributeAccessIssue]
        self.type = type
        #: the selector's output attributes; None until the selector has set them (declared a tuple
        #: as what comes after the selector, the only code reading it, always finds one)
        self.output: tuple = output  # pyright: ignore[reportAttributeAccessIssue]
        self.key = key

    def copy(self, type: int | None = None, timestamp: int | None = None) -> StreamEvent:
        """A copy with the same data, optionally another type and timestamp."""
        return StreamEvent(
            self.timestamp if timestamp is None else timestamp,
            self.data,
            self.type if type is None else type,
        )

    def __repr__(self) -> str:
        return f"StreamEvent({self.timestamp}, {self.data}, {TYPE_NAMES[self.type]}, output={self.output})"

    def dump(self) -> tuple:
        """The event as plain data (for snapshots)."""
        return (self.timestamp, self.data, self.type)

    @staticmethod
    def load(state: tuple) -> StreamEvent:
        """The inverse of dump()."""
        timestamp, data, kind = state
        return StreamEvent(timestamp, tuple(data) if data is not None else None, kind)


@dataclass(frozen=True, slots=True)
class Event:
    """An event as callbacks see it (Siddhi's Event): timestamp, data, expired or not."""

    timestamp: int
    data: tuple
    is_expired: bool = False


class ArrowChunk:
    """A chunk of current events held column-wise: a record batch and one timestamp per row.

    Stateless queries filter and project it whole with pyarrow.compute.
    """

    __slots__ = ("batch", "timestamps", "sends", "_events")

    def __init__(self, batch: pa.RecordBatch, timestamps: pa.Array, sends=None):
        self.batch = batch
        self.timestamps = timestamps
        self.sends = sends  # delivered at once by send_each: the send each row stems from (numpy ints)
        self._events: list[StreamEvent] | None = None

    def __len__(self) -> int:
        return self.batch.num_rows

    def events(self) -> list[StreamEvent]:
        """The rows as StreamEvents (computed once)."""
        if self._events is None:
            columns = [column.to_pylist() for column in self.batch.columns]
            rows = zip(*columns) if columns else ((),) * self.batch.num_rows
            self._events = [StreamEvent(ts, row) for ts, row in zip(self.timestamps.to_pylist(), rows)]
        return self._events


def as_events(chunk: list[StreamEvent] | ArrowChunk) -> list[StreamEvent]:
    """A chunk as a list of StreamEvents, whichever form it travels in."""
    return chunk.events() if isinstance(chunk, ArrowChunk) else chunk
