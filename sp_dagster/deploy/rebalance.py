"""Asking the leader manager to rebalance: what Dagster's rebalance job and the manager API's route do."""

from __future__ import annotations

from typing import Any

from sp_dagster.cluster.db import ControlPlane


def request_rebalance(plane: ControlPlane, group_id: str) -> dict[str, Any] | None:
    """Ask the live leader of `group_id` to rebalance on its next pass: {leader, term, before: {instance: node}}, or None without a live leader."""
    from sp_dagster.cluster.election import current_leader
    from sp_dagster.cluster.election import request_rebalance as ask
    from sp_dagster.cluster.store.deployments import list_instances

    leader = current_leader(plane, group_id)
    if leader is None or not leader.alive:
        return None
    before = {i.instance_id: i.node_id for i in list_instances(plane)}
    ask(plane, group_id)
    return {"leader": leader.holder, "term": leader.term, "before": before}
