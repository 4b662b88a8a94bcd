"""Stream junctions: a stream's subscribers, and the callbacks users attach to streams/queries."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Protocol

import pyarrow as pa

from sp_dagster.engine.events import CURRENT, EXPIRED, ArrowChunk, Event, StreamEvent, as_events
from sp_dagster.engine.schema import Schema


class Receiver(Protocol):
    """Anything a junction delivers chunks to."""

    def receive(self, chunk) -> None: ...


class StreamJunction:
    """Delivers every chunk sent to a stream to its subscribers in order, then to callbacks."""

    def __init__(self, name: str, schema: Schema, inner: bool = False):
        self.name = name
        self.schema = schema
        self.inner = inner
        self.receivers: list[Receiver] = []
        self.callbacks: list[Receiver] = []
        self.width = len(schema)
        self.exact = "float" not in schema.types  # a row's values need no conversion (no 32-bit floats)

    def subscribe(self, receiver: Receiver) -> None:
        """Add a query (or partition) that reads this stream."""
        self.receivers.append(receiver)

    def unsubscribe(self, receiver: Receiver) -> None:
        """Remove a subscriber."""
        if receiver in self.receivers:
            self.receivers.remove(receiver)

    def send(self, chunk: list[StreamEvent] | ArrowChunk) -> None:
        """Deliver a chunk of current events."""
        for receiver in self.receivers:
            receiver.receive(chunk)
        for callback in self.callbacks:
            callback.receive(chunk)


class StreamCallback:
    """Siddhi's StreamCallback: `fn(events)` once per chunk the stream receives."""

    def __init__(self, fn: Callable[[list[Event]], None]):
        self.fn = fn

    def receive(self, chunk) -> None:
        """Convert and deliver one chunk."""
        events = as_events(chunk)
        if events:
            self.fn([Event(e.timestamp, e.data) for e in events])


class OutputBuffer:
    """Collects what a stream receives until drained as one Arrow batch (for batch consumers)."""

    blind = True  # how chunks were cut cannot be seen in what drain() returns

    def __init__(self, schema: Schema):
        self.schema = schema
        self.arrow_schema = schema.arrow_schema()
        self._struct = pa.struct(list(self.arrow_schema))
        self.rows: list[tuple] = []
        self.timestamps: list[int] = []
        self.batches: list[tuple[pa.RecordBatch, pa.Array]] = []
        self._empty: tuple[pa.RecordBatch, pa.Array] | None = None  # what an empty drain returns (made once)

    def receive(self, chunk) -> None:
        """Keep one chunk."""
        if isinstance(chunk, ArrowChunk):
            self._seal()
            self.batches.append((chunk.batch, chunk.timestamps))
            return
        for event in chunk:
            self.rows.append(event.data)
            self.timestamps.append(event.timestamp)

    def _seal(self) -> None:
        if self.rows:
            if self.arrow_schema:  # rows as one struct array: one conversion instead of one per column
                batch = pa.RecordBatch.from_struct_array(pa.array(self.rows, type=self._struct))
            else:
                batch = pa.RecordBatch.from_arrays([], schema=self.arrow_schema)
            self.batches.append((batch, int64_array(self.timestamps)))
            self.rows, self.timestamps = [], []

    def __len__(self) -> int:
        return len(self.rows) + sum(batch.num_rows for batch, _ in self.batches)

    def drain(self) -> tuple[pa.RecordBatch, pa.Array]:
        """Everything received since the last drain: one record batch and its timestamps."""
        self._seal()
        batches, self.batches = self.batches, []
        if len(batches) == 1:
            return batches[0]
        if self._empty is None:
            self._empty = (pa.RecordBatch.from_pylist([], schema=self.arrow_schema), pa.array([], pa.int64()))
        empty = self._empty[0]
        if not batches:
            return self._empty
        table = pa.Table.from_batches([b for b, _ in batches], schema=self.arrow_schema).combine_chunks()
        timestamps = pa.concat_arrays([t for _, t in batches])
        return (table.to_batches() or [empty])[0], timestamps


def int64_array(values: list) -> pa.Array:
    """pa.array(values, pa.int64()); a few Python ints packed into one buffer (3x cheaper)."""
    if len(values) <= _PACKED and all(type(v) is int for v in values):
        try:
            data = _packers[len(values)].pack(*values)
        except struct.error:  # out of range: pa.array says so
            return pa.array(values, _INT64)
        return pa.Array.from_buffers(_INT64, len(values), [None, pa.py_buffer(data)])
    return pa.array(values, _INT64)


_INT64 = pa.int64()
_PACKED = 16
_packers = [struct.Struct(f"<{n}q") for n in range(_PACKED + 1)]


class QueryCallback:
    """Siddhi's QueryCallback: `fn(timestamp, in_events, remove_events)` once per output chunk."""

    def __init__(self, fn: Callable[[int, list[Event] | None, list[Event] | None], None]):
        self.fn = fn

    def receive(self, chunk) -> None:
        """Split one chunk into current and expired events and deliver it."""
        current, expired = [], []
        timestamp = -1
        for event in as_events(chunk):
            if event.type == EXPIRED:
                expired.append(Event(event.timestamp, _row(event), True))
            elif event.type == CURRENT:
                current.append(Event(event.timestamp, _row(event)))
            timestamp = event.timestamp
        self.fn(timestamp, current or None, expired or None)


def _row(event: StreamEvent) -> tuple:
    return event.output if event.output is not None else event.data
