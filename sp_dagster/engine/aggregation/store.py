"""Where an aggregation's closed buckets go: one table per granularity, in memory or in a database.
Writing a record whose key is there already replaces that row, so a bucket flushed again after a
restore is not counted twice.
"""

from __future__ import annotations

import bisect
import json
from typing import Any

from sp_dagster.engine.errors import EngineError

#: Field positions in a record: one bucket of one group as the executors hand it on,
#: (agg_ts, shard, event_ts, groups, lasts, last_ts, bases).
AGG_TS, SHARD, EVENT_TS, GROUPS, LASTS, LAST_TS, BASES = range(7)


def record_key(record: tuple) -> tuple:
    """The primary key of a record."""
    return (record[AGG_TS], record[SHARD], record[EVENT_TS], record[GROUPS])


def _within(record: tuple, column: int, start, end, since) -> bool:
    if start is not None and not (start <= record[column] < end):
        return False
    return since is None or record[AGG_TS] >= since


class MemoryStore:
    """The granularity tables of an aggregation without @store: rows in this runtime (snapshotted),
    indexed by AGG_TIMESTAMP and AGG_EVENT_TIMESTAMP so a `within` range reads only its rows."""

    persistent = False

    def __init__(self, durations: tuple[str, ...]):
        self.durations = durations
        self.tables: dict[str, dict[tuple, tuple]] = {d: {} for d in durations}
        self.indexes: dict[tuple[str, int], _TimeIndex] = {(d, c): _TimeIndex() for d in durations for c in (AGG_TS, EVENT_TS)}

    def write(self, duration: str, records: list[tuple]) -> None:
        """Store closed buckets of `duration` (a row with the same key is replaced)."""
        table = self.tables[duration]
        for record in records:
            key = record_key(record)
            if key not in table:
                for column in (AGG_TS, EVENT_TS):
                    self.indexes[duration, column].add(record[column], key)
            table[key] = record

    def read(self, duration: str, column: int, start=None, end=None, since=None, shard=None) -> list[tuple]:
        """Records with start <= record[column] < end (when given), AGG_TIMESTAMP >= since, of `shard`."""
        table = self.tables[duration]
        if start is not None:
            keys = self.indexes[duration, column].between(start, end)
        elif since is not None:
            keys = self.indexes[duration, AGG_TS].between(since, None)
        else:
            keys = list(table)
        records = (table[k] for k in keys)
        return [r for r in records if _within(r, column, start, end, since) and (shard is None or r[SHARD] == shard)]

    def counts(self) -> dict[str, int]:
        """Rows per granularity."""
        return {d: len(t) for d, t in self.tables.items()}

    def newest(self) -> dict[str, int | None]:
        """The newest AGG_TIMESTAMP per granularity (None when a table is empty)."""
        return {d: (self.indexes[d, AGG_TS].times or [None])[-1] for d in self.durations}

    def newest_by_shard(self, duration: str) -> dict[str | None, int]:
        """The newest AGG_TIMESTAMP of each SHARD_ID in one granularity's table."""
        newest: dict[str | None, int] = {}
        for record in self.tables[duration].values():
            shard = record[SHARD]
            if shard not in newest or record[AGG_TS] > newest[shard]:
                newest[shard] = record[AGG_TS]
        return newest

    def purge(self, duration: str, before: int) -> None:
        """Drop rows whose AGG_TIMESTAMP is older than `before`."""
        table = self.tables[duration]
        for key in [k for k, r in table.items() if r[AGG_TS] < before]:
            record = table.pop(key)
            for column in (AGG_TS, EVENT_TS):
                self.indexes[duration, column].remove(record[column], key)

    def snapshot(self):
        """Every row (plain data: tuples, lists and frozensets)."""
        return {d: list(t.values()) for d, t in self.tables.items()}

    def restore(self, state) -> None:
        """Inverse of snapshot()."""
        self.__init__(self.durations)
        for duration, records in state.items():
            self.write(duration, records)

    def stop(self) -> None:
        """Nothing to release."""


class _TimeIndex:
    """Keys by a time column: sorted distinct times (None last-free) and the keys at each."""

    def __init__(self):
        self.times: list[int] = []
        self.keys: dict[int, list[tuple]] = {}

    def add(self, time, key: tuple) -> None:
        if time is None:
            return
        if time not in self.keys:
            self.keys[time] = []
            if not self.times or time > self.times[-1]:
                self.times.append(time)
            else:
                bisect.insort(self.times, time)
        self.keys[time].append(key)

    def remove(self, time, key: tuple) -> None:
        keys = self.keys.get(time)
        if keys is None:
            return
        keys.remove(key)
        if not keys:
            del self.keys[time]
            self.times.pop(bisect.bisect_left(self.times, time))

    def between(self, start: int, end: int | None) -> list[tuple]:
        low = bisect.bisect_left(self.times, start)
        high = len(self.times) if end is None else bisect.bisect_left(self.times, end)
        return [key for time in self.times[low:high] for key in self.keys[time]]


class RdbmsStore:
    """The granularity tables in a database (`@store(type='rdbms', ...)` on the aggregation).

    Each granularity is Siddhi's table `<A>_<DURATION>` with Siddhi's columns, in Siddhi's order:

        AGG_TIMESTAMP, [SHARD_ID], [AGG_EVENT_TIMESTAMP], <group by...>, <latest values...>,
        [AGG_LAST_EVENT_TIMESTAMP], AGG_SUM_x / AGG_COUNT / AGG_MIN_x / AGG_MAX_x / AGG_SET_x ...

    and the primary key (AGG_TIMESTAMP[, SHARD_ID][, AGG_EVENT_TIMESTAMP], <group by...>). A
    distinct-count set is stored as a JSON list.
    """

    persistent = True

    def __init__(self, name: str, durations: tuple[str, ...], plan, distributed: bool, external: bool, options, connections):
        import sqlalchemy as sa
        import sqlalchemy.exc

        from sp_dagster.engine.store.rdbms import _READERS, column_type

        self.sa = sa
        self.options = options
        self.connections = connections
        self.engine_key, self.engine = connections.engine(options, name)
        self.distributed = distributed
        self.external = external
        self.has_last = external and bool(plan.last_names)
        self.set_columns = [b.kind == "set" for b in plan.bases]
        lengths = options.field_lengths
        columns: list[tuple[str, str]] = [("AGG_TIMESTAMP", "long")]
        if distributed:
            columns.append(("SHARD_ID", "string"))
        if external:
            columns.append(("AGG_EVENT_TIMESTAMP", "long"))
        columns += list(zip(plan.group_names, plan.group_types))
        columns += list(zip(plan.last_names, plan.last_types))
        if self.has_last:
            columns.append(("AGG_LAST_EVENT_TIMESTAMP", "long"))
        columns += [(b.column, b.type) for b in plan.bases]
        self.names = [n for n, _ in columns]
        self.key_count = 1 + distributed + external + len(plan.group_names)
        self.groups, self.lasts = len(plan.group_names), len(plan.last_names)
        readers = {**_READERS, "object": lambda v: v}
        self.readers = [readers[t] for _, t in columns]
        self.tables = {}
        metadata = sa.MetaData()
        for duration in durations:
            table_name = f"{options.table_name}_{duration}"
            sql_columns = [
                sa.Column(
                    n, sa.Text() if t == "object" else column_type(t, self.engine, lengths.get(n)), primary_key=i < self.key_count, nullable=i >= self.key_count
                )
                for i, (n, t) in enumerate(columns)
            ]
            self.tables[duration] = sa.Table(table_name, metadata, *sql_columns)
        try:
            metadata.create_all(self.engine, checkfirst=True)
            existing = {d: sa.Table(t.name, sa.MetaData(), autoload_with=self.engine) for d, t in self.tables.items()}
        except sqlalchemy.exc.SQLAlchemyError as exc:
            connections.release(self.engine_key)
            raise EngineError(f"aggregation {name}: its tables at {options.shown} cannot be created: {exc}") from None
        for duration, table in existing.items():
            have = {c.name.lower(): c for c in table.columns}
            missing = [n for n in self.names if n.lower() not in have]
            if missing:
                connections.release(self.engine_key)
                raise EngineError(
                    f"aggregation {name}: the table {table.name} at {options.shown} has no column {missing[0]}; "
                    "drop it or name other tables with table.name in @store"
                )
            self.tables[duration] = table
        self._columns = {d: [{c.name.lower(): c for c in t.columns}[n.lower()] for n in self.names] for d, t in self.tables.items()}

    # -- records and rows

    def _row(self, record: tuple) -> dict:
        values = [record[AGG_TS]]
        if self.distributed:
            values.append(record[SHARD])
        if self.external:
            values.append(record[EVENT_TS])
        values += list(record[GROUPS]) + list(record[LASTS])
        if self.has_last:
            values.append(record[LAST_TS])
        values += [json.dumps(sorted(b, key=repr)) if is_set else b for b, is_set in zip(record[BASES], self.set_columns)]
        return dict(zip(self.names, values))

    def _record(self, row) -> tuple:
        values: list[Any] = [None if v is None else read(v) for v, read in zip(row, self.readers)]  # a stored row's columns
        at = 1
        shard = values[at] if self.distributed else None
        at += self.distributed
        event_ts = values[at] if self.external else None
        at += self.external
        groups = tuple(values[at : at + self.groups])
        at += self.groups
        lasts = tuple(values[at : at + self.lasts])
        at += self.lasts
        last_ts = values[at] if self.has_last else 0
        at += self.has_last
        bases = [frozenset(json.loads(b)) if is_set else b for b, is_set in zip(values[at:], self.set_columns)]
        return (values[0], shard, event_ts, groups, lasts, last_ts, bases)

    def _key_clause(self, duration: str, row: dict):
        columns = self._columns[duration]
        return self.sa.and_(*[(c == row[n]) if row[n] is not None else c.is_(None) for c, n in zip(columns[: self.key_count], self.names)])

    # -- the interface of MemoryStore

    def write(self, duration: str, records: list[tuple]) -> None:
        """Store closed buckets of `duration` (a row with the same key is replaced)."""
        if not records:
            return
        sa, table = self.sa, self.tables[duration]
        rows = [self._row(r) for r in records]
        names = {n: c.name for n, c in zip(self.names, self._columns[duration])}
        rows = [{names[k]: v for k, v in row.items()} for row in rows]
        try:
            with self.engine.begin() as conn:
                conn.execute(sa.insert(table), rows)
        except sa.exc.IntegrityError:
            with self.engine.begin() as conn:
                for row in rows:
                    own = {n: row[names[n]] for n in self.names}
                    conn.execute(sa.delete(table).where(self._key_clause(duration, own)))
                    conn.execute(sa.insert(table), [row])
        except sa.exc.SQLAlchemyError as exc:
            raise EngineError(f"aggregation table {table.name} at {self.options.shown}: writing failed: {exc}") from None

    def read(self, duration: str, column: int, start=None, end=None, since=None, shard=None) -> list[tuple]:
        """Records with start <= record[column] < end (when given), AGG_TIMESTAMP >= since, of `shard`."""
        sa, columns = self.sa, self._columns[duration]
        where = []
        time_column = columns[0] if column == AGG_TS else columns[1 + self.distributed]
        if start is not None:
            where += [time_column >= start, time_column < end]
        if since is not None:
            where.append(columns[0] >= since)
        if shard is not None and self.distributed:
            where.append(columns[1] == shard)
        query = sa.select(*columns)
        if where:
            query = query.where(*where)
        try:
            with self.engine.connect() as conn:
                return [self._record(row) for row in conn.execute(query)]
        except sa.exc.SQLAlchemyError as exc:
            raise EngineError(f"aggregation table {self.tables[duration].name} at {self.options.shown}: reading failed: {exc}") from None

    def counts(self) -> dict[str, int]:
        """Rows per granularity."""
        sa = self.sa
        with self.engine.connect() as conn:
            return {d: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one() for d, t in self.tables.items()}

    def counts_by_shard(self) -> dict[str, int]:
        """Rows per SHARD_ID over every granularity (distributed tables only)."""
        sa, found = self.sa, {}
        with self.engine.connect() as conn:
            for columns in self._columns.values():
                for shard, count in conn.execute(sa.select(columns[1], sa.func.count()).group_by(columns[1])):
                    found[shard] = found.get(shard, 0) + count
        return dict(sorted(found.items()))

    def newest(self, shard: str | None = None) -> dict[str, int | None]:
        """The newest AGG_TIMESTAMP per granularity (None when a table is empty), of `shard` if given."""
        sa = self.sa
        result = {}
        with self.engine.connect() as conn:
            for duration, columns in self._columns.items():
                query = sa.select(sa.func.max(columns[0]))
                if shard is not None and self.distributed:
                    query = query.where(columns[1] == shard)
                result[duration] = conn.execute(query).scalar()
        return result

    def newest_by_shard(self, duration: str) -> dict[str | None, int]:
        """The newest AGG_TIMESTAMP of each SHARD_ID in one granularity's table (of None without shards)."""
        sa, columns = self.sa, self._columns[duration]
        shard = columns[1] if self.distributed else sa.null()
        query = sa.select(shard, sa.func.max(columns[0])).group_by(shard) if self.distributed else sa.select(shard, sa.func.max(columns[0]))
        try:
            with self.engine.connect() as conn:
                return {row[0]: int(row[1]) for row in conn.execute(query) if row[1] is not None}
        except sa.exc.SQLAlchemyError as exc:
            raise EngineError(f"aggregation table {self.tables[duration].name} at {self.options.shown}: reading failed: {exc}") from None

    def purge(self, duration: str, before: int) -> None:
        """Drop rows whose AGG_TIMESTAMP is older than `before`."""
        with self.engine.begin() as conn:
            conn.execute(self.sa.delete(self.tables[duration]).where(self._columns[duration][0] < before))

    def discard(self, duration: str, since: int | None, shard: str | None = None) -> int:
        """Delete the rows with AGG_TIMESTAMP >= since (every row when since is None), of `shard` if
        given; how many went. A restored runtime drops what was written after its snapshot."""
        sa, columns = self.sa, self._columns[duration]
        where = [] if since is None else [columns[0] >= since]
        if shard is not None and self.distributed:
            where.append(columns[1] == shard)
        statement = sa.delete(self.tables[duration])
        if where:
            statement = statement.where(*where)
        try:
            with self.engine.begin() as conn:
                return conn.execute(statement).rowcount
        except sa.exc.SQLAlchemyError as exc:
            raise EngineError(f"aggregation table {self.tables[duration].name} at {self.options.shown}: deleting failed: {exc}") from None

    def snapshot(self):
        """Nothing: the rows live in the database."""
        return None

    def restore(self, state) -> None:
        """Nothing: the rows live in the database."""

    def stop(self) -> None:
        """Give the engine back."""
        if self.engine_key is not None:
            self.connections.release(self.engine_key)
            self.engine_key = None
