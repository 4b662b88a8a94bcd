"""Stream junctions: a stream's subscribers, and the callbacks users attach to streams/queries."""

from __future__ import annotations

from typing import Callable, Protocol

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


class BatchCallback:
    """`fn(batch, timestamps)` with the chunk as an Arrow record batch (for Arrow consumers)."""

    def __init__(self, fn: Callable[[pa.RecordBatch, pa.Array], None], schema: Schema):
        self.fn = fn
        self.schema = schema

    def receive(self, chunk) -> None:
        """Convert (if needed) and deliver one chunk."""
        if isinstance(chunk, ArrowChunk):
            self.fn(chunk.batch, chunk.timestamps)
            return
        if not chunk:
            return
        columns = list(zip(*[e.data for e in chunk]))
        arrays = [pa.array(list(col), type=f.type) for col, f in zip(columns, self.schema.arrow_schema())]
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema.arrow_schema())
        self.fn(batch, pa.array([e.timestamp for e in chunk], pa.int64()))


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
