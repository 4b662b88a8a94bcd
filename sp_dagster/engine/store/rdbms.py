"""A table kept in a relational database (SQLite, MySQL/MariaDB, PostgreSQL) through SQLAlchemy Core.
Siddhi's types map as siddhi-store-rdbms maps them, with a few departures (column_type), and a
hidden `sp_dagster_seq` column keeps insertion order. The rows live in the database: snapshots hold
nothing for the table.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import sqlalchemy as sa
import sqlalchemy.exc  # imported by name, not only as a side effect of sqlalchemy's own imports
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.pool import StaticPool

from sp_dagster.engine.errors import EngineError, app_error
from sp_dagster.engine.events import StreamEvent
from sp_dagster.engine.schema import Schema
from sp_dagster.engine.store.conditions import SqlCondition, compile_condition
from sp_dagster.engine.store.options import StoreOptions
from sp_dagster.engine.tables import Table, conform, primary_key, splice
from sp_dagster.engine.values import f32
from sp_dagster.siddhi import ast

log = logging.getLogger("sp_dagster.engine.store")

SEQ = "sp_dagster_seq"
STRING_SIZE = 254  # siddhi-store-rdbms's default VARCHAR length


def _string(value):
    return str(value, "utf-8") if isinstance(value, (bytes, bytearray, memoryview)) else str(value)


_READERS = {
    "int": int,
    "long": int,
    "float": lambda v: f32(float(v)),
    "double": float,
    "bool": bool,
    "string": _string,
}


class Connections:
    """The SQLAlchemy engines of one runtime, one per database, shared by its tables."""

    def __init__(self):
        self.engines: dict[tuple, sa.Engine] = {}
        self.users: dict[tuple, int] = {}

    def engine(self, options: StoreOptions, table: str) -> tuple[tuple, sa.Engine]:
        """The engine for `options` (created and tried on first use); EngineError when unreachable."""
        key = (options.url, options.pool_size, options.pool_timeout, options.pool_recycle, options.connect_timeout)
        if key not in self.engines:
            engine = _create_engine(options, table)
            try:
                with engine.connect():
                    pass
            except sqlalchemy.exc.SQLAlchemyError as exc:
                engine.dispose()
                raise unreachable(table, options, exc) from None
            self.engines[key] = engine
            self.users[key] = 0
        self.users[key] += 1
        return key, self.engines[key]

    def release(self, key: tuple | None) -> None:
        """One table is done with an engine; the last one disposes of it (None: already given back)."""
        if key in self.users:
            self.users[key] -= 1
            if self.users[key] <= 0:
                self.engines.pop(key).dispose()
                del self.users[key]


def _create_engine(options: StoreOptions, table: str) -> sa.Engine:
    url = sa.engine.make_url(options.url)
    kwargs: dict = {"pool_pre_ping": True}
    if url.get_backend_name() == "sqlite":
        if url.database in (None, "", ":memory:"):
            # one in-memory database for every thread (jdbc:h2:mem:...), as H2 keeps one per name
            kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
        else:
            Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    else:
        kwargs["connect_args"] = {"connect_timeout": max(1, int(options.connect_timeout))}
        if options.pool_size is not None:
            kwargs.update(pool_size=options.pool_size, max_overflow=0)
        if options.pool_timeout is not None:
            kwargs["pool_timeout"] = options.pool_timeout
        if options.pool_recycle is not None:
            kwargs["pool_recycle"] = options.pool_recycle
    try:
        return sa.create_engine(url, **kwargs)
    except ModuleNotFoundError as exc:
        from sp_dagster.config.datasources import missing_driver

        raise EngineError(f"table {table}: {missing_driver(options.url, exc)}") from None


def _reason(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc
    text = " ".join(str(cause).split())
    return text[:300] or type(cause).__name__


def unreachable(table: str, options: StoreOptions, exc: BaseException) -> EngineError:
    """The one-line error for a database that cannot be reached."""
    return EngineError(
        f"table {table}: cannot connect to the database at {options.shown} ({_reason(exc)}); "
        "check that the server is running and that jdbc.url, username and password of its @store are right"
    )


def _mysql_binary_collation(engine: sa.Engine) -> str:
    dialect = engine.dialect
    if getattr(dialect, "is_mariadb", False):
        return "utf8mb4_nopad_bin"
    if (dialect.server_version_info or (0,)) >= (8, 0):
        return "utf8mb4_0900_bin"
    return "utf8mb4_bin"


def column_type(kind: str, engine: sa.Engine, length: int | None):
    """The SQL type of a Siddhi attribute type on this engine's database.

    As siddhi-store-rdbms maps them, except that float is DOUBLE on MySQL/MariaDB (whose FLOAT
    reads back rounded to six digits) and strings take a collation that compares exactly: a
    binary one on MySQL/MariaDB (NO PAD, so trailing spaces count), "C" on PostgreSQL.
    """
    dialect = engine.dialect.name
    if kind == "string":
        size = length or STRING_SIZE
        if dialect == "mysql":
            return mysql.VARCHAR(size, charset="utf8mb4", collation=_mysql_binary_collation(engine))
        if dialect == "postgresql":
            return sa.String(size, collation="C")
        return sa.String(size)
    if kind == "int":
        return sa.Integer()
    if kind == "long":
        return sa.BigInteger()
    if kind == "float":
        return mysql.DOUBLE() if dialect == "mysql" else sa.REAL()
    if kind == "double":
        return sa.Double()
    if kind == "bool":
        return sa.Boolean()
    raise ValueError(kind)


def _exact_collation(dialect: str, collation: str | None) -> bool:
    """Whether string equality under `collation` (None: the default) is Java's String.equals."""
    if dialect == "postgresql":
        return True  # PostgreSQL's default collations are deterministic
    if dialect == "sqlite":
        return collation is None or collation.upper() == "BINARY"
    if dialect == "mysql":
        return collation is not None and (collation.endswith("_nopad_bin") or collation.endswith("_0900_bin") or collation == "binary")
    return False


class RdbmsTable(Table):
    """A table whose rows live in a database table.

    Created when missing (column_type); a hidden `sp_dagster_seq` column (auto-increment, the
    table's SQL primary key) keeps insertion order, @primaryKey becomes a UNIQUE constraint and
    each @index an index. An existing table (created by WSO2 or by hand) is used as it is: its
    columns are matched to the attributes by name, ignoring case; without `sp_dagster_seq` its
    rows come back in the database's order, and string columns without a binary collation are
    compared in Python. snapshot() holds nothing and restore() leaves the database alone, so a
    restored runtime sees the database as it is now. Each output chunk is one transaction;
    reads (joins, `in`) run in their own.
    """

    def __init__(self, definition: ast.TableDefinition, options: StoreOptions, connections: Connections):
        self.name = definition.name
        self.schema = Schema.of((a.name, a.type) for a in definition.attributes)
        for attribute in definition.attributes:
            if attribute.type == "object":
                raise app_error(f"table {self.name}: object attributes cannot be stored in a database ('{attribute.name}')", attribute)
            if attribute.name.lower() == SEQ:
                raise app_error(f"table {self.name}: '{attribute.name}' is the name of the column that keeps insertion order", attribute)
        self.key = primary_key(definition, self.schema)
        self.indexes = []
        for index in definition.annotations_named("index"):
            positions = [self.schema.index(e.value) for e in index.elements]
            if None in positions:
                raise app_error(f"@index names an attribute table {self.name} does not have", index)
            self.indexes.append(positions)
        self.options = options
        self.connections = connections
        self.engine_key, self.engine = connections.engine(options, self.name)
        self.dialect = self.engine.dialect.name
        self._conn: sa.Connection | None = None
        try:
            self._open(definition)
        except BaseException:
            connections.release(self.engine_key)
            raise
        self.readers = [_READERS[t] for t in self.schema.types]

    # -- the database table

    def _open(self, definition: ast.TableDefinition) -> None:
        with self._errors("open"):
            existing = self._existing()
            if existing is None:
                self._create()
                return
            table = sa.Table(existing, sa.MetaData(), autoload_with=self.engine)
        by_lower = {c.name.lower(): c for c in table.columns}
        columns = []
        for name in self.schema.names:
            column = by_lower.get(name.lower())
            if column is None:
                have = ", ".join(c.name for c in table.columns)
                raise EngineError(
                    f"table {self.name}: the database table '{existing}' at {self.options.shown} has no column '{name}' "
                    f"(it has {have}); drop that table or set table.name in @store to another one"
                )
            columns.append(column)
        self.table = table
        self.columns = columns
        self.seq = by_lower.get(SEQ)
        self.exact_strings = {
            i
            for i, (c, t) in enumerate(zip(columns, self.schema.types))
            if t == "string" and _exact_collation(self.dialect, getattr(c.type, "collation", None))
        }
        self.read_columns = [
            (c * sa.literal_column("1E0")).label(c.name)
            if self.dialect == "mysql" and isinstance(c.type, sa.Float) and not isinstance(c.type, sa.Double)
            else c
            for c in columns
        ]  # MySQL's FLOAT prints six digits; as a double it reads back exactly

    def _existing(self) -> str | None:
        """The name of the database table behind this one, or None when there is none yet."""
        wanted = self.options.table_name
        if self.options.check_query:
            try:
                with self.engine.connect() as conn:
                    conn.execute(sa.text(self.options.check_query))
            except sqlalchemy.exc.DBAPIError:
                return None
        names = sa.inspect(self.engine).get_table_names()
        if wanted in names:
            return wanted
        return next((n for n in names if n.lower() == wanted.lower()), None)

    def _create(self) -> None:
        metadata = sa.MetaData()
        lengths = self.options.field_lengths
        seq = sa.Column(SEQ, sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True)
        columns = [sa.Column(n, column_type(t, self.engine, lengths.get(n)), nullable=True) for n, t in zip(self.schema.names, self.schema.types)]
        extras: list = []
        if self.key is not None:
            extras.append(sa.UniqueConstraint(*[columns[i].name for i in self.key], name=_short(f"{self.options.table_name}_key")))
        for number, positions in enumerate(self.indexes, 1):
            suffix = "_index" if number == 1 else f"_index{number}"
            extras.append(sa.Index(_short(self.options.table_name + suffix), *[columns[i].name for i in positions]))
        table = sa.Table(self.options.table_name, metadata, seq, *columns, *extras)
        metadata.create_all(self.engine, checkfirst=True)
        log.info("table %s: created %s at %s", self.name, self.options.table_name, self.options.shown)
        self.table = table
        self.columns = [table.c[n] for n in self.schema.names]
        self.seq = table.c[SEQ]
        self.exact_strings = {i for i, t in enumerate(self.schema.types) if t == "string"}
        if self.dialect == "mysql" and not _exact_collation("mysql", _mysql_binary_collation(self.engine)):
            self.exact_strings = set()  # MySQL before 8 has no NO PAD binary collation
        self.read_columns = list(self.columns)

    @contextlib.contextmanager
    def _errors(self, doing: str):
        try:
            yield
        except EngineError:
            raise
        except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError) as exc:
            if getattr(exc, "connection_invalidated", False) or _is_connection_problem(exc):
                raise unreachable(self.name, self.options, exc) from None
            raise EngineError(f"table {self.name}: {doing} failed at {self.options.shown}: {_reason(exc)}") from None
        except sqlalchemy.exc.SQLAlchemyError as exc:
            raise EngineError(f"table {self.name}: {doing} failed at {self.options.shown}: {_reason(exc)}") from None

    @contextlib.contextmanager
    def _connection(self, doing: str):
        if self._conn is not None:
            yield self._conn
            return
        with self._errors(doing), self.engine.begin() as conn:
            yield conn

    @contextlib.contextmanager
    def transaction(self):
        if self._conn is not None:
            yield
            return
        with self._errors("writing"), self.engine.begin() as conn:
            self._conn = conn
            try:
                yield
            finally:
                self._conn = None

    # -- reading

    def compile_condition(self, expression, scope, offset) -> SqlCondition:
        return compile_condition(expression, scope, offset, self.columns, self.schema.types, self.exact_strings)

    def _row(self, values) -> tuple:
        return tuple(None if v is None else read(v) for v, read in zip(values, self.readers))

    def _select(self, condition: SqlCondition, data: tuple, timestamp: int, with_ids: bool = False) -> list[tuple[tuple, object]]:
        """(row, identity) of the rows the WHERE clause lets through, in table order."""
        columns = list(self.read_columns)
        if with_ids and self.seq is not None:
            columns.append(self.seq)
        statement = sa.select(*columns).select_from(self.table)
        where = condition.where(data, timestamp)
        if where is not None:
            statement = statement.where(where)
        if self.seq is not None:
            statement = statement.order_by(self.seq)
        width = len(self.read_columns)
        with self._connection("reading") as conn:
            result = conn.execute(statement).all()
        rows = []
        for values in result:
            row = self._row(values[:width])
            rows.append((row, values[width] if with_ids and self.seq is not None else row))
        return rows

    def candidates(self, condition, data, timestamp):
        return [row for row, _ in self._select(condition, data, timestamp)]

    def find(self, condition, data, timestamp):
        return [row for row, _ in self._select(condition, data, timestamp) if condition.holds(data, row, timestamp)]

    def contains(self, condition, data, timestamp):
        if not condition.exact:
            return any(condition.holds(data, row, timestamp) for row, _ in self._select(condition, data, timestamp))
        statement = sa.select(sa.literal(1)).select_from(self.table)
        where = condition.where(data, timestamp)
        if where is not None:
            statement = statement.where(where)
        with self._connection("reading") as conn:
            return conn.execute(statement.limit(1)).first() is not None

    # -- writing

    def _insert_statement(self):
        if self.key is None:
            return sa.insert(self.table)
        if self.dialect == "postgresql":
            return postgresql.insert(self.table).on_conflict_do_nothing()
        if self.dialect == "sqlite":
            return sqlite.insert(self.table).on_conflict_do_nothing()
        if self.dialect == "mysql":
            keep = self.columns[self.key[0]]
            return mysql.insert(self.table).on_duplicate_key_update({keep.name: keep})  # a duplicate changes nothing
        return sa.insert(self.table)

    def insert(self, rows):
        if not rows:
            return
        keys = [c.key for c in self.columns]
        values = [dict(zip(keys, row)) for row in rows]
        with self._connection("insert") as conn:
            conn.execute(self._insert_statement(), values)

    def _identity(self, identity) -> sa.ColumnElement:
        """The WHERE clause picking out one fetched row."""
        if self.seq is not None:
            return self.seq == sa.literal(identity, sa.BigInteger())
        row = identity
        positions = self.key if self.key is not None else range(len(self.columns))
        parts = [self.columns[i].is_(None) if row[i] is None else self.columns[i] == sa.literal(row[i]) for i in positions]
        return sa.and_(*parts)

    def _matched(self, condition: SqlCondition, data: tuple, timestamp: int) -> list[tuple[tuple, object]]:
        return [(row, ident) for row, ident in self._select(condition, data, timestamp, with_ids=True) if condition.holds(data, row, timestamp)]

    def _where_matched(self, matched: list[tuple[tuple, object]]) -> sa.ColumnElement:
        if self.seq is not None:
            return self.seq.in_([ident for _, ident in matched])
        return sa.or_(*[self._identity(ident) for _, ident in matched])

    def delete(self, condition, data, timestamp):
        with self._connection("delete") as conn:
            if condition.exact:
                statement = sa.delete(self.table)
                where = condition.where(data, timestamp)
                conn.execute(statement if where is None else statement.where(where))
                return
            matched = self._matched(condition, data, timestamp)
            if matched:
                conn.execute(sa.delete(self.table).where(self._where_matched(matched)))

    def update(self, condition, data, timestamp, assignments):
        types = self.schema.types
        keys = [c.key for c in self.columns]
        with self._connection("update") as conn:
            if condition.exact and not any(a.uses_table for a in assignments):
                where = condition.where(data, timestamp)
                if not assignments:
                    statement = sa.select(sa.func.count()).select_from(self.table)
                    return conn.execute(statement if where is None else statement.where(where)).scalar_one()
                probe = condition.probe(data, timestamp)
                values = {keys[a.index]: conform(a.value(probe), types[a.index]) for a in assignments}
                statement = sa.update(self.table).values(values)
                return conn.execute(statement if where is None else statement.where(where)).rowcount
            matched = self._matched(condition, data, timestamp)
            if not matched or not assignments:
                return len(matched)
            if not any(a.uses_table for a in assignments):
                probe = condition.probe(data, timestamp)
                values = {keys[a.index]: conform(a.value(probe), types[a.index]) for a in assignments}
                conn.execute(sa.update(self.table).where(self._where_matched(matched)).values(values))
                return len(matched)
            # a value reads the row itself: computed here, row by row
            for row, ident in matched:
                joined = StreamEvent(timestamp, splice(data, row, condition.offset))
                values = {keys[a.index]: conform(a.value(joined), types[a.index]) for a in assignments}
                conn.execute(sa.update(self.table).where(self._identity(ident)).values(values))
            return len(matched)

    # -- lifetime

    def stop(self) -> None:
        """Give the engine back (the last table of a database disposes of it)."""
        self.connections.release(self.engine_key)
        self.engine_key = None


def _is_connection_problem(exc: BaseException) -> bool:
    text = str(getattr(exc, "orig", exc)).lower()
    return any(word in text for word in ("connect", "connection", "server has gone away", "lost", "timeout", "timed out", "refused"))


def _short(name: str) -> str:
    return name if len(name) <= 60 else name[:60]
