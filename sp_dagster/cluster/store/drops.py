"""Dropped state: when `undeploy --drop-state` dropped each instance's state.
The drop is the operator's word, kept in the control plane whatever machine gave it: the next
deployment of an instance starts it empty at its committed offsets (`fresh_since`, as
`deploy --fresh` does), so no revision, checkpoint or replay of before brings the state back.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import delete, insert, select

from sp_dagster.cluster.schema import state_drops


def record_drops(plane, instance_ids: Iterable[str], at_ms: int) -> None:
    """Record that the state of these instances was dropped at `at_ms`."""
    ids = sorted(set(instance_ids))
    with plane.transaction() as conn:
        conn.execute(delete(state_drops).where(state_drops.c.instance_id.in_(ids)))
        if ids:
            conn.execute(insert(state_drops), [{"instance_id": i, "dropped_at": at_ms} for i in ids])


def drop_times(plane, instance_ids: Iterable[str]) -> dict[str, int]:
    """When the state of each of these instances was last dropped (those never dropped are absent)."""
    ids = sorted(set(instance_ids))
    if not ids:
        return {}
    with plane.transaction() as conn:
        rows = conn.execute(select(state_drops.c.instance_id, state_drops.c.dropped_at).where(state_drops.c.instance_id.in_(ids))).all()
    return {instance_id: int(at) for instance_id, at in rows}
