"""The control-plane schema and its versioned migrations.
`sp_schema_version` holds the version the database is at; `migrate()` applies, in order and under a
lock, every migration the database lacks, upgrading an older database in place and refusing a newer
one (docs/concepts/control-plane.md, "Databases").
"""

from __future__ import annotations

import gzip
import logging
import zlib
from collections.abc import Callable

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.dialects import mysql

from sp_dagster.errors import ControlPlaneError, PersistenceError
from sp_dagster.wording import counted

log = logging.getLogger(__name__)

# All timestamps are BIGINT milliseconds taken from the database's clock (`db_now_ms()`).
metadata = MetaData()

ID = 255  # ids are VARCHAR(255): indexable under MySQL's key-length limit with utf8mb4
LongText = Text().with_variant(mysql.MEDIUMTEXT(), "mysql", "mariadb")
Blob = LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")

schema_version = Table(
    "sp_schema_version",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("version", Integer, nullable=False),
)

# --- version 1: coordination -------------------------------------------------------------

leader_lease = Table(
    "sp_leader_lease",
    metadata,
    Column("group_id", String(ID), primary_key=True),
    Column("term", BigInteger, nullable=False, default=0),  # the fencing term: only grows
    Column("holder", String(ID)),  # manager node id
    Column("holder_incarnation", String(64)),  # that manager process's random id
    Column("acquired_at", BigInteger),
    Column("renewed_at", BigInteger),
    Column("expires_at", BigInteger, nullable=False, default=0),
    # Bumped by every election and every fenced write: a total order of leader actions.
    Column("fence_seq", BigInteger, nullable=False, default=0),
    Column("rebalance_requests", BigInteger, nullable=False, default=0),
    # The leader's worker timing, so workers heartbeat at the pace it expects.
    Column("node_heartbeat_ms", BigInteger),
    Column("node_max_retry", Integer),
)

terms = Table(
    "sp_terms",
    metadata,
    Column("group_id", String(ID), primary_key=True),
    Column("term", BigInteger, primary_key=True, autoincrement=False),
    Column("holder", String(ID), nullable=False),
    Column("holder_incarnation", String(64), nullable=False),
    Column("elected_at", BigInteger, nullable=False),
)

managers = Table(
    "sp_managers",
    metadata,
    Column("group_id", String(ID), primary_key=True),
    Column("node_id", String(ID), primary_key=True),
    Column("incarnation", String(64), nullable=False),
    Column("address", String(ID), nullable=False, default=""),
    Column("started_at", BigInteger, nullable=False),
    Column("last_heartbeat", BigInteger, nullable=False),
    Column("state", String(16), nullable=False),  # running | stopped
    Column("metrics_url", String(ID)),  # its Prometheus endpoint, when it serves one (version 6)
)

nodes = Table(
    "sp_nodes",
    metadata,
    Column("node_id", String(ID), primary_key=True),
    Column("role", String(16), nullable=False),  # worker | receiver
    Column("address", String(ID), nullable=False, default=""),
    Column("incarnation", Integer, nullable=False),
    Column("state", String(16), nullable=False),  # alive | dead | left
    Column("registered_at", BigInteger, nullable=False),
    Column("last_heartbeat", BigInteger, nullable=False),
    Column("state_changed_at", BigInteger, nullable=False),
    Column("metrics", Text),  # JSON
)

events = Table(
    "sp_events",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("at", BigInteger, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("term", BigInteger),
    Column("seq", BigInteger),
    Column("actor", String(ID)),
    Column("subject", String(ID)),
    Column("detail", Text),  # JSON
)

# --- version 2: deployments, placement and state -------------------------------------------

deployments = Table(
    "sp_deployments",
    metadata,
    Column("app", String(ID), primary_key=True),
    Column("content_hash", String(128), nullable=False),
    Column("source", LongText, nullable=False),
    Column("plan", LongText, nullable=False),  # JSON
    Column("status", String(16), nullable=False),  # waiting | partial | placed
    Column("waiting_reason", Text),
    Column("generation", Integer, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
)

instances = Table(
    "sp_instances",
    metadata,
    Column("instance_id", String(ID), primary_key=True),
    Column("app", String(ID), nullable=False, index=True),
    Column("group_name", String(ID), nullable=False),
    Column("parallel_index", Integer, nullable=False),
    Column("receiver", Boolean, nullable=False, default=False),
    Column("siddhi_app", LongText, nullable=False),
    Column("extra", LongText, nullable=False),  # JSON from the planner
    Column("spec_hash", String(64), nullable=False),
    # Reported by the worker running it (only the current assignee's reports are kept).
    Column("status", String(16), nullable=False),  # pending | assigned | starting | running | stopped | failed
    Column("status_detail", Text),
    Column("metrics", Text),  # JSON
    Column("status_at", BigInteger),
)

assignments = Table(
    "sp_assignments",
    metadata,
    Column("instance_id", String(ID), primary_key=True),
    Column("node_id", String(ID), nullable=False),
    Column("node_incarnation", Integer, nullable=False),
    Column("term", BigInteger, nullable=False),  # the leader term that made (or confirmed) it
    Column("seq", BigInteger, nullable=False),  # the lease's fence_seq of that write
    Column("assigned_at", BigInteger, nullable=False),
    Index("ix_sp_assignments_node", "node_id"),
)

# --- version 4: dropped state ---------------------------------------------------------------

# When an operator dropped an instance's state (`undeploy --drop-state`): its next deployment starts
# it empty at its committed offsets, whatever revisions or checkpoints of before are still found.
state_drops = Table(
    "sp_state_drops",
    metadata,
    Column("instance_id", String(ID), primary_key=True),
    Column("dropped_at", BigInteger, nullable=False),  # ms, the dropping machine's clock (as deploy --fresh's)
)

# --- version 5: graceful moves --------------------------------------------------------------

# An instance the leader moves off a live node: it stays assigned there until that node has stopped
# it with a last checkpoint (`asked_at` set: its turn came), then goes to `to_node` (cluster.store.moves).
moves = Table(
    "sp_moves",
    metadata,
    Column("instance_id", String(ID), primary_key=True),
    Column("from_node", String(ID), nullable=False),
    Column("from_incarnation", Integer, nullable=False),
    Column("to_node", String(ID), nullable=False),
    Column("planned_at", BigInteger, nullable=False),
    Column("asked_at", BigInteger),  # when the owner was asked to stop it (None: waiting for its group's turn)
)

# --- version 7: load samples ----------------------------------------------------------------

# The load of each execution group as the leader samples it, for parallelism advice (cluster.advice):
# the last few minutes only (cluster.store.load prunes the rest).
group_load = Table(
    "sp_group_load",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("app", String(ID), nullable=False),
    Column("group_name", String(ID), nullable=False),
    Column("at", BigInteger, nullable=False),
    Column("parallel", Integer, nullable=False),  # instances of the group when sampled
    Column("input_end", BigInteger),  # the sum of its input topics' end offsets (None: not read)
    Column("sample", Text, nullable=False),  # JSON: arrival_per_s, processed_per_s, busy, lag
    Index("ix_sp_group_load_at", "app", "group_name", "at"),
)

# Tables that a later migration removed: kept here so that the migrations that created them
# still do, and a fresh database passes through the same shapes as an upgraded one.
retired = MetaData()

# Version 3 moved its rows into the revision store's table (sp_dagster.cluster.store.revisions).
state_revisions = Table(
    "sp_state_revisions",
    retired,
    Column("instance_id", String(ID), primary_key=True),
    Column("revision", BigInteger, primary_key=True, autoincrement=False),
    Column("created_at", BigInteger, nullable=False),
    Column("raw_size", BigInteger, nullable=False),
    Column("data", Blob, nullable=False),  # zlib-compressed
)


def _create(*tables: Table) -> Callable[[Connection], None]:
    def apply(conn: Connection) -> None:
        for table in tables:  # no foreign keys: any order will do
            table.create(conn, checkfirst=True)

    return apply


def add_missing_columns(conn: Connection, table: Table) -> None:
    """ALTER TABLE ... ADD COLUMN for each column of `table` the database's table lacks (they must be nullable)."""
    present = {c["name"] for c in inspect(conn).get_columns(table.name)}
    quote = conn.dialect.identifier_preparer
    for column in [c for c in table.columns if c.name not in present]:
        conn.execute(text(f"ALTER TABLE {quote.format_table(table)} ADD COLUMN {quote.format_column(column)} {column.type.compile(dialect=conn.dialect)}"))


def _add_columns(table: Table) -> Callable[[Connection], None]:
    return lambda conn: add_missing_columns(conn, table)


def _move_state_revisions(conn: Connection) -> None:
    """Version 3: state revisions live in the revision store's table (the seeds' PERSISTENCE_TABLE)."""
    if inspect(conn).has_table(state_revisions.name):
        adopt_retired_revisions(conn, state_revisions)
        state_revisions.drop(conn)


# MIGRATIONS[i] takes a database from version i to version i + 1. Adding a migration: append a function.
# When a later migration alters a table that an earlier one creates, first copy that table's earlier shape
# into the earlier migration, so a fresh database and an upgraded one end up identical.
MIGRATIONS: list[Callable[[Connection], None]] = [
    _create(leader_lease, terms, managers, nodes, events),
    _create(deployments, instances, assignments, state_revisions),
    _move_state_revisions,
    _create(state_drops),
    _create(moves),
    _add_columns(managers),  # metrics_url
    _create(group_load),
]
SCHEMA_VERSION = len(MIGRATIONS)


def current_version(conn: Connection) -> int:
    """The schema version of the database (0 when it has no sp-dagster tables)."""
    if not inspect(conn).has_table(schema_version.name):
        return 0
    return int(conn.execute(select(schema_version.c.version).where(schema_version.c.id == 1)).scalar() or 0)


def migrate(plane, target: int = SCHEMA_VERSION) -> int:
    """Apply the missing migrations up to `target` under a lock; returns the resulting version."""
    with plane.schema_transaction() as conn:
        version = current_version(conn)
        _refuse_newer(plane, version)
        if version == 0:
            metadata.create_all(conn, tables=[schema_version], checkfirst=True)
            conn.execute(schema_version.insert().values(id=1, version=0))
        for step in range(version, target):
            MIGRATIONS[step](conn)
            conn.execute(schema_version.update().where(schema_version.c.id == 1).values(version=step + 1))
            log.info("control-plane schema at %s upgraded to version %d", plane.safe_url, step + 1)
        return max(version, target)


def check_version(plane) -> int:
    """The database's schema version, refusing one newer than this code (no changes made)."""
    with plane.transaction() as conn:
        version = current_version(conn)
    _refuse_newer(plane, version)
    return version


def _refuse_newer(plane, version: int) -> None:
    if version > SCHEMA_VERSION:
        raise ControlPlaneError(
            f"the control-plane database {plane.safe_url} has schema version {version}, newer than this "
            f"sp-dagster's ({SCHEMA_VERSION}); upgrade sp-dagster on this node"
        )


# --------------------------------------------------------------------------- the state-revision table
# The layout of the revision store's table (sp_dagster.cluster.store.revisions): in the control-plane
# database by default (version 3 moves the retired sp_state_revisions there), or in another database.

DEFAULT_REVISION_TABLE = "PERSISTENCE_TABLE"
# The columns of the first layout: a table that lacks one of them is not a revision table.
FIRST_LAYOUT = ("id", "siddhiAppName", "revision", "snapshot", "savedAt")


def revision_table(name: str) -> Table:
    """The layout of a revision table called `name`."""
    return Table(
        name,
        MetaData(),
        Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
        Column("siddhiAppName", String(ID), nullable=False),  # the instance id
        Column("revision", String(300), nullable=False),  # WSO2's label: <savedAt>_<instance>
        Column("snapshot", Blob, nullable=False),  # gzip-compressed
        Column("savedAt", BigInteger, nullable=False),  # the database's clock, ms
        # Nullable because ALTER TABLE adds them to tables of the first layout; always written.
        Column("revisionNumber", BigInteger),
        Column("rawSize", BigInteger),
        Column("savedBy", String(ID)),  # <node id>/<incarnation>
        Index(f"ux_{name[:48]}_revision", "siddhiAppName", "revisionNumber", unique=True),
    )


def prepare_revision_table(conn: Connection, table: Table) -> None:
    """Create the table, or upgrade one of the first layout in place (its rows numbered in save
    order); call it inside the database's schema_transaction()."""
    if not inspect(conn).has_table(table.name):
        table.create(conn)
        return
    present = {c["name"] for c in inspect(conn).get_columns(table.name)}
    lacking = [name for name in FIRST_LAYOUT if name not in present]
    if lacking:
        raise PersistenceError(
            f"table {table.name} has no column {', '.join(lacking)}: it is not a state-revision table; name another table in state.persistence.config.table"
        )
    add_missing_columns(conn, table)
    number_revisions(conn, table)
    for row_id in conn.execute(select(table.c.id).where(table.c.rawSize.is_(None))).scalars().all():
        snapshot = conn.execute(select(table.c.snapshot).where(table.c.id == row_id)).scalar_one()
        conn.execute(update(table).where(table.c.id == row_id).values(rawSize=len(gzip.decompress(snapshot))))
    indexes = {i["name"] for i in inspect(conn).get_indexes(table.name)}
    for index in table.indexes:
        if index.name not in indexes:
            index.create(conn)


def number_revisions(conn: Connection, table: Table) -> None:
    """Number 1, 2, ... in save order the revisions of every instance that has an unnumbered one."""
    c = table.c
    for instance_id in conn.execute(select(c.siddhiAppName).where(c.revisionNumber.is_(None)).distinct()).scalars().all():
        conn.execute(update(table).where(c.siddhiAppName == instance_id).values(revisionNumber=None))
        ids = conn.execute(select(c.id).where(c.siddhiAppName == instance_id).order_by(c.savedAt, c.id)).scalars().all()
        for number, row_id in enumerate(ids, start=1):
            conn.execute(update(table).where(c.id == row_id).values(revisionNumber=number))


def adopt_retired_revisions(conn: Connection, retired: Table) -> int:
    """Migration: copy the rows of the control plane's retired sp_state_revisions (zlib) into this
    database's PERSISTENCE_TABLE, merged in save order with any revisions already there."""
    r = retired.c
    keys = conn.execute(select(r.instance_id, r.revision).order_by(r.instance_id, r.revision)).all()
    if not keys:
        return 0
    table = revision_table(DEFAULT_REVISION_TABLE)
    prepare_revision_table(conn, table)
    for key in keys:
        row = conn.execute(select(retired).where(r.instance_id == key.instance_id, r.revision == key.revision)).one()
        conn.execute(
            table.insert().values(
                siddhiAppName=row.instance_id,
                revision=f"{row.created_at}_{row.instance_id}",
                snapshot=gzip.compress(zlib.decompress(row.data), compresslevel=6, mtime=0),
                savedAt=row.created_at,
                rawSize=row.raw_size,
                revisionNumber=None,
                savedBy=None,
            )
        )
    number_revisions(conn, table)
    log.warning(
        "moved %s from sp_state_revisions to %s in the control-plane database; workers restore "
        "them when their state.persistence.config names this datasource and table",
        counted(len(keys), "state revision"),
        DEFAULT_REVISION_TABLE,
    )
    return len(keys)
