"""Deployments (desired state) and their partial-app instances, as the deploy step records them.
A deployment is an app (name, content hash, SiddhiQL, plan) with a status the leader keeps up to date;
its instances are the planner's partial apps, `<app>-<group>-<i>`. The deploy step writes these, the
leader places them, and workers report how each runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, delete, select, update

from sp_dagster.cluster.db import ControlPlane, db_now_ms
from sp_dagster.cluster.membership import ALIVE
from sp_dagster.cluster.schema import assignments, deployments, nodes
from sp_dagster.cluster.schema import instances as instance_table
from sp_dagster.cluster.store.events import record_event
from sp_dagster.errors import ControlPlaneError

WAITING, PARTIAL, PLACED = "waiting", "partial", "placed"
# Instance statuses: set by the control plane (pending, assigned) or reported by its worker.
PENDING, ASSIGNED = "pending", "assigned"
REPORTED_STATUSES = ("starting", "running", "stopped", "failed")
# Instance extras of a rescale with state (sp_dagster.deploy.rescale): a held instance is not run
# (`drain`: read its inputs to their end before its last checkpoint); a rescaled one starts from
# its group's old instances' checkpoints, split by key.
HOLD, DRAIN, RESCALED = "hold", "drain", "rescaled"


def instance_id_for(app: str, group: str, index: int) -> str:
    """The id of parallel instance `index` (1-based) of a group: `<app>-<group>-<index>`."""
    return f"{app}-{group}-{index}"


def _json(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ControlPlaneError(f"{what} is not JSON-serialisable: {exc}") from None


@dataclass(frozen=True)
class InstanceSpec:
    """One partial-app instance as the planner produces it."""

    instance_id: str
    group: str
    parallel_index: int
    siddhi_app: str
    receiver: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def spec_hash(self) -> str:
        """Changes whenever anything a worker runs changes: a worker restarts the instance then."""
        body = _json([self.group, self.parallel_index, self.receiver, self.siddhi_app, self.extra], f"instance {self.instance_id}")
        return hashlib.sha256(body.encode()).hexdigest()


@dataclass(frozen=True)
class DeploymentRecord:
    """A recorded deployment: name, content hash, SiddhiQL source, the planner's plan (JSON), and a status the
    leader keeps up to date (`waiting`, `partial`, `placed`) with the reason it waits."""

    app: str
    content_hash: str
    source: str
    plan: dict[str, Any]
    status: str
    waiting_reason: str | None
    generation: int
    created_at: int
    updated_at: int


@dataclass(frozen=True)
class InstanceDefinition:
    """A recorded instance as the planner defined it: its SiddhiQL text and whatever JSON the planner attaches."""

    instance_id: str
    app: str
    group: str
    parallel_index: int
    receiver: bool
    siddhi_app: str
    extra: dict[str, Any]
    spec_hash: str


def definition_fields(row) -> dict[str, Any]:
    """The InstanceDefinition fields of a `sp_instances` row."""
    return dict(
        instance_id=row.instance_id,
        app=row.app,
        group=row.group_name,
        parallel_index=int(row.parallel_index),
        receiver=bool(row.receiver),
        siddhi_app=row.siddhi_app,
        extra=json.loads(row.extra),
        spec_hash=row.spec_hash,
    )


@dataclass(frozen=True)
class InstanceRecord(InstanceDefinition):
    """A recorded instance, with where it is placed and what its worker last reported."""

    status: str
    status_detail: str | None
    metrics: dict[str, Any]
    status_at: int | None
    node_id: str | None
    term: int | None


@dataclass(frozen=True)
class RecordResult:
    """What record_deployment changed."""

    app: str
    changed: bool
    generation: int
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()


def _check_specs(app: str, specs: list[InstanceSpec]) -> None:
    if not app:
        raise ControlPlaneError("a deployment needs an app name")
    seen: set[str] = set()
    for spec in specs:
        if not spec.instance_id or not spec.group:
            raise ControlPlaneError(f"app '{app}': every instance needs an id and a group, got {spec.instance_id!r}/{spec.group!r}")
        if spec.parallel_index < 1:
            raise ControlPlaneError(f"app '{app}': instance '{spec.instance_id}' has parallel index {spec.parallel_index}; indexes start at 1")
        if spec.instance_id in seen:
            raise ControlPlaneError(f"app '{app}': instance id '{spec.instance_id}' appears twice")
        seen.add(spec.instance_id)


def record_deployment(
    plane: ControlPlane,
    app: str,
    *,
    content_hash: str,
    source: str,
    plan: Mapping[str, Any],
    instances: Iterable[InstanceSpec],
) -> RecordResult:
    """Record (or replace) an app's desired state; unchanged instances keep their placement."""
    specs = list(instances)
    _check_specs(app, specs)
    plan_json = _json(dict(plan), f"the plan of app '{app}'")
    hashes = {spec.instance_id: spec.spec_hash for spec in specs}

    def work() -> RecordResult:
        with plane.transaction() as conn:
            taken = conn.execute(
                select(instance_table.c.instance_id, instance_table.c.app).where(instance_table.c.instance_id.in_(list(hashes)), instance_table.c.app != app)
            ).first()
            if taken is not None:
                raise ControlPlaneError(f"instance id '{taken.instance_id}' already belongs to app '{taken.app}'")
            existing = conn.execute(select(deployments).where(deployments.c.app == app).with_for_update()).one_or_none()
            old = dict(conn.execute(select(instance_table.c.instance_id, instance_table.c.spec_hash).where(instance_table.c.app == app)).all())
            if existing is not None and existing.content_hash == content_hash and old == hashes:
                return RecordResult(app, False, existing.generation, unchanged=tuple(sorted(old)))
            generation = 1 if existing is None else existing.generation + 1
            values = dict(
                content_hash=content_hash,
                source=source,
                plan=plan_json,
                status=WAITING,
                waiting_reason="recorded; waiting for the leader manager to place it",
                generation=generation,
                updated_at=db_now_ms(),
            )
            if existing is None:
                conn.execute(deployments.insert().values(app=app, created_at=db_now_ms(), **values))
            else:
                conn.execute(update(deployments).where(deployments.c.app == app).values(**values))
            removed = sorted(set(old) - set(hashes))
            _delete_instances(conn, removed)
            added, updated = [], []
            for spec in specs:
                if spec.instance_id not in old:
                    added.append(spec.instance_id)
                    conn.execute(instance_table.insert().values(app=app, **_instance_values(spec), status=PENDING))
                elif old[spec.instance_id] != hashes[spec.instance_id]:
                    updated.append(spec.instance_id)
                    conn.execute(
                        update(instance_table)
                        .where(instance_table.c.instance_id == spec.instance_id)
                        .values(**_instance_values(spec), status_detail="changed: the worker restarts it")
                    )
            unchanged = sorted(set(old) & set(hashes) - set(updated))
            record_event(
                conn,
                "deployment-recorded",
                subject=app,
                detail={"generation": generation, "added": added, "removed": removed, "updated": updated},
            )
            return RecordResult(app, True, generation, tuple(added), tuple(removed), tuple(updated), tuple(unchanged))

    return plane.run(work)


def _instance_values(spec: InstanceSpec) -> dict[str, Any]:
    return dict(
        instance_id=spec.instance_id,
        group_name=spec.group,
        parallel_index=spec.parallel_index,
        receiver=spec.receiver,
        siddhi_app=spec.siddhi_app,
        extra=_json(dict(spec.extra), f"instance {spec.instance_id}"),
        spec_hash=spec.spec_hash,
    )


def _delete_instances(conn: Connection, instance_ids: list[str]) -> None:
    if instance_ids:
        conn.execute(delete(assignments).where(assignments.c.instance_id.in_(instance_ids)))
        conn.execute(delete(instance_table).where(instance_table.c.instance_id.in_(instance_ids)))


def remove_deployment(plane: ControlPlane, app: str) -> bool:
    """Remove an app, its instances and their assignments (workers stop them); False if unknown."""

    def work() -> bool:
        with plane.transaction() as conn:
            ids = list(conn.execute(select(instance_table.c.instance_id).where(instance_table.c.app == app)).scalars())
            _delete_instances(conn, ids)
            gone = conn.execute(delete(deployments).where(deployments.c.app == app)).rowcount
            if gone:
                record_event(conn, "deployment-removed", subject=app, detail={"instances": ids})
            return bool(gone)

    return plane.run(work)


def _row_to_deployment(row) -> DeploymentRecord:
    return DeploymentRecord(
        row.app,
        row.content_hash,
        row.source,
        json.loads(row.plan),
        row.status,
        row.waiting_reason,
        int(row.generation),
        int(row.created_at),
        int(row.updated_at),
    )


def get_deployment(plane: ControlPlane, app: str) -> DeploymentRecord | None:
    """One recorded deployment, or None."""
    with plane.transaction() as conn:
        row = conn.execute(select(deployments).where(deployments.c.app == app)).one_or_none()
    return _row_to_deployment(row) if row else None


def list_deployments(plane: ControlPlane) -> list[DeploymentRecord]:
    """Every recorded deployment, by app name."""
    with plane.transaction() as conn:
        return [_row_to_deployment(r) for r in conn.execute(select(deployments).order_by(deployments.c.app))]


def list_instances(plane: ControlPlane, app: str | None = None) -> list[InstanceRecord]:
    """Recorded instances (of one app, or all) with their placement and last report."""
    query = (
        select(instance_table, assignments.c.node_id, assignments.c.term)
        .select_from(instance_table.outerjoin(assignments, assignments.c.instance_id == instance_table.c.instance_id))
        .order_by(instance_table.c.app, instance_table.c.group_name, instance_table.c.parallel_index)
    )
    if app is not None:
        query = query.where(instance_table.c.app == app)
    with plane.transaction() as conn:
        rows = conn.execute(query).all()
    return [
        InstanceRecord(
            **definition_fields(r),
            status=r.status,
            status_detail=r.status_detail,
            metrics=json.loads(r.metrics) if r.metrics else {},
            status_at=r.status_at,
            node_id=r.node_id,
            term=r.term,
        )
        for r in rows
    ]


def report_instance_status(
    plane: ControlPlane,
    node_id: str,
    incarnation: int,
    instance_id: str,
    status: str,
    *,
    detail: str | None = None,
    metrics: Mapping[str, Any] | None = None,
) -> bool:
    """A worker reports how an instance runs; ignored (False) unless it is assigned to this incarnation."""
    if status not in REPORTED_STATUSES:
        raise ControlPlaneError(f"instance status must be one of {', '.join(REPORTED_STATUSES)}, not {status!r}")

    def work() -> bool:
        with plane.transaction() as conn:
            if not owns_instance(conn, node_id, incarnation, instance_id):
                return False
            values: dict[str, Any] = dict(status=status, status_detail=detail, status_at=db_now_ms())
            if metrics is not None:
                values["metrics"] = _json(dict(metrics), f"metrics of {instance_id}")
            conn.execute(update(instance_table).where(instance_table.c.instance_id == instance_id).values(**values))
            return True

    return plane.run(work)


def owns_instance(conn: Connection, node_id: str, incarnation: int, instance_id: str, *, lock: bool = False) -> bool:
    """True when the instance is assigned to this incarnation and that incarnation is the node's live one.

    `lock` holds the assignment row until the transaction ends: every change of owner rewrites
    that row, so the answer stays true until then.
    """
    query = select(assignments.c.node_id, assignments.c.node_incarnation).where(assignments.c.instance_id == instance_id)
    placed = conn.execute(query.with_for_update() if lock else query).first()
    if placed is None or (placed.node_id, placed.node_incarnation) != (node_id, incarnation):
        return False
    return (
        conn.execute(select(nodes.c.node_id).where(nodes.c.node_id == node_id, nodes.c.incarnation == incarnation, nodes.c.state == ALIVE)).first() is not None
    )
