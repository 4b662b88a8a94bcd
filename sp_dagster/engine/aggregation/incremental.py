"""One `define aggregation`: its executors, its tables, and retrieval (Siddhi's AggregationRuntime).
Events of the input stream (after its filters) become records for the root executor; find()
answers `within [start, end) per P` from the tables and what the executors still hold.
"""

from __future__ import annotations

import logging

from sp_dagster.engine.aggregation.executor import Executor
from sp_dagster.engine.aggregation.plan import Plan
from sp_dagster.engine.aggregation.store import AGG_TS, BASES, EVENT_TS, GROUPS, LAST_TS, LASTS, SHARD, MemoryStore, RdbmsStore
from sp_dagster.engine.aggregation.timing import DURATIONS, FROM_AST, bucket_start, next_start, parse_timestamp, zone
from sp_dagster.engine.errors import EngineError, app_error
from sp_dagster.engine.events import CURRENT, as_events
from sp_dagster.engine.expressions import StreamScope, compile_expression
from sp_dagster.siddhi import ast
from sp_dagster.wording import counted

log = logging.getLogger("sp_dagster.engine.aggregation")

#: @purge retention keys and the duration each names.
_RETENTION = {
    "sec": "SECONDS", "second": "SECONDS", "seconds": "SECONDS", "min": "MINUTES", "minute": "MINUTES", "minutes": "MINUTES",
    "hour": "HOURS", "hours": "HOURS", "day": "DAYS", "days": "DAYS", "month": "MONTHS", "months": "MONTHS",
    "year": "YEARS", "years": "YEARS",
}  # fmt: skip


class IncrementalAggregation:
    """A running incremental aggregation.

    Distributed mode (`@PartitionById`, or partition_by_id on the runtime) tags every row with
    the runtime's shard id and never reads its own memory: a bucket is visible once it is
    written, whichever shard wrote it.
    """

    def __init__(self, definition: ast.AggregationDefinition, context):
        self.definition = definition
        self.name = definition.name
        self.context = context
        self.clock = context.clock
        options = context.aggregation_options
        try:
            self.tz = zone(options.get("aggTimeZone"))
        except EngineError as exc:
            raise app_error(str(exc), definition) from None
        stream = definition.input
        junction = context.junctions[stream.stream]
        scope = StreamScope(junction.schema, (stream.stream,), context)
        self.filters = [compile_expression(h.condition, scope).row for h in stream.handlers if isinstance(h, ast.Filter)]
        self.plan = Plan(definition, junction.schema, context)
        self.schema = self.plan.output_schema
        self.durations = self._durations(definition)
        self.distributed = _partitioned(definition, options)
        self.shard = options.get("shardId")
        if self.distributed and self.shard is None:
            raise app_error("Configuration 'shardId' not provided for @partitionById annotation", definition)
        aggregate_by = definition.aggregate_by
        self.external = aggregate_by is not None
        self.has_last = self.external and bool(self.plan.last_names)
        if aggregate_by is not None:
            by = compile_expression(aggregate_by, scope)
            read = by.row
            self.event_time = (lambda e: _text_time(read(e))) if by.type == "string" else read
        self.retention = _purge(definition, self.durations)
        self.store = self._store(definition)
        self._build_executors()
        self.timer = self.clock.scheduler(f"aggregation:{self.name}").queue(self._fire)
        self.timer_started = False
        self.initialised = False
        self.fed = False  # has aggregated an event itself (a copy that only reads the store never has)
        junction.subscribe(self)

    # -- building

    @staticmethod
    def _durations(definition: ast.AggregationDefinition) -> tuple[str, ...]:
        names = definition.all_durations
        if definition.duration_range:
            return tuple(FROM_AST[d] for d in names if d in FROM_AST)
        for name in names:
            if name not in FROM_AST:
                raise app_error(f"aggregations do not keep '{name}' granularities; they keep {', '.join(d.lower() for d in DURATIONS)}", definition)
        return tuple(FROM_AST[d] for d in names)

    def _store(self, definition: ast.AggregationDefinition) -> MemoryStore | RdbmsStore:
        store = definition.annotation("store")
        if store is None or (store.get("type") or "").lower() in ("in-memory", "inmemory"):
            return MemoryStore(self.durations)
        if (store.get("type") or "").lower() != "rdbms":
            raise app_error(f"@store with type '{store.get('type')}' is not supported for aggregations; use type='rdbms'", store)
        from sp_dagster.engine.store.options import parse_store
        from sp_dagster.engine.store.rdbms import Connections

        table = ast.TableDefinition(definition.name, (), line=definition.line, column=definition.column)
        options = parse_store(table, store, getattr(self.context, "datasources", None))
        if self.context.connections is None:
            self.context.connections = Connections()
        return RdbmsStore(self.name, self.durations, self.plan, self.distributed, self.external, options, self.context.connections)

    def _build_executors(self) -> None:
        """One executor per granularity, each rolling up into the next."""
        child = None
        self.executors: dict[str, Executor] = {}
        for duration in reversed(self.durations):
            child = Executor(duration, self.plan, self.tz, self.external, self.shard if self.distributed else None, self.store, child)
            self.executors[duration] = child
        assert child is not None  # an aggregation has at least one granularity
        self.root = child

    # -- events in

    def receive(self, chunk) -> None:
        """Aggregate one chunk of the input stream."""
        for event in as_events(chunk):
            if event.type != CURRENT or not all(f(event) is True for f in self.filters):
                continue
            record = self._record(event)
            if record is None:
                continue
            if not self.initialised:
                self._initialise()
            self.fed = True
            if not self.timer_started:
                self.timer.notify_at(next_start(record[AGG_TS], self.durations[0], self.tz))
                self.timer_started = True
            self.root.execute(record)

    def _record(self, event) -> tuple | None:
        plan = self.plan
        event_ts = None
        if self.external:
            event_ts = self.event_time(event)
            if event_ts is None:
                log.error("aggregation %s: dropped an event whose timestamp attribute is not a valid time: %s", self.name, event.data)
                return None
        groups = tuple(read(event) for read in plan.group_reads)
        lasts = tuple(read(event) for read in plan.last_reads)
        return (event.timestamp, None, event_ts, groups, lasts, event_ts if self.has_last else 0, plan.start_bases(event))

    def _fire(self, when: int) -> None:
        root = self.durations[0]
        following = next_start(when, root, self.tz)
        now = self.clock.now()
        if following <= now:  # the root is empty after this firing: go straight to the last due one
            following = max(following, bucket_start(now, root, self.tz))
        self.timer.notify_at(following)
        self.root.tick(when)
        self._purge(when)

    def _initialise(self) -> dict[str, int | None] | None:
        """Rebuild the executors above the root from a database store (this shard's rows), once; returns the
        newest bucket of each table it read from (None without a database store).

        A writer may add rows meanwhile (a copy that only reads the store): a table's rows newer than
        its newest bucket as first read are left out, since the finer rows they were made of are read
        into memory instead (the root's rows count however new)."""
        self.initialised = True
        store = self.store
        if not isinstance(store, RdbmsStore):  # in memory: nothing stored before this runtime
            return None
        shard = self.shard if self.distributed else None
        newest = store.newest(shard)
        for index in range(len(self.durations) - 1, 0, -1):
            duration, finer = self.durations[index], self.durations[index - 1]
            last, bound = newest[duration], newest[finer] if index > 1 else None
            since = next_start(last, duration, self.tz) if last is not None else None
            rows = self.store.read(finer, AGG_TS, since=since, shard=shard)
            if index > 1:
                rows = [r for r in rows if bound is not None and r[AGG_TS] <= bound]
            for record in sorted(rows, key=lambda r: r[AGG_TS]):
                self.executors[duration].execute(record)
        return newest

    def _purge(self, now: int) -> None:
        if not self.retention:
            return
        interval, periods = self.retention
        if now < getattr(self, "_next_purge", 0):
            return
        self._next_purge = now + interval
        for duration, keep in periods.items():
            self.store.purge(duration, now - keep)

    # -- retrieval

    def find(self, start: int, end: int, per: str) -> list[tuple]:
        """The aggregation's rows (AGG_TIMESTAMP and the selected attributes) within [start, end) per `per`.

        Reads the `per` table and adds what is still in memory (the executors from `per` down to
        the root) or, in distributed mode, the finer tables' rows no coarser row of their shard
        holds yet (_written); then merges rows of the same bucket and group (sum of sums, min of
        mins, latest value by event time) when the data is on event time or comes from several
        shards (_merged).
        """
        if per not in self.durations:
            raise EngineError(
                f"The aggregate values for {per} granularity cannot be provided since aggregation definition {self.name} does not contain {per} duration"
            )
        bound = None
        if not self.distributed and not self.fed and self.store.persistent:
            # A copy that only reads a database store (a group joining the aggregation, `sp-dagster
            # query`) rebuilds from the tables at every retrieval: the writer may have written since.
            self._build_executors()
            bound = self._initialise()
        elif not self.distributed and not self.initialised:
            self._initialise()  # a runtime that has seen no event yet reads what a database store holds
        column = EVENT_TS if self.external else AGG_TS
        if self.distributed:
            return self._merged(self._written(start, end, per, column), per, column)
        records = self.store.read(per, column, start, end)
        if bound is not None and per != self.durations[0]:
            # Rows the writer added since the rebuild read where each table ended are in memory already (from their finer rows).
            records = [r for r in records if bound[per] is not None and r[AGG_TS] <= bound[per]]
        oldest = self._oldest(per)
        if self.external or (oldest != -1 and end > oldest):
            records += [r for r in self._in_memory(per, oldest) if start <= r[column] < end]
        if self.external:
            return self._merged(records, per, column)
        return [self.plan.output_row(r[AGG_TS], r[GROUPS], r[LASTS], r[BASES]) for r in records]

    def _written(self, start: int, end: int, per: str, column: int) -> list[tuple]:
        """The rows of `per` and of the finer tables within [start, end) that hold each event once,
        whichever shard wrote them (distributed mode).

        A shard writes a bucket's finer rows before the coarser row holding them, each bucket after
        the one before it. So a finer row counts unless its shard had written the coarser bucket
        holding it, and a coarser row counts only if it was there when its finer rows were left out:
        the newest bucket of each shard is read per table, coarsest first, before any row; finer
        rows from after a shard's newest coarser bucket count, and rows newer than their table's
        newest bucket of the shard (written since) do not. What the tables hold decides, not a
        clock: the shards and the reader each have their own."""
        levels = self.durations[: self.durations.index(per) + 1]
        newest = {duration: self.store.newest_by_shard(duration) for duration in reversed(levels[1:])}
        records: list[tuple] = []
        for index, duration in enumerate(levels):
            written = newest.get(duration)  # the root's rows count however new: nothing finer holds them
            coarser = levels[index + 1] if index + 1 < len(levels) else None
            covered = newest[coarser] if coarser is not None else {}
            since = min(covered.values()) if covered else None  # a shard not in `covered` yet: its rows from then on
            for record in self.store.read(duration, column, start, end, since=since):
                shard, at = record[SHARD], record[AGG_TS]
                if written is not None and (shard not in written or at > written[shard]):
                    continue
                if coarser is not None and shard in covered and at < next_start(covered[shard], coarser, self.tz):
                    continue
                records.append(record)
        return records

    def _oldest(self, per: str) -> int:
        for duration in reversed(self.durations[: self.durations.index(per) + 1]):
            start = self.executors[duration].start
            if start != -1:
                return start
        return -1

    def _in_memory(self, per: str, oldest: int) -> list[tuple]:
        """What the executors from `per` down to the root hold, merged per `per` bucket (Siddhi's
        IncrementalDataAggregator: AGG_TIMESTAMP is the oldest bucket start unless latest values
        keep the latest event time)."""
        merged: dict[tuple, list] = {}
        for duration in reversed(self.durations[: self.durations.index(per) + 1]):
            for record in self.executors[duration].in_memory():
                key = (record[EVENT_TS], record[GROUPS], bucket_start(record[AGG_TS], per, self.tz))
                self._fold(merged, key, record, oldest)
        return [(g[1], None, key[0], key[1], g[0], g[1], g[2]) for key, g in merged.items()]

    def _fold(self, merged: dict, key: tuple, record: tuple, timestamp: int) -> None:
        group = merged.get(key)
        if group is None:
            merged[key] = [record[LASTS], record[LAST_TS] if self.has_last else timestamp, list(record[BASES])]
            return
        if not self.has_last or record[LAST_TS] >= group[1]:
            group[0] = record[LASTS]
            if self.has_last:
                group[1] = record[LAST_TS]
        self.plan.merge(group[2], record[BASES])

    def _merged(self, records: list[tuple], per: str, column: int) -> list[tuple]:
        """Rows of one bucket and group merged (Siddhi's OutOfOrderEventsDataAggregator)."""
        merged: dict[tuple, list] = {}
        for record in records:
            key = (bucket_start(record[column], per, self.tz), record[GROUPS])
            self._fold(merged, key, record, 0)
        return [self.plan.output_row(key[0], key[1], g[0], g[2]) for key, g in merged.items()]

    # -- observations, state, lifetime

    def counts(self) -> dict[str, int]:
        """Rows stored per granularity."""
        return self.store.counts()

    def observations(self) -> dict:
        """What an asset observation reports: rows and the newest bucket written, per granularity (and
        rows per shard, over all granularities, of a distributed aggregation in a database)."""
        seen = {"rows": self.store.counts(), "newest_bucket": self.store.newest(), "shard_id": self.shard if self.distributed else None}
        store = self.store
        seen["rows_by_shard"] = store.counts_by_shard() if self.distributed and isinstance(store, RdbmsStore) else None
        return seen

    def snapshot(self):
        """The executors, the timer, the in-memory tables (plain data); with a database store that
        has not been read yet, the newest row of this shard per granularity (see restore())."""
        state = {
            "executors": {d: e.snapshot() for d, e in self.executors.items()},
            "timer": self.timer.snapshot(),
            "flags": (self.timer_started, self.initialised),
            "fed": self.fed,
            "store": self.store.snapshot(),
        }
        store = self.store
        if isinstance(store, RdbmsStore) and self.distributed and not self.initialised:
            state["newest"] = store.newest(self.shard if self.distributed else None)
        return state

    def restore(self, state) -> None:
        """Inverse of snapshot(). With a database store, the rows this shard wrote after the snapshot
        are deleted: whoever restores a snapshot replays the events that came after it, so those
        rows are written again (keeping them would count those events twice). Without shards, only
        a runtime that aggregated events itself deletes: a copy that only reads the store (a group
        joining the aggregation) cannot tell its rows from the writer's."""
        for duration, saved in state["executors"].items():
            self.executors[duration].restore(saved)
        self.timer.restore(state["timer"])
        self.timer_started, self.initialised = state["flags"]
        self.fed = state.get("fed", False)
        if state["store"] is not None:
            self.store.restore(state["store"])
        if isinstance(self.store, RdbmsStore) and (self.distributed or self.fed):
            self._discard_after(self.store, state)

    def _discard_after(self, store: RdbmsStore, state) -> None:
        shard = self.shard if self.distributed else None
        newest = state.get("newest")
        if not self.initialised and newest is None:
            return  # a snapshot from before the rows were counted: nothing known to be after it
        for duration, executor in self.executors.items():
            if self.initialised:
                if executor.store_ts == -1:
                    continue
                since = executor.store_ts  # the bucket open at the snapshot: written only after it
            else:
                before = (newest or {}).get(duration)
                since = None if before is None else before + 1
            dropped = store.discard(duration, since, shard)
            if dropped:
                log.info("aggregation %s: dropped %s written after the restored snapshot", self.name, counted(dropped, f"{duration} row"))

    def stop(self) -> None:
        """Stop reading the input stream and release the store."""
        self.context.junctions[self.definition.input.stream].unsubscribe(self)
        self.store.stop()


def _text_time(value):
    return None if value is None else parse_timestamp(value)


def _partitioned(definition: ast.AggregationDefinition, options: dict) -> bool:
    annotation = definition.annotation("PartitionById")
    if annotation is not None:
        enable = annotation.get("enable")
        if enable is None or enable.lower() == "true":
            return True
    return str(options.get("partitionById", "false")).lower() == "true"


def _purge(definition: ast.AggregationDefinition, durations: tuple[str, ...]):
    """(interval ms, {duration: retention ms}) of an enabled @purge, or None."""
    annotation = definition.annotation("purge")
    if annotation is None:
        return None
    periods = {}
    for retention in annotation.annotations:
        if retention.name.lower() != "retentionperiod":
            continue
        for element in retention.elements:
            duration = _RETENTION.get((element.key or "").lower())
            if duration is None:
                raise app_error(f"@retentionPeriod has no granularity '{element.key}'", element)
            if duration not in durations:
                raise app_error(f"{duration} granularity cannot be purged since aggregation has not performed in {duration} granularity", element)
            periods[duration] = _duration_ms(element.value, element)
    if (annotation.get("enable") or "true").lower() != "true":
        return None
    interval = _duration_ms(annotation.get("interval") or "15 min", annotation)
    return interval, periods


def _duration_ms(text: str | None, node: ast.Node) -> int:
    """Milliseconds of a time text such as '120 sec' or '2 h' (SiddhiQLError at `node` otherwise)."""
    from sp_dagster.siddhi import SiddhiQLError
    from sp_dagster.siddhi.parser import parse_expression

    try:
        value = parse_expression(text or "")
    except SiddhiQLError:
        value = None
    if isinstance(value, ast.TimeConstant):
        return value.millis
    if isinstance(value, ast.Constant) and value.type in ("int", "long"):
        return int(value.value)
    raise app_error(f"'{text}' is not a time such as '120 sec' or '2 hours'", node)
