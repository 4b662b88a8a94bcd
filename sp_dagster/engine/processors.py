"""The processor interface every step of a query implements, and the stateless processors.
A query is a chain of processors (filters, stream functions, a window, the selector, the rate
limiter), each passing the chunks it produces to `next`, like Siddhi's core.
"""

from __future__ import annotations

import logging

import pyarrow as pa

from sp_dagster.engine.events import ArrowChunk, StreamEvent
from sp_dagster.engine.expressions import Executor

log = logging.getLogger("sp_dagster.engine")


class Processor:
    """One step of a query: process(chunk) and pass what results to `next`."""

    #: the step after this one, wired when the query is built (the chain's end has none)
    next: Processor
    accepts_arrow = False

    def process(self, chunk: list[StreamEvent]) -> None:
        """Handle one chunk (a list of StreamEvents, processed in order)."""
        raise NotImplementedError

    def process_arrow(self, chunk: ArrowChunk) -> None:
        """Handle a column-wise chunk of current events (only where accepts_arrow)."""
        self.process(chunk.events())

    def snapshot(self):
        """Plain-data state (None for stateless processors); restore() takes it back."""
        return None

    def restore(self, state) -> None:
        """Inverse of snapshot()."""

    def stop(self) -> None:
        """Release resources (timers) when the runtime shuts down."""


class FilterProcessor(Processor):
    """`[condition]`: keeps the events for which the condition is true."""

    def __init__(self, condition: Executor):
        self.condition = condition.row
        self.vector = condition.arrow
        self.accepts_arrow = condition.arrow is not None

    def process(self, chunk):
        test = self.condition
        kept = [event for event in chunk if test(event) is True]
        if kept:
            self.next.process(kept)

    def process_arrow(self, chunk):
        mask = self.vector(chunk)  # pyright: ignore[reportOptionalCall]  # only called where accepts_arrow: with a vector
        if isinstance(mask, pa.Scalar):
            if mask.as_py() is True:
                self.next.process_arrow(chunk)
            return
        batch = chunk.batch.filter(mask)
        if batch.num_rows:
            self.next.process_arrow(ArrowChunk(batch, chunk.timestamps.filter(mask)))


class LogProcessor(Processor):
    """`#log(...)`: logs each event (with an optional message and priority) and passes it on."""

    accepts_arrow = False

    def __init__(self, message: Executor | None, level: int, stream: str):
        self.message = message
        self.level = level
        self.stream = stream

    def process(self, chunk):
        for event in chunk:
            prefix = self.message.row(event) if self.message is not None else self.stream
            log.log(self.level, "%s: %s", prefix, event)
        self.next.process(chunk)
