"""`sp-dagster advise`: each execution group's advised parallelism, from the load history the leader keeps."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from sp_dagster.cluster.advice import advise
from sp_dagster.cluster.autoscaling import latest_decisions
from sp_dagster.cluster.db import ControlPlane, db_now_ms
from sp_dagster.cluster.limits import max_parallel
from sp_dagster.cluster.status import require_cluster, table
from sp_dagster.cluster.store.deployments import list_deployments
from sp_dagster.cluster.store.events import Event
from sp_dagster.cluster.store.load import read_load
from sp_dagster.config.model import AutoscalingConfig
from sp_dagster.errors import ControlPlaneError


def group_advice(plane: ControlPlane, settings: AutoscalingConfig, app: str | None = None) -> dict[str, Any]:
    """Every deployed app's groups (or `app`'s) with their parallelism, maximum, advice, reason and latest load (the `--json` form); read-only."""
    require_cluster(plane)
    recorded = [d for d in list_deployments(plane) if app is None or d.app == app]
    if app is not None and not recorded:
        deployed = ", ".join(d.app for d in list_deployments(plane)) or "none"
        raise ControlPlaneError(f"no app '{app}' is deployed on {plane.safe_url} (deployed: {deployed})")
    with plane.transaction() as conn:
        now = int(conn.execute(select(db_now_ms())).scalar_one())
        history = read_load(conn, app)
    decided = latest_decisions(plane)
    apps = []
    for deployment in recorded:
        groups = []
        for group in deployment.plan.get("groups") or []:
            if group.get("receiver"):
                continue
            name = group["name"].removeprefix(f"{deployment.app}-")
            parallel, limit = int(group["parallelism"]), max_parallel(deployment.app, deployment.source, deployment.plan, name)
            samples = [load.sample for load in history.get((deployment.app, name), [])]
            advice = advise(samples, parallel, limit, settings, now)
            latest = samples[-1] if samples else None
            arrivals = [s.arrival_per_s for s in samples if s.arrival_per_s is not None]
            groups.append(
                {
                    "group": name,
                    "parallel": parallel,
                    "max_parallel": limit,
                    "advised": advice.advised,
                    "reason": advice.reason,
                    "arrival_per_s": arrivals[-1] if arrivals else None,
                    "processed_per_s": latest.processed_per_s if latest else None,
                    "busy": max(latest.busy, default=None) if latest else None,  # the busiest instance's
                    "lag": latest.lag if latest else None,
                    **_decision(decided.get((deployment.app, name))),
                }
            )
        apps.append({"app": deployment.app, "groups": groups})
    return {"apps": apps}


def _decision(event: Event | None) -> dict[str, Any]:
    """The group's last autoscaling decision (cluster.autoscaling), as `{"autoscaling": {...}}`, or nothing."""
    if event is None:
        return {}
    keep = ("parallel", "advised", "applied", "reason")
    return {"autoscaling": {"at_ms": event.at, **{k: event.detail.get(k) for k in keep}}}


def render_advice(advice: dict[str, Any]) -> str:
    """The human-readable form of group_advice()."""
    if not advice["apps"]:
        return "no deployments\n"
    shown = lambda value: "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)  # noqa: E731
    rows = [
        [
            a["app"],
            g["group"],
            g["parallel"],
            shown(g["max_parallel"]),
            g["advised"],
            *(shown(g[k]) for k in ("arrival_per_s", "processed_per_s", "busy", "lag")),
            g["reason"],
        ]
        for a in advice["apps"]
        for g in a["groups"]
    ]
    header = ["APP", "GROUP", "PARALLEL", "MAX", "ADVISED", "ARRIVAL/S", "PROCESSED/S", "BUSY", "LAG", "REASON"]
    return "\n".join(table(header, rows)) + "\n"
