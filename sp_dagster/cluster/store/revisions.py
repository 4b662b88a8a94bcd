"""State revisions: each instance's snapshots as compressed blobs, newest `revisionsToKeep` kept.

A worker saves an instance's state every `intervalInMin` (`save_revision`, which prunes the
older ones in the same transaction); a worker taking the instance over restores
`latest_revision`. Revisions are numbered 1, 2, ... per instance. When the revisions live in
the control-plane database, pass `owner=(node_id, incarnation)`: a save from a worker that no
longer owns the instance (a fenced or superseded one) is then refused, so it cannot overwrite
the state its successor restores.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError

from sp_dagster.cluster.db import ControlPlane, db_now_ms
from sp_dagster.cluster.schema import state_revisions
from sp_dagster.cluster.store.deployments import owns_instance
from sp_dagster.errors import ControlPlaneError

r = state_revisions.c


@dataclass(frozen=True)
class Revision:
    """One saved revision of an instance's state (`data` is decompressed; None when only listed)."""

    instance_id: str
    revision: int
    created_at: int
    raw_size: int
    stored_size: int
    data: bytes | None = None


def save_revision(plane: ControlPlane, instance_id: str, data: bytes, *, keep: int, owner: tuple[str, int] | None = None) -> int:
    """Store a new revision (compressed), keep the newest `keep`; returns its number."""
    if keep < 1:
        raise ControlPlaneError(f"revisionsToKeep must be at least 1, not {keep}")
    blob = zlib.compress(bytes(data), 6)

    def work() -> int:
        with plane.transaction() as conn:
            if owner is not None and not owns_instance(conn, owner[0], owner[1], instance_id):
                raise ControlPlaneError(
                    f"instance {instance_id} is not assigned to node {owner[0]} incarnation {owner[1]}; its state was not saved"
                )
            newest = conn.execute(select(func.max(r.revision)).where(r.instance_id == instance_id)).scalar() or 0
            revision = newest + 1
            conn.execute(
                state_revisions.insert().values(
                    instance_id=instance_id, revision=revision, created_at=db_now_ms(), raw_size=len(data), data=blob
                )
            )
            conn.execute(delete(state_revisions).where(r.instance_id == instance_id, r.revision <= revision - keep))
            return revision

    for attempt in range(3):
        try:
            return plane.run(work)
        except IntegrityError:  # another save took the same number at the same moment
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def latest_revision(plane: ControlPlane, instance_id: str) -> Revision | None:
    """The newest revision of an instance with its data, or None when it has none."""
    with plane.transaction() as conn:
        row = conn.execute(
            select(state_revisions).where(r.instance_id == instance_id).order_by(r.revision.desc()).limit(1)
        ).one_or_none()
    if row is None:
        return None
    return Revision(row.instance_id, int(row.revision), int(row.created_at), int(row.raw_size), len(row.data), zlib.decompress(row.data))


def list_revisions(plane: ControlPlane, instance_id: str) -> list[Revision]:
    """An instance's revisions, oldest first, without their data."""
    with plane.transaction() as conn:
        rows = conn.execute(
            select(r.instance_id, r.revision, r.created_at, r.raw_size, func.length(r.data).label("stored"))
            .where(r.instance_id == instance_id)
            .order_by(r.revision)
        ).all()
    return [Revision(x.instance_id, int(x.revision), int(x.created_at), int(x.raw_size), int(x.stored)) for x in rows]


def prune_revisions(plane: ControlPlane, instance_id: str, keep: int) -> int:
    """Delete all but the newest `keep` revisions of an instance; returns how many were deleted."""
    with plane.transaction() as conn:
        newest = conn.execute(select(func.max(r.revision)).where(r.instance_id == instance_id)).scalar()
        if newest is None:
            return 0
        return conn.execute(delete(state_revisions).where(r.instance_id == instance_id, r.revision <= newest - keep)).rowcount


def delete_revisions(plane: ControlPlane, instance_ids: Iterable[str]) -> int:
    """Delete every revision of these instances (an app undeployed without keeping state)."""
    ids = list(instance_ids)
    if not ids:
        return 0
    with plane.transaction() as conn:
        return conn.execute(delete(state_revisions).where(r.instance_id.in_(ids))).rowcount
