"""One pass of the leader: declare silent nodes dead, place instances, record why apps wait.

Everything happens in one fenced transaction, so what the pass reads and what it writes
belong to one moment of one term; it writes only what changed.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import select, update

from sp_dagster.cluster.allocation import (
    AllocationAlgorithm,
    AllocationRequest,
    InstanceInfo,
    NodeInfo,
    check_allocation,
)
from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.election import Leadership, fenced
from sp_dagster.cluster.membership import declare_dead_nodes, read_nodes
from sp_dagster.cluster.schema import deployments, instances
from sp_dagster.cluster.store.assignments import assign, read_placements, unassign
from sp_dagster.cluster.store.deployments import HOLD, PARTIAL, PLACED, WAITING


@dataclass(frozen=True)
class ReconcileResult:
    """What one pass did, in which term, under which fence sequence number (None: wrote nothing)."""

    term: int
    seq: int | None
    dead: tuple[str, ...] = ()
    assigned: tuple[tuple[str, str, str | None], ...] = ()  # (instance, node, previous node)
    unassigned: tuple[tuple[str, str], ...] = ()  # (instance, reason)
    unplaced: dict[str, str] = field(default_factory=dict)  # instance -> reason
    alive: tuple[str, ...] = ()
    status_changes: tuple[tuple[str, str, str | None], ...] = ()  # (app, status, waiting reason)


def reconcile(
    plane: ControlPlane,
    leadership: Leadership,
    *,
    algorithm: AllocationAlgorithm,
    min_resource_count: int,
    node_max_age_ms: int,
    rebalance: bool = False,
) -> ReconcileResult:
    """Run one leader pass; raises LeadershipLost (writing nothing) if the lease is no longer ours."""
    return plane.run(lambda: _pass(plane, leadership, algorithm, min_resource_count, node_max_age_ms, rebalance))


def _pass(plane, leadership, algorithm, min_resource_count, node_max_age_ms, rebalance) -> ReconcileResult:
    with fenced(plane, leadership) as fence:
        conn = fence.conn
        dead: list[str] = []
        # A new leader first gives every node a full max-age to heartbeat: after a database
        # outage all heartbeats look old, and that is no reason to declare the nodes dead.
        if fence.now_ms - leadership.acquired_at >= node_max_age_ms:
            dead = declare_dead_nodes(fence, node_max_age_ms)
        alive = {n.node_id: n for n in read_nodes(conn, alive_only=True)}
        rows = conn.execute(
            select(instances.c.instance_id, instances.c.app, instances.c.group_name, instances.c.parallel_index, instances.c.receiver, instances.c.extra)
        ).all()
        wanted = tuple(InstanceInfo(r.instance_id, r.app, r.group_name, int(r.parallel_index), bool(r.receiver)) for r in rows)
        placements = read_placements(conn)
        current = {i: p.node_id for i, p in placements.items() if p.node_id in alive}
        # An instance held for a rescale with state stays where it is while its node lives: its
        # worker drains it (or keeps it stopped); a move would stop it without draining.
        pinned = {r.instance_id: current[r.instance_id] for r in rows if r.instance_id in current and HOLD in json.loads(r.extra or "{}")}
        request = AllocationRequest(
            nodes=tuple(NodeInfo(n.node_id, n.receiver, n.metrics) for n in alive.values()),
            instances=wanted,
            current=current,
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
                if old is not None:
                    reason = allocation.unplaced[instance.instance_id]
                    unassign(fence, instance.instance_id, reason)
                    unassigned.append((instance.instance_id, reason))
                continue
            incarnation = alive[node].incarnation
            # A node restarted under the same id is a new incarnation: it is given its work afresh.
            if old is None or old.node_id != node or old.node_incarnation != incarnation:
                assign(fence, instance.instance_id, node, incarnation, old.node_id if old else None)
                assigned.append((instance.instance_id, node, old.node_id if old else None))
        changes = _update_statuses(conn, wanted, allocation.unplaced, fence.now_ms)
        return ReconcileResult(
            term=fence.term,
            seq=fence.seq if fence.wrote else None,
            dead=tuple(dead),
            assigned=tuple(assigned),
            unassigned=tuple(unassigned),
            unplaced=dict(allocation.unplaced),
            alive=tuple(sorted(alive)),
            status_changes=tuple(changes),
        )


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
