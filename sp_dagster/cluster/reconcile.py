"""One pass of the leader: declare silent nodes dead, place instances, record why apps wait.
The whole pass is one fenced transaction (`reconcile`); an instance leaves a live node by a graceful
move (cluster.store.moves), while a dead node's instances, or those of a node that cannot reach the
messaging layer while others can, are placed again at once.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import select, update

from sp_dagster.cluster.allocation import (
    RECEIVER_TLS,
    RECEIVER_USERS,
    WIRE_FORMATS,
    AllocationAlgorithm,
    AllocationRequest,
    InstanceInfo,
    NodeInfo,
    check_allocation,
)
from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.election import Leadership, fenced
from sp_dagster.cluster.membership import declare_dead_nodes, reaching_broker, read_nodes
from sp_dagster.cluster.schema import deployments, instances
from sp_dagster.cluster.store.assignments import assign, read_placements, unassign
from sp_dagster.cluster.store.deployments import HOLD, PARTIAL, PLACED, WAITING
from sp_dagster.cluster.store.moves import MOVE_TIMEOUT_MS, Move, ask_release, end_move, plan_move, read_moves, ready_for


@dataclass(frozen=True)
class ReconcileResult:
    """What one pass did, in which term, under which fence sequence number (None: wrote nothing)."""

    term: int
    seq: int | None
    dead: tuple[str, ...] = ()
    assigned: tuple[tuple[str, str, str | None], ...] = ()  # (instance, node, previous node)
    unassigned: tuple[tuple[str, str], ...] = ()  # (instance, reason)
    unplaced: dict[str, str] = field(default_factory=dict)  # instance -> reason
    moving: tuple[tuple[str, str, str], ...] = ()  # (instance, from node, to node): its owner was asked to let go now
    alive: tuple[str, ...] = ()  # the nodes instances may run on
    cut_off: tuple[str, ...] = ()  # alive, but they say they cannot reach the messaging layer (others can)
    status_changes: tuple[tuple[str, str, str | None], ...] = ()  # (app, status, waiting reason)
    awaiting_release: int = 0  # moves whose owner was asked to let go and has not yet: the next pass hands them on


def reconcile(
    plane: ControlPlane,
    leadership: Leadership,
    *,
    algorithm: AllocationAlgorithm,
    min_resource_count: int,
    node_max_age_ms: int,
    rebalance: bool = False,
) -> ReconcileResult:
    """Run one leader pass; raises LeadershipLost (writing nothing) if the lease is no longer ours.

    Everything happens in one fenced transaction, so what the pass reads and what it writes belong to one
    moment of one term; it writes only what changed.
    """
    return plane.run(lambda: _pass(plane, leadership, algorithm, min_resource_count, node_max_age_ms, rebalance))


def _pass(plane, leadership, algorithm, min_resource_count, node_max_age_ms, rebalance) -> ReconcileResult:
    with fenced(plane, leadership) as fence:
        conn = fence.conn
        dead: list[str] = []
        # A new leader first gives every node a full max-age to heartbeat: after a database
        # outage all heartbeats look old, and that is no reason to declare the nodes dead.
        if fence.now_ms - leadership.acquired_at >= node_max_age_ms:
            dead = declare_dead_nodes(fence, node_max_age_ms)
        alive = reaching_broker(living := {n.node_id: n for n in read_nodes(conn, alive_only=True)})
        rows = conn.execute(
            select(instances.c.instance_id, instances.c.app, instances.c.group_name, instances.c.parallel_index, instances.c.receiver, instances.c.extra)
        ).all()
        wanted = tuple(_instance_info(r) for r in rows)
        placements = read_placements(conn)
        current = {i: p.node_id for i, p in placements.items() if p.node_id in alive}
        # An instance held for a rescale with state stays where it is while its node lives: its
        # worker drains it (or keeps it stopped); a move would stop it without draining.
        pinned = {r.instance_id: current[r.instance_id] for r in rows if r.instance_id in current and HOLD in json.loads(r.extra or "{}")}
        moves = read_moves(conn)
        # A planned move counts as done for the algorithm, so that a pass without rebalance keeps it.
        heading = {i: m.to_node for i, m in moves.items() if i in current and m.to_node in alive and i not in pinned}
        request = AllocationRequest(
            nodes=tuple(NodeInfo(n.node_id, n.receiver, n.metrics) for n in alive.values()),
            instances=wanted,
            current={**current, **heading},
            min_resource_count=min_resource_count,
            rebalance=rebalance,
        )
        name = getattr(algorithm, "name", type(algorithm).__name__)
        allocation = check_allocation(request, algorithm.allocate(request), name)

        assigned, unassigned = [], []
        wanted_ids = {i.instance_id for i in wanted}
        for instance_id in sorted(set(placements) - wanted_ids):  # its deployment was removed meanwhile
            unassign(fence, instance_id, "its deployment was removed")
            unassigned.append((instance_id, "its deployment was removed"))
        for instance in wanted:
            node = pinned.get(instance.instance_id) or allocation.placement.get(instance.instance_id)
            old = placements.get(instance.instance_id)
            if node is None:
                if instance.instance_id in moves:
                    end_move(conn, instance.instance_id)
                if old is not None:
                    reason = allocation.unplaced[instance.instance_id]
                    unassign(fence, instance.instance_id, reason)
                    unassigned.append((instance.instance_id, reason))
                continue
            owner = alive.get(old.node_id) if old is not None else None
            if old is not None and owner is not None and owner.incarnation == old.node_incarnation and node != old.node_id:
                if not _moved(fence, instance.instance_id, moves.get(instance.instance_id), old, owner, node):
                    continue  # it stays with its owner until that one has let go
            elif instance.instance_id in moves:
                end_move(conn, instance.instance_id)  # its owner died, or it stays where it is after all
            incarnation = alive[node].incarnation
            # A node restarted under the same id is a new incarnation: it is given its work afresh.
            if old is None or old.node_id != node or old.node_incarnation != incarnation:
                assign(fence, instance.instance_id, node, incarnation, old.node_id if old else None)
                assigned.append((instance.instance_id, node, old.node_id if old else None))
        for instance_id in sorted(set(moves) - wanted_ids):
            end_move(conn, instance_id)
        asked, awaiting = _ask_next(fence, {i.instance_id: i for i in wanted}, living)
        changes = _update_statuses(conn, wanted, allocation.unplaced, fence.now_ms)
        return ReconcileResult(
            term=fence.term,
            seq=fence.seq if fence.wrote else None,
            dead=tuple(dead),
            assigned=tuple(assigned),
            unassigned=tuple(unassigned),
            unplaced=dict(allocation.unplaced),
            alive=tuple(sorted(alive)),
            cut_off=tuple(sorted(set(living) - set(alive))),
            status_changes=tuple(changes),
            moving=tuple(asked),
            awaiting_release=awaiting,
        )


def _instance_info(row) -> InstanceInfo:
    """An instance row as the allocation sees it (with what its receiver needs of a node)."""
    extra = json.loads(row.extra or "{}")
    return InstanceInfo(
        row.instance_id,
        row.app,
        row.group_name,
        int(row.parallel_index),
        bool(row.receiver),
        bool(extra.get(RECEIVER_USERS)),
        bool(extra.get(RECEIVER_TLS)),
        tuple(extra.get(WIRE_FORMATS) or ()),
    )


def _moved(fence, instance_id: str, move: Move | None, old, owner, node: str) -> bool:
    """An instance of a live owner that goes to `node`: True when it may go now (its owner let go of it, or
    took too long); otherwise its move is planned (or retargeted) and it stays."""
    if move is None or (move.to_node, move.from_node, move.from_incarnation) != (node, old.node_id, old.node_incarnation):
        plan_move(fence, instance_id, old.node_id, old.node_incarnation, node)
        return False
    if move.asked_at is None:
        return False
    running = owner.metrics.get("running") if isinstance(owner.metrics, dict) else None
    let_go = running is None or (instance_id not in running and owner.last_heartbeat >= move.asked_at)
    if not let_go and fence.now_ms - move.asked_at < MOVE_TIMEOUT_MS:
        return False
    end_move(fence.conn, instance_id)
    return True


def _ask_next(fence, wanted: dict, nodes: dict) -> tuple[list[tuple[str, str, str]], int]:
    """Ask the owner of the oldest planned move of each execution group to let go, when none of the group is asked yet
    and its new node is ready for it; the moves asked now, and how many owners are asked to let go (now or before)."""
    asked = []
    pending = sorted(read_moves(fence.conn).values(), key=lambda m: (m.planned_at, m.instance_id))
    group_of = lambda m: wanted[m.instance_id].group_key  # noqa: E731 - every move left is of a wanted instance
    busy = {group_of(m) for m in pending if m.asked_at is not None}
    for move in pending:
        group = group_of(move)
        if move.asked_at is None and group not in busy:
            busy.add(group)
            target = nodes.get(move.to_node)
            if not ready_for(move, target.metrics if target else None, fence.now_ms):
                continue
            ask_release(fence, move)
            asked.append((move.instance_id, move.from_node, move.to_node))
    return asked, sum(1 for m in pending if m.asked_at is not None) + len(asked)


def _update_statuses(conn, wanted: tuple[InstanceInfo, ...], unplaced: dict[str, str], now_ms: int) -> list[tuple[str, str, str | None]]:
    per_app: dict[str, list[InstanceInfo]] = defaultdict(list)
    for instance in wanted:
        per_app[instance.app].append(instance)
    changes = []
    recorded = {r.app: (r.status, r.waiting_reason) for r in conn.execute(select(deployments.c.app, deployments.c.status, deployments.c.waiting_reason))}
    for app, previous in recorded.items():
        members = per_app.get(app, [])
        missing = [i for i in members if i.instance_id in unplaced]
        if not missing:
            status = (PLACED, None)
        else:
            first = missing[0]
            reason = f"{len(missing)} of {len(members)} instances not placed ({first.instance_id}: {unplaced[first.instance_id]})"
            status = (WAITING if len(missing) == len(members) else PARTIAL, reason)
        if status != previous:
            conn.execute(update(deployments).where(deployments.c.app == app).values(status=status[0], waiting_reason=status[1], updated_at=now_ms))
            changes.append((app, *status))
    return changes
