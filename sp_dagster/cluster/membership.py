"""Membership of resource nodes (workers and receiver nodes): registration, heartbeats, death.
Each registration of a node id is a new *incarnation*, whose heartbeats alone are accepted; the leader
declares a node dead after heartbeatInterval x heartbeatMaxRetry of silence in the database's clock
(docs/concepts/control-plane.md, "Heartbeats and fencing").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, select, update

from sp_dagster.cluster.db import ControlPlane, db_now_ms, insert_ignore
from sp_dagster.cluster.election import Fence, LeaderInfo, read_lease
from sp_dagster.cluster.schema import nodes
from sp_dagster.cluster.store.events import record_event

WORKER, RECEIVER = "worker", "receiver"
ALIVE, DEAD, LEFT = "alive", "dead", "left"


@dataclass(frozen=True)
class NodeRecord:
    """A resource node as the control plane knows it."""

    node_id: str
    role: str
    address: str
    incarnation: int
    state: str
    registered_at: int
    last_heartbeat: int
    state_changed_at: int
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def receiver(self) -> bool:
        """True for a receiver node (runs only receiver/passthrough instances)."""
        return self.role == RECEIVER


@dataclass(frozen=True)
class HeartbeatReply:
    """What a heartbeat learned: whether it was accepted, and the leader as the database has it."""

    accepted: bool
    reason: str | None
    leader: LeaderInfo | None

    @property
    def leader_alive(self) -> bool:
        """True when some manager holds an unexpired lease."""
        return self.leader is not None and self.leader.alive


def _row_to_node(row) -> NodeRecord:
    return NodeRecord(
        node_id=row.node_id,
        role=row.role,
        address=row.address,
        incarnation=int(row.incarnation),
        state=row.state,
        registered_at=int(row.registered_at),
        last_heartbeat=int(row.last_heartbeat),
        state_changed_at=int(row.state_changed_at),
        metrics=json.loads(row.metrics) if row.metrics else {},
    )


def _metrics_json(metrics: dict[str, Any] | None) -> str | None:
    return json.dumps(metrics, sort_keys=True) if metrics else None


def register_node(plane: ControlPlane, node_id: str, *, receiver: bool = False, address: str = "", metrics: dict[str, Any] | None = None) -> int:
    """Register (or re-register) a node as alive; returns its new incarnation number.

    Incarnations count 1, 2, ...: a node restarted with the same id is told apart from the process it
    replaces, whose heartbeats are then refused. A node declared dead registers again here and is then
    given work afresh.
    """

    def work() -> int:
        with plane.transaction() as conn:
            now = db_now_ms()
            values = dict(
                role=RECEIVER if receiver else WORKER,
                address=address,
                state=ALIVE,
                registered_at=now,
                last_heartbeat=now,
                state_changed_at=now,
                metrics=_metrics_json(metrics),
            )
            previous = conn.execute(select(nodes.c.incarnation, nodes.c.state).where(nodes.c.node_id == node_id).with_for_update()).one_or_none()
            if previous is None and insert_ignore(conn, nodes, dict(node_id=node_id, incarnation=1, **values)):
                incarnation = 1
            else:
                conn.execute(update(nodes).where(nodes.c.node_id == node_id).values(incarnation=nodes.c.incarnation + 1, **values))
                incarnation = int(conn.execute(select(nodes.c.incarnation).where(nodes.c.node_id == node_id)).scalar_one())
            record_event(
                conn,
                "node-registered",
                actor=node_id,
                subject=node_id,
                detail={"incarnation": incarnation, "role": values["role"], "previous_state": previous.state if previous else None},
            )
            return incarnation

    return plane.run(work)


def heartbeat(plane: ControlPlane, node_id: str, incarnation: int, *, metrics: dict[str, Any] | None = None) -> HeartbeatReply:
    """Record a heartbeat of this incarnation; refused when it was superseded, declared dead or left."""

    def work() -> HeartbeatReply:
        with plane.transaction() as conn:
            values: dict[str, Any] = {"last_heartbeat": db_now_ms()}
            if metrics is not None:
                values["metrics"] = _metrics_json(metrics)
            accepted = conn.execute(
                update(nodes).where(nodes.c.node_id == node_id, nodes.c.incarnation == incarnation, nodes.c.state == ALIVE).values(**values)
            ).rowcount
            reason = None if accepted else _refusal(conn, node_id, incarnation)
            return HeartbeatReply(bool(accepted), reason, read_lease(conn))

    return plane.run(work)


def _refusal(conn: Connection, node_id: str, incarnation: int) -> str:
    row = conn.execute(select(nodes.c.incarnation, nodes.c.state).where(nodes.c.node_id == node_id)).one_or_none()
    if row is None:
        return f"node '{node_id}' is not registered"
    if row.incarnation != incarnation:
        return f"node '{node_id}' incarnation {incarnation} was superseded by incarnation {row.incarnation}"
    if row.state == DEAD:
        return f"node '{node_id}' was declared dead by the leader (missed heartbeats)"
    return f"node '{node_id}' is {row.state}"


def deregister_node(plane: ControlPlane, node_id: str, incarnation: int) -> bool:
    """Mark this incarnation as having left (a clean stop), so its work is re-placed at once."""

    def work() -> bool:
        with plane.transaction() as conn:
            left = conn.execute(
                update(nodes)
                .where(nodes.c.node_id == node_id, nodes.c.incarnation == incarnation, nodes.c.state == ALIVE)
                .values(state=LEFT, state_changed_at=db_now_ms())
            ).rowcount
            if left:
                record_event(conn, "node-left", actor=node_id, subject=node_id, detail={"incarnation": incarnation})
            return bool(left)

    return plane.run(work)


def list_nodes(plane: ControlPlane) -> list[NodeRecord]:
    """Every node the control plane has seen, alive or not, by id."""
    with plane.transaction() as conn:
        return read_nodes(conn)


def read_nodes(conn: Connection, *, alive_only: bool = False) -> list[NodeRecord]:
    """Nodes inside a transaction, by id (only alive ones when asked)."""
    query = select(nodes).order_by(nodes.c.node_id)
    if alive_only:
        query = query.where(nodes.c.state == ALIVE)
    return [_row_to_node(row) for row in conn.execute(query)]


def reaching_broker(alive: dict[str, NodeRecord]) -> dict[str, NodeRecord]:
    """The alive nodes instances may run on: those whose heartbeat does not say the messaging layer is
    unreachable (worker.broker_watch), unless none reaches it: then the broker is down, not their links."""
    reaching = {node_id: node for node_id, node in alive.items() if node.metrics.get("broker") != "unreachable"}
    return reaching or alive


def declare_dead_nodes(fence: Fence, max_age_ms: int) -> list[str]:
    """Leader only: mark alive nodes silent for longer than `max_age_ms` as dead; returns their ids."""
    conn, cutoff = fence.conn, fence.now_ms - max_age_ms
    silent = conn.execute(
        select(nodes.c.node_id, nodes.c.incarnation, nodes.c.last_heartbeat)
        .where(nodes.c.state == ALIVE, nodes.c.last_heartbeat < cutoff)
        .order_by(nodes.c.node_id)
    ).all()
    if not silent:
        return []
    seq = fence.bump()
    for row in silent:
        conn.execute(
            update(nodes)
            .where(nodes.c.node_id == row.node_id, nodes.c.incarnation == row.incarnation, nodes.c.state == ALIVE)
            .values(state=DEAD, state_changed_at=fence.now_ms)
        )
        record_event(
            conn,
            "node-dead",
            term=fence.term,
            seq=seq,
            actor=fence.leadership.node_id,
            subject=row.node_id,
            detail={"incarnation": int(row.incarnation), "silent_ms": int(fence.now_ms - row.last_heartbeat)},
        )
    return [row.node_id for row in silent]
