"""State revisions: every instance's snapshots in the table of the seeds' `state.persistence` block.

The one store of revision rows. They live in `state.persistence.config.table` (default
PERSISTENCE_TABLE) of the datasource `state.persistence.config.datasource`, in WSO2's layout
(id, siddhiAppName, revision, snapshot) plus what this store needs: a number per instance
(1, 2, ...), when the revision was saved and by which node incarnation, and its size before
compression. Snapshots are stored gzip-compressed; a save deletes all but the newest
`revisionsToKeep` of its instance in the same transaction. A table of the first layout (no
numbers) is upgraded in place when the store opens it.

Owner fencing: a save names its owner `(node_id, incarnation)` and is refused (NotOwnerError)
unless the control plane assigns the instance to that live incarnation, so a fenced or
superseded worker cannot overwrite the state its successor restores.

- Table in the control-plane database: the check and the write are one transaction, and the
  check locks the instance's assignment row, so a reassignment waits until the save has
  committed (the new owner then restores it) or the save sees the new owner and is refused.
- Table in another database: the row is written first and ownership is read from the control
  plane just before the commit. Remaining window: the leader reassigns the instance *and* the
  new owner restores between that read and the commit (one round trip). The new owner then
  starts from the revision before, and the late one is stored as the newest until the new
  owner's first save supersedes it; should the new owner die before that save, its successor
  resumes from the late revision. Either way a whole, consistent revision is restored; events
  after it are processed again, as after any failover.
"""

from __future__ import annotations

import gzip
import logging
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import BigInteger, Column, Connection, Index, Integer, MetaData, String, Table, delete, func, inspect, select, text, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from sp_dagster.cluster.db import ControlPlane, Database, db_now_ms, short_reason
from sp_dagster.cluster.schema import ID, Blob
from sp_dagster.cluster.store.deployments import owns_instance
from sp_dagster.errors import NotOwnerError, PersistenceError

log = logging.getLogger(__name__)

DEFAULT_TABLE = "PERSISTENCE_TABLE"
# The columns of the first layout: a table that lacks one of them is not a revision table.
FIRST_LAYOUT = ("id", "siddhiAppName", "revision", "snapshot", "savedAt")


@dataclass(frozen=True)
class Revision:
    """One saved revision of an instance's state (`data` is decompressed; None when only listed)."""

    instance_id: str
    revision: int
    created_at: int
    raw_size: int
    stored_size: int
    saved_by: str | None = None
    data: bytes | None = None


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


def prepare_table(conn: Connection, table: Table) -> None:
    """Create the table, or upgrade one of the first layout in place (its rows numbered in save
    order); call it inside the database's schema_transaction()."""
    if not inspect(conn).has_table(table.name):
        table.create(conn)
        return
    present = {c["name"] for c in inspect(conn).get_columns(table.name)}
    lacking = [name for name in FIRST_LAYOUT if name not in present]
    if lacking:
        raise PersistenceError(
            f"table {table.name} has no column {', '.join(lacking)}: it is not a state-revision table; "
            "name another table in state.persistence.config.table"
        )
    quote = conn.dialect.identifier_preparer
    for column in [c for c in table.columns if c.name not in present]:
        conn.execute(text(f"ALTER TABLE {quote.format_table(table)} ADD COLUMN {quote.format_column(column)} {column.type.compile(dialect=conn.dialect)}"))
    _number_revisions(conn, table)
    for row_id in conn.execute(select(table.c.id).where(table.c.rawSize.is_(None))).scalars().all():
        snapshot = conn.execute(select(table.c.snapshot).where(table.c.id == row_id)).scalar_one()
        conn.execute(update(table).where(table.c.id == row_id).values(rawSize=len(gzip.decompress(snapshot))))
    indexes = {i["name"] for i in inspect(conn).get_indexes(table.name)}
    for index in table.indexes:
        if index.name not in indexes:
            index.create(conn)


def _number_revisions(conn: Connection, table: Table) -> None:
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
    table = revision_table(DEFAULT_TABLE)
    prepare_table(conn, table)
    for key in keys:
        row = conn.execute(select(retired).where(r.instance_id == key.instance_id, r.revision == key.revision)).one()
        conn.execute(
            table.insert().values(
                siddhiAppName=row.instance_id, revision=f"{row.created_at}_{row.instance_id}",
                snapshot=gzip.compress(zlib.decompress(row.data), compresslevel=6, mtime=0),
                savedAt=row.created_at, rawSize=row.raw_size, revisionNumber=None, savedBy=None,
            )
        )
    _number_revisions(conn, table)
    log.warning(
        "moved %d state revision(s) from sp_state_revisions to %s in the control-plane database; workers restore "
        "them when their state.persistence.config names this datasource and table", len(keys), DEFAULT_TABLE,
    )
    return len(keys)


def same_database(a: str, b: str) -> bool:
    """True when two SQLAlchemy URLs name the same database (one SQLite file however it is spelled)."""
    first, second = make_url(a), make_url(b)
    if first.get_backend_name() == second.get_backend_name() == "sqlite" and first.database and second.database:
        return Path(first.database).expanduser().resolve() == Path(second.database).expanduser().resolve()
    return first == second


class RevisionStore:
    """The state revisions in one table of `database`; ownership is decided by `plane`
    (which may be `database` itself). See the module docstring."""

    def __init__(self, database: Database, plane: ControlPlane, *, table: str = DEFAULT_TABLE, keep: int = 2):
        if keep < 1:
            raise PersistenceError(f"revisionsToKeep must be at least 1, not {keep}")
        self.database = database
        self.plane = plane
        self.keep = keep
        self.table = revision_table(table)
        self.shares_control_plane = database is plane
        try:
            database.run(self._prepare)
        except sa_exc.SQLAlchemyError as error:
            raise PersistenceError(f"cannot open the revision table {table} at {database.safe_url}: {short_reason(error)}") from None

    @classmethod
    def from_config(cls, config, plane: ControlPlane) -> "RevisionStore":
        """The store a Config's `state.persistence` names, its ownership decided by `plane`."""
        source = config.persistence_datasource
        shared = same_database(source.url, plane.url)
        database = plane if shared else Database(
            source.url, pool_size=source.max_pool_size, datasource_name=source.name,
            role="persistence database", setting="state.persistence.config.datasource",
        )
        try:
            return cls(database, plane, table=config.persistence.config.table, keep=config.persistence.revisions_to_keep)
        except Exception:
            if not shared:
                database.close()
            raise

    def _prepare(self) -> None:
        with self.database.schema_transaction() as conn:
            prepare_table(conn, self.table)

    def save(self, instance_id: str, data: bytes, *, owner: tuple[str, int | None] | None = None) -> int:
        """Store a new revision (compressed) and keep the newest `keep`; returns its number.

        With `owner`, refused (NotOwnerError, nothing written) unless that node incarnation owns the instance.
        """
        blob = gzip.compress(bytes(data), compresslevel=6, mtime=0)
        t = self.table.c

        def work() -> int:
            with self.database.transaction() as conn:
                if owner is not None and self.shares_control_plane:
                    self._check_owner(conn, instance_id, owner, lock=True)
                now = int(conn.execute(select(db_now_ms())).scalar_one())
                number = (conn.execute(select(func.max(t.revisionNumber)).where(t.siddhiAppName == instance_id)).scalar() or 0) + 1
                conn.execute(
                    self.table.insert().values(
                        siddhiAppName=instance_id, revision=f"{now}_{instance_id}", snapshot=blob, savedAt=now,
                        revisionNumber=number, rawSize=len(data), savedBy=f"{owner[0]}/{owner[1]}" if owner else None,
                    )
                )
                conn.execute(delete(self.table).where(t.siddhiAppName == instance_id, t.revisionNumber <= number - self.keep))
                if owner is not None and not self.shares_control_plane:
                    with self.plane.transaction() as plane_conn:  # last thing before the commit
                        self._check_owner(plane_conn, instance_id, owner, lock=False)
                return number

        for attempt in range(3):
            try:
                return self.database.run(work)
            except sa_exc.IntegrityError:  # another save took the same number at the same moment
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    @staticmethod
    def _check_owner(conn: Connection, instance_id: str, owner: tuple[str, int | None], *, lock: bool) -> None:
        node_id, incarnation = owner
        if incarnation is None or not owns_instance(conn, node_id, incarnation, instance_id, lock=lock):
            raise NotOwnerError(f"instance {instance_id} is not assigned to node {node_id} incarnation {incarnation}; its state was not saved")

    def latest(self, instance_id: str) -> Revision | None:
        """The newest revision of an instance with its data, or None when it has none."""
        t = self.table.c
        with self.database.transaction() as conn:
            row = conn.execute(
                select(self.table).where(t.siddhiAppName == instance_id).order_by(t.revisionNumber.desc()).limit(1)
            ).one_or_none()
        if row is None:
            return None
        return Revision(
            row.siddhiAppName, int(row.revisionNumber), int(row.savedAt), int(row.rawSize), len(row.snapshot), row.savedBy,
            gzip.decompress(row.snapshot),
        )

    def revisions(self, instance_id: str) -> list[Revision]:
        """An instance's revisions, oldest first, without their data."""
        t = self.table.c
        with self.database.transaction() as conn:
            rows = conn.execute(
                select(t.siddhiAppName, t.revisionNumber, t.savedAt, t.rawSize, t.savedBy, func.length(t.snapshot).label("stored"))
                .where(t.siddhiAppName == instance_id)
                .order_by(t.revisionNumber)
            ).all()
        return [Revision(x.siddhiAppName, int(x.revisionNumber), int(x.savedAt), int(x.rawSize), int(x.stored), x.savedBy) for x in rows]

    def prune(self, instance_id: str, keep: int | None = None) -> int:
        """Delete all but the newest `keep` (default revisionsToKeep) revisions; returns how many went."""
        t = self.table.c
        with self.database.transaction() as conn:
            newest = conn.execute(select(func.max(t.revisionNumber)).where(t.siddhiAppName == instance_id)).scalar()
            if newest is None:
                return 0
            limit = newest - (self.keep if keep is None else keep)
            return conn.execute(delete(self.table).where(t.siddhiAppName == instance_id, t.revisionNumber <= limit)).rowcount

    def delete(self, instance_ids: Iterable[str]) -> int:
        """Delete every revision of these instances; returns how many went."""
        ids = list(instance_ids)
        if not ids:
            return 0
        with self.database.transaction() as conn:
            return conn.execute(delete(self.table).where(self.table.c.siddhiAppName.in_(ids))).rowcount

    def close(self) -> None:
        """Release the persistence database (the control plane stays open: it is its owner's)."""
        if not self.shares_control_plane:
            self.database.close()
