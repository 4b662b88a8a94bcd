"""AppRuntime: a Siddhi app running in process, fed rows or Arrow batches.
Callbacks and buffers take what streams and queries emit; snapshot() and restore() carry its state.
With `@app:playback` the clock follows event timestamps, otherwise it is the wall clock.
"""

from __future__ import annotations

import functools
import io
import pickle
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import pyarrow as pa

from sp_dagster.engine.aggregation import IncrementalAggregation
from sp_dagster.engine.clock import Clock, ManualClock, PlaybackClock, Scheduler, WallClock
from sp_dagster.engine.context import AppContext
from sp_dagster.engine.errors import EngineError, app_error
from sp_dagster.engine.events import ArrowChunk, Event, StreamEvent
from sp_dagster.engine.junction import OutputBuffer, QueryCallback, StreamCallback, StreamJunction
from sp_dagster.engine.named_window import named_windows
from sp_dagster.engine.partition import PartitionRuntime
from sp_dagster.engine.query import QueryRuntime, Streams
from sp_dagster.engine.schema import Schema
from sp_dagster.engine.stateparts import CarryOver, fingerprints, match_parts
from sp_dagster.engine.store import build_table
from sp_dagster.engine.support import check_supported
from sp_dagster.engine.triggers import triggers
from sp_dagster.engine.values import f32
from sp_dagster.siddhi import SiddhiQLError, ast, parse
from sp_dagster.siddhi.validate import check

SNAPSHOT_VERSION = 1
#: Record batches of at most this many rows are sent as rows: building Arrow chunks costs more.
SMALL_BATCH = 8


class Part(Protocol):
    """What a snapshot holds the state of: a query, partition, table, aggregation, named window or trigger."""

    def snapshot(self) -> Any: ...

    def restore(self, state: Any) -> None: ...


class AppRuntime:
    """A running Siddhi app: send events in, get them out through callbacks.

    >>> from sp_dagster import AppRuntime
    >>> runtime = AppRuntime("define stream Trades (symbol string, price double); "
    ...                      "from Trades[price > 100] select symbol, price insert into Big;")
    >>> big = []
    >>> runtime.add_callback("Big", lambda events: big.extend(e.data for e in events))
    >>> runtime.start()
    >>> runtime.send("Trades", [("IBM", 120.0), ("WSO2", 55.0)], [1000, 1001])
    >>> big
    [('IBM', 120.0)]
    """

    def __init__(
        self,
        app: ast.App | str,
        *,
        clock: Clock | None = None,
        source: str | None = None,
        datasources: dict | None = None,
        shard_id: str | None = None,
        partition_by_id: bool = False,
        agg_time_zone: str | None = None,
        connections=None,
    ):
        """Parse, check and build `app` (SiddhiQLError if it is wrong).

        `clock` defaults to event time under `@app:playback`, else the wall clock, whose background
        thread fires time windows and rate limits when they fall due. A host that runs the engine
        where no such thread may emit (a Spark task) passes `clock=DrivenClock()`, asks
        `next_wakeup()` when to come back and calls `advance_time(now)` then.

        Incremental aggregations take Siddhi's properties from here: `shard_id` (siddhi.properties.shardId)
        tags the rows this runtime writes, `partition_by_id` (siddhi.properties.partitionById) makes every
        aggregation distributed, `agg_time_zone` (aggTimeZone) places day/month/year boundaries.
        `connections` (engine.store.rdbms.Connections) shares database engines with other runtimes.
        """
        text = app if isinstance(app, str) else None
        try:
            self.app = parse(app, source) if isinstance(app, str) else app
            analysis, errors = check(self.app)
            if errors:
                raise SiddhiQLError.combine(errors)
            check_supported(self.app)
            self.clock = clock or (PlaybackClock() if self.app.playback else WallClock())
            self.context = AppContext(self.app, self.clock, analysis)
            self.context.datasources = dict(datasources or {})  # for @store(datasource='NAME')
            self.context.connections = connections
            self.context.aggregation_options = {
                "shardId": shard_id,
                "partitionById": "true" if partition_by_id else "false",
                "aggTimeZone": agg_time_zone,
            }
            self.queries: dict[str, QueryRuntime] = {}
            self.partitions: list[PartitionRuntime] = []
            self.started = False
            self.send_index: int | None = None  # during send_each: the send whose outputs are being delivered
            self.batch_plans: dict = {}  # stream -> its subscribers' kernels (engine.batch.plan_stream), made on first use
            try:
                self._build()
            except BaseException:
                self._stop_tables()
                raise
        except SiddhiQLError as error:
            raise error.attach(text, source) from None
        self.lock = self.clock.lock
        self.clock.start()

    @property
    def name(self) -> str | None:
        """The app's name (`@app:name`)."""
        return self.app.name

    @property
    def playback(self) -> bool:
        """True when time follows event timestamps."""
        return self.clock.playback

    @property
    def uses_timers(self) -> bool:
        """True when some operator acts on timers (time windows, time rate limits): its output
        may come when time passes, not only when an event arrives."""
        return bool(self.clock.schedulers)

    # -- building

    def _build(self) -> None:
        context = self.context
        # every stream, defined or inferred from `insert into` (the parser's analysis), exists
        # before any query is built, so queries may read streams written further down
        for name, definition in context.analysis.streams.items():
            schema = Schema.of((a.name, a.type) for a in definition.attributes)
            context.schemas[name] = schema
            context.junctions[name] = StreamJunction(name, schema)
        for definition in self.app.definitions:
            if isinstance(definition, ast.TableDefinition):
                context.tables[definition.name] = build_table(definition, context)
        for definition in self.app.definitions:
            if isinstance(definition, ast.AggregationDefinition):
                context.aggregations[definition.name] = IncrementalAggregation(definition, context)
        # named windows and triggers are streams too, and their timers fire before the queries'
        context.windows = named_windows(self.app, context)
        self.triggers = triggers(self.app, context)
        counter = 0
        for element in self.app.elements:
            if isinstance(element, ast.Query):
                counter += 1
                name = self._query_name(element, counter)
                self.queries[name] = QueryRuntime(
                    element,
                    name,
                    context,
                    Streams(context),
                    self._scheduler_slots(name),
                    context.callbacks_for(name),
                )
            elif isinstance(element, ast.Partition):
                names = []
                for query in element.queries:
                    counter += 1
                    names.append(self._query_name(query, counter))
                self.partitions.append(PartitionRuntime(element, len(self.partitions), context, names))

    def _query_name(self, query: ast.Query, counter: int) -> str:
        name = query.name or f"query_{counter}"
        if name in self.context.query_callbacks:
            raise app_error(f"two queries are named '{name}'", query)
        self.context.callbacks_for(name)
        return name

    def _scheduler_slots(self, name: str) -> Callable[[str], Scheduler]:
        schedulers: dict[str, Scheduler] = {}

        def scheduler(slot: str) -> Scheduler:
            if slot not in schedulers:
                schedulers[slot] = self.clock.scheduler(f"{name}.{slot}")
            return schedulers[slot]

        return scheduler

    # -- callbacks

    def schema(self, stream: str) -> Schema:
        """The attributes of `stream`."""
        return self._junction(stream).schema

    def _junction(self, stream: str) -> StreamJunction:
        junction = self.context.junctions.get(stream)
        if junction is None:
            raise EngineError(f"app has no stream '{stream}'; it has {', '.join(sorted(self.context.junctions))}")
        return junction

    def query_schema(self, query: str) -> Schema:
        """The output attributes of `query`."""
        if query not in self.context.query_schemas:
            known = ", ".join(self.context.query_schemas) or "none"
            raise EngineError(f"app has no query '{query}'; its queries are {known}")
        return self.context.query_schemas[query]

    @property
    def streams(self) -> dict[str, Schema]:
        """Every stream of the app (defined or written by a query) and its schema."""
        return dict(self.context.schemas)

    def add_callback(self, stream: str, fn: Callable[[list[Event]], None]) -> None:
        """Call `fn(events)` with every chunk `stream` receives (Siddhi's StreamCallback)."""
        self.schema(stream)
        self.context.junctions[stream].callbacks.append(StreamCallback(fn))

    def add_receiver(self, stream: str, receiver) -> None:
        """Hand `receiver.receive(chunk)` every chunk `stream` receives, as it travels (a list of
        StreamEvents or an ArrowChunk). A receiver with `blind = True` declares that it cannot tell
        chunks apart: send_each may then deliver a whole run at once, each row's send in the
        ArrowChunk's `sends` (otherwise `send_index` names the send being delivered)."""
        self.schema(stream)
        self.context.junctions[stream].callbacks.append(receiver)

    def add_buffer(self, stream: str) -> OutputBuffer:
        """Collect what `stream` receives; `.drain()` returns it as one Arrow batch + timestamps."""
        schema = self.schema(stream)
        if not schema.arrow_capable:
            raise EngineError(f"stream '{stream}' has object attributes, which have no Arrow form")
        buffer = OutputBuffer(schema)
        self.context.junctions[stream].callbacks.append(buffer)
        return buffer

    def add_query_callback(self, query: str, fn: Callable[[int, list[Event] | None, list[Event] | None], None]) -> None:
        """Call `fn(timestamp, in_events, remove_events)` with every output chunk of `query`."""
        if query not in self.context.query_callbacks:
            known = ", ".join(self.context.query_callbacks) or "none"
            raise EngineError(f"app has no query '{query}'; its queries are {known}")
        self.context.query_callbacks[query].append(QueryCallback(fn))

    # -- sending

    def send(
        self,
        stream: str,
        rows: Sequence[Sequence] | pa.RecordBatch,
        timestamps: Sequence[int] | pa.Array | None = None,
    ) -> None:
        """Send events to `stream`: rows (values in attribute order) or an Arrow record batch.

        `timestamps` gives each event's time in ms (default: the clock's now). In playback a
        send is split into runs of equal timestamps; each run advances the clock first, so
        timers due by then fire before the run is processed.
        """
        junction = self.context.junctions.get(stream)
        if type(rows) is list and len(rows) == 1 and type(timestamps) is list and len(timestamps) == 1 and junction is not None:
            row = rows[0]
            if type(row) is tuple and len(row) == junction.width and junction.exact:  # one row as is: no checks to make
                with self.lock:
                    if not self.started:
                        self.start()
                    if self.clock.playback:
                        self.clock.advance(timestamps[0])
                    junction.send([StreamEvent(timestamps[0], row)])
                return
        if junction is None:
            junction = self._junction(stream)  # raises: the app has no such stream
        schema = junction.schema
        rows, batch = self.conform(stream, schema, rows)
        count = batch.num_rows if batch is not None else len(rows)
        if count == 0:
            return
        with self.lock:
            if not self.started:
                self.start()
            if timestamps is None:
                times = [self.clock.now()] * count
            else:
                times = timestamps.to_pylist() if isinstance(timestamps, (pa.Array, pa.ChunkedArray)) else list(timestamps)  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow's classes are untyped: isinstance does not narrow
                if len(times) != count:
                    raise EngineError(f"{count} events but {len(times)} timestamps sent to '{stream}'")
            if count == 1:
                if self.playback:
                    self.clock.advance(times[0])
                junction.send([StreamEvent(times[0], rows[0])] if batch is None else ArrowChunk(batch, pa.array(times, pa.int64())))
                return
            runs = _runs(times) if self.playback else [(0, count)]
            if len(runs) == 1:
                if self.playback:
                    self.clock.advance(times[0])
                if batch is not None:
                    junction.send(ArrowChunk(batch, pa.array(times, pa.int64())))
                else:
                    junction.send([StreamEvent(t, r) for t, r in zip(times, rows)])
                return
            events = ArrowChunk(batch, pa.array(times, pa.int64())).events() if batch is not None else [StreamEvent(t, r) for t, r in zip(times, rows)]
            for start, end in runs:
                self.clock.advance(times[start])
                junction.send(events[start:end])

    def send_each(
        self,
        stream: str,
        rows: Sequence[Sequence] | pa.RecordBatch,
        timestamps: Sequence[int] | pa.Array | None,
        sizes: Sequence[int] | None = None,
        before: Callable[[int], None] | None = None,
    ) -> None:
        """Send a run of sends at once, with exactly the outputs of calling send() for each in turn.

        Send i is the next `sizes[i]` rows (default: every row is its own send); `timestamps`
        holds one time per row (None: the clock's now). Callbacks see the same events, in the
        same order and in the same chunks as with one send() per send, timers fall due between
        sends as they would (playback), and the state left behind is the same. `before(i)`, if
        given, is called before anything send i causes reaches a callback (so whatever
        callbacks receive between before(i) and before(i+1) was caused by send i). Operators
        with a kernel (sp_dagster.engine.batch) compute the whole run at once.
        """
        from sp_dagster.engine.batch.send_each import send_each

        send_each(self, stream, rows, timestamps, sizes, before)

    def conform(self, stream: str, schema: Schema, rows) -> tuple[list[tuple] | None, pa.RecordBatch | None]:
        """(rows, None) or (None, batch) fit for `stream`; small batches become rows (cheaper per send)."""
        if isinstance(rows, pa.RecordBatch):
            batch = _conform_batch(rows, schema, stream)
            if batch.num_rows > SMALL_BATCH:
                return None, batch
            columns = [column.to_pylist() for column in batch.columns]  # cheaper than to_pydict()
            return (list(zip(*columns)) if columns else [()] * batch.num_rows), None
        if "float" in schema.types:
            return [_conform_row(row, schema, stream) for row in rows], None
        width = len(schema)
        rows = rows if isinstance(rows, list) else list(rows)
        for row in rows:
            if len(row) != width:
                _conform_row(row, schema, stream)
        return [row if type(row) is tuple else tuple(row) for row in rows], None

    def advance_time(self, timestamp: int) -> None:
        """Move a playback or driven clock to `timestamp`, firing timers due by then."""
        if not isinstance(self.clock, ManualClock):
            raise EngineError("advance_time() needs @app:playback or a DrivenClock (the wall clock moves by itself)")
        with self.lock:
            if not self.started:
                self.start()
            self.clock.advance(timestamp)

    def start(self) -> None:
        """Fire the `at 'start'` triggers, once (Siddhi's start(); the first send or advance does it)."""
        with self.lock:
            if not self.started:
                self.started = True
                for trigger in self.triggers.values():
                    trigger.start()

    def next_wakeup(self) -> int | None:
        """The earliest time (ms) a timer is armed for, or None: when a host should call advance_time()."""
        with self.lock:
            return self.clock.next_due()

    # -- state

    def _parts(self) -> Iterable[tuple[str, Part]]:
        for name, query in self.queries.items():
            yield f"query:{name}", query
        for index, partition in enumerate(self.partitions):
            yield f"partition:{index}", partition
        for name, table in self.context.tables.items():
            yield f"table:{name}", table
        for name, aggregation in self.context.aggregations.items():
            yield f"aggregation:{name}", aggregation
        for name, window in self.context.windows.items():
            yield f"window:{name}", window
        for name, trigger in self.triggers.items():
            yield f"trigger:{name}", trigger

    def snapshot(self) -> bytes:
        """The state of every stateful operator (and the playback clock), as bytes."""
        with self.lock:
            state = {
                "version": SNAPSHOT_VERSION,
                "app": self.app.name,
                "clock": self.clock.snapshot(),
                "parts": {name: part.snapshot() for name, part in self._parts()},
                "fingerprints": self.fingerprints,
            }
            return zlib.compress(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))

    @functools.cached_property
    def fingerprints(self) -> dict[str, str]:
        """Each stateful part's name and the fingerprint of its definition (engine.stateparts)."""
        return fingerprints(self.app, self.context.analysis)

    def restore(self, snapshot: bytes, *, partial: bool = False) -> CarryOver:
        """Put the runtime back in the state `snapshot()` returned (same app); with `partial`, the
        snapshot may come from an earlier version of the app: the parts whose definition is
        unchanged get their state back, the others start empty. Returns which did which."""
        state = _load_snapshot(snapshot)
        parts = dict(self._parts())
        if partial and "fingerprints" in state:
            matched = match_parts(self.fingerprints, state["fingerprints"])
        elif set(state["parts"]) == set(parts):
            matched = {name: name for name in parts}
        elif partial:  # saved before snapshots had fingerprints: all or nothing
            matched = {}
        else:
            raise EngineError("snapshot was taken from a different app (its queries differ)")
        with self.lock:
            self.clock.restore(state["clock"])
            for name, saved_name in matched.items():
                parts[name].restore(state["parts"][saved_name])
        return CarryOver(tuple(sorted(matched)), tuple(sorted(set(parts) - set(matched))))

    def shutdown(self) -> None:
        """Stop timers and detach every query."""
        self.clock.stop()
        with self.lock:
            for query in self.queries.values():
                query.stop()
            for partition in self.partitions:
                partition.stop()
            for part in (*self.context.windows.values(), *self.triggers.values()):
                part.stop()
            self._stop_tables()

    def _stop_tables(self) -> None:
        for table in (*self.context.tables.values(), *self.context.aggregations.values()):
            table.stop()

    # -- on-demand queries

    def query(self, text: str) -> list[Event]:
        """Run an on-demand query (`from T on ... select ...`, `delete T on ...`, ...); its events."""
        from sp_dagster.engine.ondemand import run_on_demand

        with self.lock:
            return run_on_demand(self, text).events

    def aggregations(self) -> dict[str, dict]:
        """Each aggregation's observations: rows and newest bucket per granularity, its shard id."""
        with self.lock:
            return {name: aggregation.observations() for name, aggregation in self.context.aggregations.items()}

    def __enter__(self) -> AppRuntime:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _load_snapshot(snapshot: bytes) -> dict:
    """The plain data of snapshot()'s bytes; EngineError when they are not a snapshot of this engine."""
    try:
        state = _SafeUnpickler(io.BytesIO(zlib.decompress(snapshot))).load()
    except (zlib.error, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise EngineError(f"not a snapshot of this engine: {exc}") from None
    if not isinstance(state, dict) or state.get("version") != SNAPSHOT_VERSION:
        raise EngineError("snapshot has an unknown format version")
    return state


def merge_keyed(snapshots: Sequence[bytes], owns: Callable[[str], bool]) -> bytes:
    """One snapshot from those of several copies of an app whose state is all per partition key (a rescaled
    keyed group): every key `owns` accepts, with its state; EngineError when the app has state of another kind."""
    states = [_load_snapshot(s) for s in snapshots]
    if not states:
        raise EngineError("no snapshot to merge")
    other = sorted({name for state in states for name in state["parts"] if not name.startswith("partition:")})
    if other:
        raise EngineError(f"state outside partitions cannot be split by key: {', '.join(other)}")
    parts: dict[str, list] = {}
    for state in states:
        for name, keys in state["parts"].items():
            parts.setdefault(name, []).extend([key, saved] for key, saved in keys if owns(key))
    clocks = [state["clock"] for state in states if state["clock"] is not None]
    merged = {**states[0], "clock": max(clocks) if clocks else None, "parts": parts}
    return zlib.compress(pickle.dumps(merged, protocol=pickle.HIGHEST_PROTOCOL))


class _SafeUnpickler(pickle.Unpickler):
    """Snapshots hold plain data only: refuse every class lookup."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"unexpected object {module}.{name}")


def _runs(times: list[int]) -> list[tuple[int, int]]:
    runs, start = [], 0
    for i in range(1, len(times)):
        if times[i] != times[start]:
            runs.append((start, i))
            start = i
    runs.append((start, len(times)))
    return runs


def _conform_row(row: Sequence, schema: Schema, stream: str) -> tuple:
    if len(row) != len(schema):
        raise EngineError(f"stream '{stream}' takes {len(schema)} values {schema.describe()}, got {len(row)}")
    if "float" in schema.types:
        return tuple(f32(float(v)) if (t == "float" and v is not None) else v for v, t in zip(row, schema.types))
    return tuple(row)


def _conform_batch(batch: pa.RecordBatch, schema: Schema, stream: str) -> pa.RecordBatch:
    if not schema.arrow_capable:
        raise EngineError(f"stream '{stream}' has object attributes; send rows instead of an Arrow batch")
    target = schema.arrow_schema()
    if batch.num_columns != len(schema):
        raise EngineError(f"stream '{stream}' takes {len(schema)} columns {schema.describe()}, got {batch.num_columns}")
    if batch.schema.equals(target):
        return batch
    try:
        columns = [column.cast(field.type) for column, field in zip(batch.columns, target)]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise EngineError(f"batch does not fit stream '{stream}' {schema.describe()}: {exc}") from None
    return pa.RecordBatch.from_arrays(columns, schema=target)
