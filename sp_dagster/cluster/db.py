"""The cluster's databases (the control plane, the persistence database): engines, the database's clock, locks and errors.
SQLite, MySQL/MariaDB and PostgreSQL are set up here so that the rest of the package writes portable
SQL, and `db_now_ms()` is the server's clock: every lease and heartbeat timestamp comes from it, never
from a host's (docs/concepts/control-plane.md, "Databases").
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import BigInteger, Connection, Engine, event, select, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.functions import FunctionElement

from sp_dagster.cluster.schema import migrate as migrate_schema
from sp_dagster.config.datasources import create_engine
from sp_dagster.errors import ControlPlaneError, DatabaseUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

CONNECT_TIMEOUT_S = 5
# A link that went silent (a network partition) fails a call within about this long instead of the
# kernel's retransmission limit (~15 min): TCP keepalives and a user timeout (PostgreSQL), socket
# read/write timeouts above the lock-wait timeout (MySQL/MariaDB).
LINK_TIMEOUT_S = 10
MYSQL_SOCKET_TIMEOUT_S = 30  # above innodb_lock_wait_timeout (20 s): a lock wait fails as itself
# A transaction left open this long by a stalled client is rolled back by the server. Its row locks hold
# everyone else back until then: a leader cut off mid-pass kept the next leader waiting this long, so it is
# kept near the managers' default lease (2 s); our transactions never idle between statements for long.
IDLE_IN_TRANSACTION_TIMEOUT_S = 3
SQLITE_BUSY_TIMEOUT_S = 30
# The lock that processes changing sp-dagster's tables in one database take turns on.
SCHEMA_LOCK_NAME, SCHEMA_LOCK_KEY = "sp_dagster.schema", 7301450961


class db_now_ms(FunctionElement):
    """SQL expression: the database server's current time in milliseconds since the epoch."""

    type = BigInteger()
    inherit_cache = True


@compiles(db_now_ms, "sqlite")
def _now_sqlite(element, compiler, **kw):
    return "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"


@compiles(db_now_ms, "postgresql")
def _now_postgresql(element, compiler, **kw):
    # clock_timestamp(), not now(): now() is frozen at the start of the transaction.
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"


@compiles(db_now_ms, "mysql")
@compiles(db_now_ms, "mariadb")
def _now_mysql(element, compiler, **kw):
    return "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"


def _sqlite_path(url: str) -> str | None:
    database = make_url(url).database
    return None if database in (None, "", ":memory:") else database


def create_control_plane_engine(url: str, pool_size: int | None = None) -> Engine:
    """An engine for the control plane, tuned per dialect.

    - every transaction on SQLite (a file shared by processes on one host) starts with ``BEGIN IMMEDIATE``
      (one writer at a time, and no lock upgrade that could fail half-way), in WAL mode with a generous
      busy timeout;
    - MySQL/MariaDB (pymysql) sessions run at READ COMMITTED in UTC, PostgreSQL (psycopg) keeps READ COMMITTED;
    - a session that stalls inside a transaction is ended by the server (PostgreSQL, MariaDB), so a frozen
      process cannot hold the lease row's lock for ever, and a call over a link gone silent fails on the
      client's side within seconds (LINK_TIMEOUT_S).
    """
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    kwargs: dict[str, Any] = {"pool_pre_ping": True, "future": True}
    if backend == "sqlite":
        path = _sqlite_path(url)
        if path is None:
            kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
        else:
            Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
            kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False}
        engine = create_engine(url, **kwargs)
        _setup_sqlite(engine, wal=path is not None)
        return engine
    kwargs.update(pool_size=pool_size or 5, max_overflow=5, pool_recycle=1800)
    if backend == "postgresql":
        options = f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_TIMEOUT_S * 1000}"
        kwargs["connect_args"] = {
            "connect_timeout": CONNECT_TIMEOUT_S,
            "options": options,
            "keepalives": 1,
            "keepalives_idle": LINK_TIMEOUT_S // 2,
            "keepalives_interval": 1,
            "keepalives_count": LINK_TIMEOUT_S // 2,
            "tcp_user_timeout": LINK_TIMEOUT_S * 1000,
        }
    elif backend in ("mysql", "mariadb"):
        timeouts = {"read_timeout": MYSQL_SOCKET_TIMEOUT_S, "write_timeout": MYSQL_SOCKET_TIMEOUT_S}
        kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S, **timeouts}
        kwargs["isolation_level"] = "READ COMMITTED"
    engine = create_engine(url, **kwargs)
    if backend in ("mysql", "mariadb"):
        _setup_mysql(engine)
    return engine


def _setup_sqlite(engine: Engine, wal: bool) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_connection.cursor()
        if wal:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection):
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _setup_mysql(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record):
        cursor = dbapi_connection.cursor()
        cursor.execute("SET time_zone = '+00:00'")
        cursor.execute("SET SESSION innodb_lock_wait_timeout = 20")
        try:  # MariaDB only: end transactions a stalled client left open
            cursor.execute(f"SET SESSION idle_transaction_timeout = {IDLE_IN_TRANSACTION_TIMEOUT_S}")
        except Exception:  # MySQL has no such variable
            pass
        cursor.close()


# Error numbers/states that mean "try the transaction again", not "the database is gone".
_MYSQL_TRANSIENT = {1205, 1213}  # lock wait timeout, deadlock
_PG_TRANSIENT = {"40001", "40P01", "55P03"}  # serialization failure, deadlock, lock not available


def is_transient(error: BaseException) -> bool:
    """True for a conflict worth retrying at once (deadlock, lock timeout, SQLite busy)."""
    orig = getattr(error, "orig", None)
    if orig is None:
        return False
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate in _PG_TRANSIENT:
        return True
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and args[0] in _MYSQL_TRANSIENT:
        return True
    text = str(orig).lower()
    return "database is locked" in text or "database table is locked" in text or "busy" in text


def is_unavailable(error: BaseException) -> bool:
    """True when the error means the database (or the connection to it) is gone."""
    if isinstance(error, sa_exc.DBAPIError) and error.connection_invalidated:
        return True
    return isinstance(error, (sa_exc.OperationalError, sa_exc.InterfaceError)) and not is_transient(error)


def short_reason(error: BaseException) -> str:
    """The first line of the driver's message, without SQLAlchemy's decorations."""
    orig = getattr(error, "orig", None) or error
    text = str(orig).strip().splitlines()
    return text[0] if text else type(orig).__name__


def insert_ignore(conn: Connection, table, values: dict) -> int:
    """INSERT a row unless one with the same key exists; returns 1 when inserted, else 0."""
    name = conn.dialect.name
    if name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert

        statement = insert(table).values(**values).on_conflict_do_nothing()
    elif name in ("mysql", "mariadb"):
        statement = table.insert().values(**values).prefix_with("IGNORE")
    else:
        statement = table.insert().values(**values).prefix_with("OR IGNORE")
    return conn.execute(statement).rowcount


class Database:
    """A handle on one of the cluster's databases: engine, transactions and retries.

    `role` and `setting` name the database and the configuration key behind it in the one-line
    error for an unreachable database.
    """

    role = "database"
    setting = "its datasource"

    def __init__(self, url: str, *, pool_size: int | None = None, datasource_name: str | None = None, role: str | None = None, setting: str | None = None):
        self.url = url
        self.datasource_name = datasource_name
        self.role = role or self.role
        self.setting = setting or self.setting
        self.engine = create_control_plane_engine(url, pool_size)
        self.dialect = self.engine.dialect.name

    @property
    def safe_url(self) -> str:
        """The URL with its password hidden."""
        return self.engine.url.render_as_string(hide_password=True)

    def unavailable(self, error: BaseException) -> DatabaseUnavailable:
        """The one-line error for an unreachable database."""
        where = f" (datasource {self.datasource_name})" if self.datasource_name else ""
        return DatabaseUnavailable(
            f"{self.role} {self.safe_url}{where} is unreachable: {short_reason(error)}; "
            f"check that the database server is running and that {self.setting} points at it"
        )

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One transaction; connection failures become DatabaseUnavailable."""
        try:
            with self.engine.begin() as conn:
                yield conn
        except (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.DBAPIError) as error:
            if is_unavailable(error):
                raise self.unavailable(error) from error
            raise

    @contextlib.contextmanager
    def schema_transaction(self) -> Iterator[Connection]:
        """A transaction that holds this database's schema lock until it has committed, so that
        processes changing sp-dagster's tables at the same moment take turns."""
        if self.dialect not in ("mysql", "mariadb"):
            with self.transaction() as conn:
                if self.dialect == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})  # until the commit
                # SQLite: BEGIN IMMEDIATE already makes the transaction the only writer.
                yield conn
            return
        # MySQL/MariaDB: a session lock on a connection of its own (DDL commits implicitly,
        # which would drop a row lock), released once the work has committed.
        try:
            with self.engine.connect() as holder:
                if holder.execute(text("SELECT GET_LOCK(:name, 60)"), {"name": SCHEMA_LOCK_NAME}).scalar() != 1:
                    raise ControlPlaneError(f"timed out waiting for another process to finish changing the schema of {self.safe_url}")
                try:
                    with self.transaction() as conn:
                        yield conn
                finally:
                    holder.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": SCHEMA_LOCK_NAME})
        except (sa_exc.OperationalError, sa_exc.InterfaceError) as error:
            if is_unavailable(error):
                raise self.unavailable(error) from error
            raise

    def run(self, work: Callable[[], T], attempts: int = 5) -> T:
        """Call `work` (which opens its own transactions), retrying transient conflicts."""
        for attempt in range(1, attempts + 1):
            try:
                return work()
            except sa_exc.DBAPIError as error:
                if not is_transient(error) or attempt == attempts:
                    if is_unavailable(error):
                        raise self.unavailable(error) from error
                    raise
                log.debug("transient conflict on %s (%s); retrying", self.safe_url, short_reason(error))
                time.sleep(random.uniform(0.01, 0.05) * attempt)
        raise AssertionError("unreachable")

    def now_ms(self) -> int:
        """The database server's current time in milliseconds."""
        with self.transaction() as conn:
            return int(conn.execute(select(db_now_ms())).scalar_one())

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ControlPlane(Database):
    """The control-plane database: a Database whose schema this package creates and upgrades."""

    role = "control-plane database"
    setting = "deployment.config.datasource"

    @classmethod
    def from_config(cls, config, *, migrate: bool = True) -> ControlPlane:
        """Open the control plane named by a Config (`deployment.config.datasource`), upgrading its schema."""
        source = config.control_plane
        plane = cls(source.url, pool_size=source.max_pool_size, datasource_name=source.name)
        if migrate:
            plane.migrate()
        return plane

    def migrate(self) -> int:
        """Create or upgrade the schema to this version's; returns the schema version."""
        return self.run(lambda: migrate_schema(self))


class Connectivity:
    """Whether a loop reaches the control plane: one log line per change, and how long to back off."""

    def __init__(self, plane: ControlPlane, base_s: float, cap_s: float, logger: logging.Logger | None = None):
        self.plane = plane
        self.base_s = base_s
        self.cap_s = max(cap_s, base_s)
        self.log = logger or log
        self.failures = 0
        self._down_since: float | None = None

    @property
    def down(self) -> bool:
        """True between a failure and the next success."""
        return self._down_since is not None

    def failed(self, error: BaseException) -> float:
        """Note a failed attempt; returns the seconds to wait before the next one."""
        self.failures += 1
        if self._down_since is None:
            self._down_since = time.monotonic()
            self.log.warning("%s; retrying with backoff up to %.1f s", error, self.cap_s)
        delay = min(self.cap_s, self.base_s * 2 ** (self.failures - 1))
        return delay * random.uniform(0.8, 1.0)

    def succeeded(self) -> None:
        """Note a successful attempt (logs once when the database is back)."""
        if self._down_since is not None:
            self.log.warning("control-plane database %s is reachable again after %.1f s", self.plane.safe_url, time.monotonic() - self._down_since)
        self._down_since = None
        self.failures = 0


def open_control_plane(url_or_plane: str | ControlPlane) -> ControlPlane:
    """A ControlPlane for a URL (schema upgraded), or the given one unchanged."""
    if isinstance(url_or_plane, ControlPlane):
        return url_or_plane
    plane = ControlPlane(url_or_plane)
    plane.migrate()
    return plane


__all__ = [
    "Connectivity",
    "ControlPlane",
    "ControlPlaneError",
    "Database",
    "DatabaseUnavailable",
    "create_control_plane_engine",
    "db_now_ms",
    "insert_ignore",
    "is_transient",
    "is_unavailable",
    "open_control_plane",
]
