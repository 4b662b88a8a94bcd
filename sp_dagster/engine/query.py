"""One query at run time: input -> filters/functions/window -> selector -> rate limiter -> output.
QueryRuntime builds the processor chain from the AST (raising SiddhiQLErrors for anything wrong or
unsupported), subscribes to its input stream and delivers its output to query callbacks and the
target stream.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sp_dagster.engine.aggregation.retrieval import AggregationJoinView
from sp_dagster.engine.clock import Scheduler
from sp_dagster.engine.errors import app_error
from sp_dagster.engine.events import CURRENT, EXPIRED, ArrowChunk, StreamEvent, as_events
from sp_dagster.engine.expressions import StreamScope, compile_expression
from sp_dagster.engine.join import EmptyWindow, join_scope, join_sides, side_scope
from sp_dagster.engine.junction import Receiver, StreamJunction
from sp_dagster.engine.named_window import EventByEvent, WindowOutput
from sp_dagster.engine.patterns import PatternInput, PatternProcessor
from sp_dagster.engine.processors import FilterProcessor, LogProcessor, Processor
from sp_dagster.engine.ratelimit import EVENT_LIMITERS, TIME_LIMITERS, PassThrough
from sp_dagster.engine.schema import Schema
from sp_dagster.engine.selector import Selector
from sp_dagster.engine.snapshotlimit import snapshot_limiter
from sp_dagster.engine.tables import TableJoinView, TableOutput
from sp_dagster.engine.windows import WINDOWS, Param, WindowContext
from sp_dagster.siddhi import ast

_LOG_LEVELS = {"TRACE": 5, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}


class Streams:
    """Where a query finds its streams: global ones, or a partition instance's own.

    Validation has checked every name, and every stream (inner ones too) exists before
    queries are built, so lookups cannot miss.
    """

    def __init__(self, context, inner: dict[str, StreamJunction] | None = None, local: dict[str, StreamJunction] | None = None):
        self.context = context
        self.inner = inner or {}
        self.local = local or {}

    def source(self, name: str, inner: bool) -> StreamJunction:
        """The junction a query reads `name` (or `#name`) from."""
        if inner:
            return self.inner[name]
        return self.local.get(name) or self.context.junctions[name]

    def target(self, name: str, inner: bool) -> StreamJunction:
        """The junction a query writes `name` (or `#name`) to."""
        return self.inner[name] if inner else self.context.junctions[name]


class QueryOutput:
    """Delivers a query's output chunks: query callbacks first, then the target stream."""

    def __init__(self, target: StreamJunction | None, callbacks: list):
        self.target = target
        self.callbacks = callbacks

    def send(self, chunk: list[StreamEvent]) -> None:
        """Deliver a chunk of selector output (current, expired and RESET events)."""
        for callback in self.callbacks:
            callback.receive(chunk)
        if self.target is not None:
            rows = [StreamEvent(e.timestamp, e.output) for e in chunk if e.type == CURRENT or e.type == EXPIRED]
            if rows:
                self.target.send(rows)

    def send_arrow(self, chunk: ArrowChunk) -> None:
        """Deliver a column-wise chunk of current output rows."""
        for callback in self.callbacks:
            callback.receive(chunk)
        if self.target is not None:
            self.target.send(chunk)


class _Head:
    """Feeds the chunks of one join side's input stream to the head of its chain."""

    def __init__(self, head: Processor):
        self.head = head

    def receive(self, chunk) -> None:
        self.head.process(as_events(chunk))


class QueryRuntime:
    """A running query: its processor chain and state (partitions build one per partition key)."""

    def __init__(
        self,
        query: ast.Query,
        name: str,
        context,
        streams: Streams,
        schedulers: Callable[[str], Scheduler],
        callbacks: list,
    ):
        self.query = query
        self.name = name
        self.context = context
        output = query.output
        event_type = output.event_type
        if query.rate is not None and query.rate.kind == "snapshot" and event_type == "current":
            event_type = "all"  # a snapshot follows expiry too; `insert into` means all events here
        current_on = event_type in ("current", "all")
        expired_on = event_type in ("expired", "all")
        self.subscriptions: list[tuple[StreamJunction, Receiver]] = []
        self.join_sides: list = []
        self.window = window = None
        pattern = None
        if isinstance(query.input, ast.JoinInput):
            schema, scope = self._join(query.input, streams, schedulers, expired_on)
            mode = "slide"
        elif isinstance(query.input, ast.StateInput):
            schemas = {s.stream: streams.source(s.stream, s.inner).schema for s in query.input_streams()}
            pattern = PatternProcessor(query.input, schemas, context, schedulers)
            self.processors = [pattern]
            schema, scope, mode = Schema((), ()), pattern.scope(context), "batch"
        else:
            source = query.input  # support.check_supported has let through only stream inputs
            junction = streams.source(source.stream, source.inner)
            schema = junction.schema
            scope = StreamScope(schema, (source.stream,), context, inner=source.inner)
            self.processors = self._handlers(source, scope, schema, expired_on, schedulers)
            window = self.window
            self.subscriptions.append((junction, self))
            mode = window.mode if window is not None else "batch"
        self.selector = Selector(
            query.selector,
            schema,
            scope,
            current_on=current_on,
            expired_on=expired_on,
            track_future=(mode == "slide" or expired_on),
        )
        context.query_schemas[name] = self.selector.output_schema
        self.output = self._output(output, streams, callbacks, scope)
        self.limiter = self._rate_limiter(query, schedulers)
        if pattern is not None:
            for stream in pattern.streams:
                state = next(s for s in pattern.states if s.stream == stream)
                self.subscriptions.append((streams.source(stream, state.node.stream.inner), PatternInput(pattern, stream, self.selector)))
            self.head = None
            self.arrow = False
        elif self.join_sides:
            for side in self.join_sides:
                side.next = self.selector
            self.head = None
            self.arrow = False
        else:
            chain = [*self.processors, self.selector]
            for first, second in zip(chain, chain[1:]):
                first.next = second
            self.head = chain[0]
            self.arrow = all(p.accepts_arrow for p in chain) and self.limiter.accepts_arrow and schema.arrow_capable
        self.selector.next = self.limiter
        for junction, receiver in self.subscriptions:
            junction.subscribe(receiver)

    def _handlers(
        self, source: ast.StreamInput, scope, schema: Schema, expired_on: bool, schedulers, slot: str = "window", findable: bool = False
    ) -> list[Processor]:
        processors: list[Processor] = []
        for handler in source.handlers:
            if isinstance(handler, ast.Filter):
                processors.append(FilterProcessor(compile_expression(handler.condition, scope)))
            elif isinstance(handler, ast.Window):
                self.window = self._window(handler, scope, schema, expired_on, lambda _: schedulers(slot), findable)
                processors.append(self.window)
            else:
                processors.append(self._stream_function(handler, scope, source.stream))
        return processors

    def _join(self, join: ast.JoinInput, streams: Streams, schedulers, expired_on: bool):
        tables, aggregations = self.context.tables, self.context.aggregations
        schemas, holders = [], []
        for source in (join.left, join.right):
            name = source.stream.stream
            stored = tables.get(name) or aggregations.get(name)
            schemas.append(stored.schema if stored is not None else streams.source(name, source.stream.inner).schema)
        scope = join_scope(join, schemas[0], schemas[1], self.context)
        self.join_sides = join_sides(join, scope, schemas[0], schemas[1], set(tables) | set(aggregations))
        self.processors = []
        for index, (source, side) in enumerate(zip((join.left, join.right), self.join_sides)):
            name = source.stream.stream
            if name in tables:
                holders.append(TableJoinView(tables[name], join.on, scope, 0 if index == 0 else len(schemas[0])))
                continue
            if name in aggregations:
                holders.append(AggregationJoinView(aggregations[name], join, scope, index == 0, self.context.callbacks_for(self.name)))
                continue
            if name in self.context.windows and not source.stream.inner:
                # a named window: probe what it holds; what it emits triggers this side (its
                # filters are not applied; a self-join's left side alone, event by event: Siddhi)
                holders.append(self.context.windows[name])
                self_join = join.left.stream.stream == join.right.stream.stream
                if not (self_join and index == 1):
                    self.subscriptions.append((streams.source(name, False), EventByEvent(side) if self_join else _Head(side)))
                continue
            self.window = None
            side_schema = schemas[index]
            chain = self._handlers(
                source.stream, side_scope(source, side_schema, self.context), side_schema, expired_on, schedulers, ("window", "window.right")[index], True
            )
            holder = self.window or EmptyWindow()
            if self.window is None:
                chain.append(holder)
            holders.append(holder)
            chain.append(side)
            for first, second in zip(chain, chain[1:]):
                first.next = second
            self.processors.extend(chain)
            self.subscriptions.append((streams.source(name, source.stream.inner), _Head(chain[0])))
        self.join_sides[0].other, self.join_sides[1].other = holders[1], holders[0]
        schema = Schema(schemas[0].names + schemas[1].names, schemas[0].types + schemas[1].types)
        return schema, scope

    def _output(self, output, streams: Streams, callbacks: list, scope):
        tables = self.context.tables
        if output.target in tables and not getattr(output, "inner", False):
            names = tuple(getattr(scope, "names", ()))
            return TableOutput(output, tables[output.target], self.selector.output_schema, names, self.context, callbacks)
        if output.target in self.context.windows and not getattr(output, "inner", False):
            return WindowOutput(self.context.windows[output.target], callbacks)
        return QueryOutput(streams.target(output.target, output.inner), callbacks)

    def _window(self, handler: ast.Window, scope, schema: Schema, expired_on: bool, schedulers, findable: bool = False) -> Processor:
        params = [Param(arg, compile_expression(arg, scope)) for arg in handler.args]
        window_class = WINDOWS[handler.name]
        scheduler = schedulers("window") if window_class.uses_timers else None
        context = WindowContext(self.context.clock, scheduler, expired_on, handler, schema, findable)
        return window_class(params, context)

    def _stream_function(self, handler: ast.StreamFunction, scope, stream: str) -> Processor:
        message, level = None, logging.INFO
        for arg in handler.args:
            executor = compile_expression(arg, scope)
            if executor.constant and isinstance(executor.value, str) and executor.value.upper() in _LOG_LEVELS:
                level = _LOG_LEVELS[executor.value.upper()]
            elif executor.constant and executor.type == "bool":
                continue
            else:
                message = executor
        return LogProcessor(message, level, stream)

    def _rate_limiter(self, query: ast.Query, schedulers) -> Processor:
        rate = query.rate
        group_by = bool(query.selector.group_by)
        if rate is None:
            return PassThrough(self.output)
        if rate.kind == "events":
            assert rate.type is not None  # only a snapshot rate has no type
            return EVENT_LIMITERS[(rate.type, group_by)](self.output, rate.value)
        if rate.kind == "time":
            assert rate.type is not None  # only a snapshot rate has no type
            limiter_class = TIME_LIMITERS[(rate.type, group_by)]
            scheduler = schedulers("rate") if limiter_class.uses_timers else None
            limiter = limiter_class(self.output, rate.period.millis, self.context.clock, scheduler)
            limiter.start()
            return limiter
        if query.output.event_type == "expired":
            raise app_error("snapshot rate limiting cannot insert only expired events", query.output)
        self.selector.batching = False
        limiter = snapshot_limiter(self, rate.period.millis, schedulers("rate"))
        limiter.start()
        return limiter

    # -- running

    def receive(self, chunk) -> None:
        """A chunk arrived on the (single) input stream."""
        if isinstance(chunk, ArrowChunk):
            if self.arrow:
                self.head.process_arrow(chunk)  # pyright: ignore[reportOptionalMemberAccess]  # subscribed only with a chain (head)
                return
            chunk = chunk.events()
        self.head.process(chunk)  # pyright: ignore[reportOptionalMemberAccess]  # subscribed only with a chain (head)

    def stateful(self) -> list[Processor]:
        """Every processor whose state a snapshot must hold."""
        return [*self.processors, self.selector, self.limiter]

    def snapshot(self) -> list:
        """Plain-data state of the whole chain."""
        return [p.snapshot() for p in self.stateful()]

    def restore(self, state: list) -> None:
        """Inverse of snapshot()."""
        for processor, saved in zip(self.stateful(), state):
            processor.restore(saved)

    def stop(self) -> None:
        """Unsubscribe and release timers."""
        for junction, receiver in self.subscriptions:
            junction.unsubscribe(receiver)
        for processor in self.stateful():
            processor.stop()
