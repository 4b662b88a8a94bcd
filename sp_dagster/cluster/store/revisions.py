"""State revisions: every instance's snapshots in the table of the seeds' `state.persistence` block.
`RevisionStore` is the one store of revision rows; its saves are owner-fenced, so a fenced or
superseded worker cannot overwrite the state its successor restores (docs/concepts/delivery.md,
"Dead letters and saved state").
"""

from __future__ import annotations

import gzip
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, delete, func, select
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from sp_dagster.cluster.db import ControlPlane, Database, db_now_ms, short_reason
from sp_dagster.cluster.schema import DEFAULT_REVISION_TABLE as DEFAULT_TABLE
from sp_dagster.cluster.schema import prepare_revision_table, revision_table
from sp_dagster.cluster.store.deployments import owns_instance
from sp_dagster.errors import NotOwnerError, PersistenceError

log = logging.getLogger(__name__)


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


def same_database(a: str, b: str) -> bool:
    """True when two SQLAlchemy URLs name the same database (one SQLite file however it is spelled)."""
    first, second = make_url(a), make_url(b)
    if first.get_backend_name() == second.get_backend_name() == "sqlite" and first.database and second.database:
        return Path(first.database).expanduser().resolve() == Path(second.database).expanduser().resolve()
    return first == second


class RevisionStore:
    """The state revisions in one table of `database`; ownership is decided by `plane`
    (which may be `database` itself).

    The rows live in `state.persistence.config.table` (default PERSISTENCE_TABLE) of the datasource
    `state.persistence.config.datasource`, in WSO2's layout (id, siddhiAppName, revision, snapshot) plus
    what this store needs: a number per instance (1, 2, ...), when the revision was saved and by which
    node incarnation, and its size before compression. Snapshots are stored gzip-compressed; a save
    deletes all but the newest `revisionsToKeep` of its instance in the same transaction. A table of the
    first layout (no numbers) is upgraded in place when the store opens it.
    """

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
    def from_config(cls, config, plane: ControlPlane) -> RevisionStore:
        """The store a Config's `state.persistence` names, its ownership decided by `plane`."""
        source = config.persistence_datasource
        shared = same_database(source.url, plane.url)
        database = (
            plane
            if shared
            else Database(
                source.url,
                pool_size=source.max_pool_size,
                datasource_name=source.name,
                role="persistence database",
                setting="state.persistence.config.datasource",
            )
        )
        try:
            return cls(database, plane, table=config.persistence.config.table, keep=config.persistence.revisions_to_keep)
        except Exception:
            if not shared:
                database.close()
            raise

    def _prepare(self) -> None:
        with self.database.schema_transaction() as conn:
            prepare_revision_table(conn, self.table)

    def save(self, instance_id: str, data: bytes, *, owner: tuple[str, int | None] | None = None, keep_before: int | None = None) -> int:
        """Store a new revision (compressed) and keep the newest `keep`, and the newest saved before `keep_before` (ms)
        when given (what the other new instances of a rescaled group take their state from); returns its number.

        With `owner`, refused (NotOwnerError, nothing written) unless the control plane assigns the instance
        to that live node incarnation, so a fenced or superseded worker cannot overwrite the state its
        successor restores:

        - table in the control-plane database: the check and the write are one transaction, and the
          check locks the instance's assignment row, so a reassignment waits until the save has
          committed (the new owner then restores it) or the save sees the new owner and is refused;
        - table in another database: the row is written first and ownership is read from the control
          plane just before the commit. Remaining window: the leader reassigns the instance *and* the
          new owner restores between that read and the commit (one round trip). The new owner then
          starts from the revision before, and the late one is stored as the newest until the new
          owner's first save supersedes it; should the new owner die before that save, its successor
          resumes from the late revision. Either way a whole, consistent revision is restored; events
          after it are processed again, as after any failover.
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
                        siddhiAppName=instance_id,
                        revision=f"{now}_{instance_id}",
                        snapshot=blob,
                        savedAt=now,
                        revisionNumber=number,
                        rawSize=len(data),
                        savedBy=f"{owner[0]}/{owner[1]}" if owner else None,
                    )
                )
                stale = delete(self.table).where(t.siddhiAppName == instance_id, t.revisionNumber <= number - self.keep)
                if keep_before is not None:
                    kept = conn.execute(select(func.max(t.revisionNumber)).where(t.siddhiAppName == instance_id, t.savedAt < keep_before)).scalar()
                    stale = stale.where(t.revisionNumber != kept) if kept is not None else stale
                conn.execute(stale)
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

    def latest(self, instance_id: str, *, before_ms: int | None = None) -> Revision | None:
        """The newest revision of an instance with its data (of those saved before `before_ms`, when given), or None."""
        t = self.table.c
        query = select(self.table).where(t.siddhiAppName == instance_id)
        if before_ms is not None:
            query = query.where(t.savedAt < before_ms)
        with self.database.transaction() as conn:
            row = conn.execute(query.order_by(t.revisionNumber.desc()).limit(1)).one_or_none()
        if row is None:
            return None
        return Revision(
            row.siddhiAppName,
            int(row.revisionNumber),
            int(row.savedAt),
            int(row.rawSize),
            len(row.snapshot),
            row.savedBy,
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
