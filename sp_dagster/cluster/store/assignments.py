"""Assignments: which node (incarnation) runs which instance, and the leader term that said so.
Only the leader writes them, inside a fenced transaction (`assign`, `unassign`); the deploy step removes
them with their deployment, and a worker reads its own, of its incarnation and the current term, with
`assignments_for`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, and_, delete, select, update

from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.election import Fence, read_lease
from sp_dagster.cluster.schema import assignments, instances, leader_lease, moves
from sp_dagster.cluster.store.deployments import ASSIGNED, PENDING, InstanceDefinition, definition_fields
from sp_dagster.cluster.store.events import record_event


@dataclass(frozen=True)
class AssignedInstance(InstanceDefinition):
    """An instance a worker should run, with everything it needs to run it."""

    term: int
    assigned_at: int
    releasing: bool = False  # to move: stop it with a last checkpoint, do not start it (cluster.store.moves)


@dataclass(frozen=True)
class NodeAssignments:
    """A worker's assignments in the current leader term.

    An instance on its way to another node stays assigned to its owner, marked `releasing`, until the
    owner has stopped it with a last checkpoint (cluster.store.moves); the new node sees it in `incoming`
    from the move's planning on, so that it can have its start ready.
    """

    node_id: str
    incarnation: int | None
    term: int  # the current lease term (0 before any leader)
    leader: str | None
    leader_alive: bool
    instances: tuple[AssignedInstance, ...]
    # Instances planned to move to this node: a worker may prepare their start, and says when it is ready (READY).
    incoming: tuple[InstanceDefinition, ...] = ()


@dataclass(frozen=True)
class Placement:
    """An assignment row."""

    node_id: str
    node_incarnation: int
    term: int


def assignments_for(plane: ControlPlane, node_id: str, incarnation: int | None = None) -> NodeAssignments:
    """The instances assigned to `node_id` (this incarnation only, when given) by the current term."""
    a, i, m = assignments.c, instances.c, moves.c
    # One statement reads the rows, the current term and the moves: under READ COMMITTED each statement
    # has its own snapshot. A new leader adopting every row into its term between two statements would
    # show this node none of its instances (it would stop them all), and a move handed on between two
    # would show an instance still assigned here but no longer releasing (it would start it again).
    current_term = select(leader_lease.c.term).order_by(leader_lease.c.expires_at.desc()).limit(1).scalar_subquery()
    with plane.transaction() as conn:
        lease = read_lease(conn)
        query = (
            select(instances, a.term, a.assigned_at, m.asked_at.is_not(None).label("letting_go"))
            .select_from(
                instances.join(assignments, a.instance_id == i.instance_id).outerjoin(moves, and_(m.instance_id == i.instance_id, m.from_node == node_id))
            )
            .where(a.node_id == node_id, a.term == current_term)
            .order_by(i.app, i.group_name, i.parallel_index)
        )
        if incarnation is not None:
            query = query.where(a.node_incarnation == incarnation)
        rows = conn.execute(query).all()
        incoming = conn.execute(
            select(instances)
            .select_from(instances.join(moves, m.instance_id == i.instance_id))
            .where(m.to_node == node_id)
            .order_by(i.app, i.group_name, i.parallel_index)
        ).all()
    return NodeAssignments(
        node_id=node_id,
        incarnation=incarnation,
        term=int(rows[0].term) if rows else (lease.term if lease else 0),
        leader=lease.holder if lease else None,
        leader_alive=bool(lease and lease.alive),
        instances=tuple(AssignedInstance(**definition_fields(r), term=int(r.term), assigned_at=int(r.assigned_at), releasing=bool(r.letting_go)) for r in rows),
        incoming=tuple(InstanceDefinition(**definition_fields(r)) for r in incoming),
    )


def placed_elsewhere(plane: ControlPlane, node_id: str, instance_ids: list[str]) -> set[str]:
    """Those of `instance_ids` the leader has placed on another node than `node_id`."""
    if not instance_ids:
        return set()
    a = assignments.c
    with plane.transaction() as conn:
        return set(conn.execute(select(a.instance_id).where(a.instance_id.in_(instance_ids), a.node_id != node_id)).scalars())


def read_placements(conn: Connection) -> dict[str, Placement]:
    """Every assignment row, by instance id."""
    a = assignments.c
    return {
        r.instance_id: Placement(r.node_id, int(r.node_incarnation), int(r.term))
        for r in conn.execute(select(a.instance_id, a.node_id, a.node_incarnation, a.term))
    }


def assign(fence: Fence, instance_id: str, node_id: str, node_incarnation: int, previous: str | None) -> None:
    """Leader only: place an instance on a node incarnation (insert or move), in the fence's term."""
    conn, seq = fence.conn, fence.bump()
    values = dict(node_id=node_id, node_incarnation=node_incarnation, term=fence.term, seq=seq, assigned_at=fence.now_ms)
    moved = conn.execute(update(assignments).where(assignments.c.instance_id == instance_id).values(**values)).rowcount
    if not moved:
        conn.execute(assignments.insert().values(instance_id=instance_id, **values))
    conn.execute(
        update(instances).where(instances.c.instance_id == instance_id).values(status=ASSIGNED, status_detail=None, metrics=None, status_at=fence.now_ms)
    )
    record_event(
        conn,
        "assigned",
        term=fence.term,
        seq=seq,
        actor=fence.leadership.node_id,
        subject=instance_id,
        detail={"node": node_id, "incarnation": node_incarnation, "from": previous},
    )


def unassign(fence: Fence, instance_id: str, reason: str) -> None:
    """Leader only: take an instance off its node (it waits for a new one), in the fence's term."""
    conn, seq = fence.conn, fence.bump()
    conn.execute(delete(assignments).where(assignments.c.instance_id == instance_id))
    conn.execute(update(instances).where(instances.c.instance_id == instance_id).values(status=PENDING, status_detail=reason, status_at=fence.now_ms))
    record_event(conn, "unassigned", term=fence.term, seq=seq, actor=fence.leadership.node_id, subject=instance_id, detail={"reason": reason})
