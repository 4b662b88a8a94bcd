"""Graceful moves: an instance leaves a live node only after that node stopped it with a last checkpoint.
The leader plans a move, asks the owner to let go once the new node is ready (one move per execution
group at a time) and then assigns the instance on; the steps and timeouts are under "Graceful moves"
in docs/concepts/control-plane.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, delete, insert, select, update

from sp_dagster.cluster.election import Fence
from sp_dagster.cluster.schema import moves
from sp_dagster.cluster.store.events import record_event

MOVE_TIMEOUT_MS = 60_000  # an owner that has not let go by then loses the instance without a last checkpoint
READY = "ready"  # a worker's heartbeat metric: the instances coming to it that it is ready to start
READY_WAIT_MS = 5_000  # a new node that has not said it is ready by then gets the instance anyway


def ready_for(move: Move, target_metrics: object, now_ms: int) -> bool:
    """Whether the owner may be asked to let go: the new node is ready for the instance (or does not say, or took too long)."""
    ready = target_metrics.get(READY) if isinstance(target_metrics, dict) else None
    return ready is None or move.instance_id in ready or now_ms - move.planned_at >= READY_WAIT_MS


@dataclass(frozen=True)
class Move:
    """A planned move: from which node incarnation to which node, and when its owner was asked to let go."""

    instance_id: str
    from_node: str
    from_incarnation: int
    to_node: str
    planned_at: int
    asked_at: int | None


def read_moves(conn: Connection) -> dict[str, Move]:
    """Every planned move, by instance id."""
    m = moves.c
    rows = conn.execute(select(m.instance_id, m.from_node, m.from_incarnation, m.to_node, m.planned_at, m.asked_at))
    return {r.instance_id: Move(r.instance_id, r.from_node, int(r.from_incarnation), r.to_node, int(r.planned_at), r.asked_at) for r in rows}


def plan_move(fence: Fence, instance_id: str, from_node: str, from_incarnation: int, to_node: str) -> None:
    """Leader only: record (or retarget) the move of an instance off its live owner, in the fence's term."""
    fence.conn.execute(delete(moves).where(moves.c.instance_id == instance_id))
    fence.conn.execute(
        insert(moves).values(
            instance_id=instance_id, from_node=from_node, from_incarnation=from_incarnation, to_node=to_node, planned_at=fence.now_ms, asked_at=None
        )
    )
    _record(fence, "move-planned", instance_id, from_node, to_node)


def ask_release(fence: Fence, move: Move) -> None:
    """Leader only: the owner's turn, it stops the instance with a last checkpoint.

    The owner's worker then sees the instance as `releasing`, stops it, saves its state (it still owns it,
    so the save is accepted) and says in its next heartbeat that it no longer runs it.
    """
    fence.conn.execute(update(moves).where(moves.c.instance_id == move.instance_id).values(asked_at=fence.now_ms))
    _record(fence, "release-asked", move.instance_id, move.from_node, move.to_node)


def _record(fence: Fence, kind: str, instance_id: str, from_node: str, to_node: str) -> None:
    detail = {"from": from_node, "to": to_node}
    record_event(fence.conn, kind, term=fence.term, seq=fence.bump(), actor=fence.leadership.node_id, subject=instance_id, detail=detail)


def end_move(conn: Connection, instance_id: str) -> None:
    """The move is done, or no longer wanted."""
    conn.execute(delete(moves).where(moves.c.instance_id == instance_id))
