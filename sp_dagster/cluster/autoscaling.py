"""Autoscaling decisions: whether a group's advice (cluster.advice) is applied now, kept in the event log.
A rescale is applied after `cooldownSeconds` and within `maxRescalesPerHour`; every decision is an
`autoscale` event, from which the cooldown is read back, so it outlives the sensor's memory (see
"Autoscaling" in docs/operations/scaling.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from sp_dagster.cluster.db import ControlPlane, db_now_ms
from sp_dagster.cluster.store.events import Event, recent_events, record_event
from sp_dagster.config.model import AutoscalingConfig
from sp_dagster.wording import counted

AUTOSCALE = "autoscale"  # an autoscaling decision: subject = the app, detail = group, parallel, advised, applied, reason
HOUR_MS = 3_600_000


@dataclass(frozen=True)
class Decision:
    """What the sensor does about one group whose advice differs from its parallelism."""

    app: str
    group: str
    parallel: int
    advised: int
    applied: bool
    reason: str

    def detail(self) -> dict[str, Any]:
        """The event log's form."""
        return {"group": self.group, "parallel": self.parallel, "advised": self.advised, "applied": self.applied, "reason": self.reason}


def decide(app: str, group: dict[str, Any], applied_at: list[int], settings: AutoscalingConfig, now_ms: int) -> Decision | None:
    """The decision for one group of `sp-dagster advise --json` (None when its advice is what runs); `applied_at`:
    when its earlier rescales were applied (ms, any order)."""
    parallel, advised = int(group["parallel"]), int(group["advised"])
    if advised == parallel:
        return None
    direction = "up" if advised > parallel else "down"
    last = max(applied_at, default=None)
    if last is not None and now_ms - last < settings.cooldown_seconds * 1000:
        left = settings.cooldown_seconds - (now_ms - last) / 1000
        return Decision(
            app, group["group"], parallel, advised, False, f"cooling down: the last rescale was {(now_ms - last) / 1000:.0f} s ago ({left:.0f} s left)"
        )
    recent = sum(1 for at in applied_at if now_ms - at < HOUR_MS)
    if recent >= settings.max_rescales_per_hour:
        return Decision(app, group["group"], parallel, advised, False, f"{counted(recent, 'rescale')} in the last hour, the most maxRescalesPerHour allows")
    return Decision(app, group["group"], parallel, advised, True, f"scale {direction} {parallel} -> {advised}: {group['reason']}")


def applied_rescales(events: list[Event]) -> dict[tuple[str, str], list[int]]:
    """(app, group) -> when its applied rescales were decided (ms), from `autoscale` events."""
    found: dict[tuple[str, str], list[int]] = {}
    for event in events:
        if event.kind == AUTOSCALE and event.detail.get("applied") and event.subject:
            found.setdefault((event.subject, event.detail.get("group", "")), []).append(event.at)
    return found


def plan_rescales(plane: ControlPlane, advice: dict[str, Any], settings: AutoscalingConfig) -> list[Decision]:
    """Decide for every group of `advice` (`group_advice()`) and record the decisions (one held back is recorded
    once while its advice stays the same); the applied ones are to be run."""
    events = _decisions(plane)
    history = applied_rescales(events)
    latest = _latest(events)
    decisions = []
    with plane.transaction() as conn:
        now = int(conn.execute(select(db_now_ms())).scalar_one())
        for app in advice["apps"]:
            for group in app["groups"]:
                decision = decide(app["app"], group, history.get((app["app"], group["group"]), []), settings, now)
                if decision is None:
                    continue
                before = latest[decision.app, decision.group].detail if (decision.app, decision.group) in latest else {}
                repeated = (
                    not decision.applied
                    and not before.get("applied", True)
                    and (before.get("parallel"), before.get("advised")) == (decision.parallel, decision.advised)
                )
                if not repeated:
                    record_event(conn, AUTOSCALE, actor="autoscaling", subject=decision.app, detail=decision.detail())
                decisions.append(decision)
    return decisions


def latest_decisions(plane: ControlPlane) -> dict[tuple[str, str], Event]:
    """(app, group) -> its newest autoscaling decision."""
    return _latest(_decisions(plane))


def _decisions(plane: ControlPlane) -> list[Event]:
    return recent_events(plane, limit=1000, kinds=(AUTOSCALE,))


def _latest(events: list[Event]) -> dict[tuple[str, str], Event]:
    return {(e.subject or "", e.detail.get("group", "")): e for e in events}
