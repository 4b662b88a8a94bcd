"""The control plane's event log: who did what, in which term, in the database's time order."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, func, select

from sp_dagster.cluster.db import db_now_ms
from sp_dagster.cluster.schema import events

KEEP_EVENTS = 20_000
CHANGE = "change"  # a deploy or undeploy made through the manager API: actor = the API user


@dataclass(frozen=True)
class Event:
    """One row of the event log."""

    id: int
    at: int
    kind: str
    term: int | None
    seq: int | None
    actor: str | None
    subject: str | None
    detail: dict[str, Any]


def record_event(
    conn: Connection,
    kind: str,
    *,
    term: int | None = None,
    seq: int | None = None,
    actor: str | None = None,
    subject: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    """Append an event inside the caller's transaction (so it commits or vanishes with the change)."""
    conn.execute(
        events.insert().values(
            at=db_now_ms(),
            kind=kind,
            term=term,
            seq=seq,
            actor=actor,
            subject=subject,
            detail=json.dumps(detail, sort_keys=True) if detail else None,
        )
    )


def recent_events(plane, *, limit: int | None = 100, kinds: tuple[str, ...] | None = None) -> list[Event]:
    """The newest `limit` events (all when None), oldest first, optionally of some kinds only."""
    query = select(events).order_by(events.c.id.desc())
    if kinds:
        query = query.where(events.c.kind.in_(kinds))
    if limit is not None:
        query = query.limit(limit)
    with plane.transaction() as conn:
        rows = conn.execute(query).all()
    return [Event(r.id, r.at, r.kind, r.term, r.seq, r.actor, r.subject, json.loads(r.detail) if r.detail else {}) for r in reversed(rows)]


def prune_events(conn: Connection, keep: int = KEEP_EVENTS) -> int:
    """Delete all but the newest `keep` events; returns how many were deleted."""
    newest = conn.execute(select(func.max(events.c.id))).scalar()
    if newest is None or newest <= keep:
        return 0
    return conn.execute(delete(events).where(events.c.id <= newest - keep)).rowcount


def record_change(plane, user: str, action: str, app: str | None, **detail: Any) -> None:
    """Record who changed which app, how, through the manager API (shown by `status`)."""
    with plane.transaction() as conn:
        record_event(conn, CHANGE, actor=user, subject=app, detail={"action": action, **detail})


def recent_changes(plane, limit: int = 10) -> list[Event]:
    """The newest `limit` changes made through the manager API, oldest first."""
    return recent_events(plane, limit=limit, kinds=(CHANGE,))
