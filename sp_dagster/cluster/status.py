"""`sp-dagster status`: the cluster as the control plane has it (leader, nodes, deployments, placements)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import make_url

from sp_dagster.cluster.db import ControlPlane, db_now_ms
from sp_dagster.cluster.election import read_lease
from sp_dagster.cluster.membership import read_nodes
from sp_dagster.cluster.schema import SCHEMA_VERSION, check_version, managers
from sp_dagster.cluster.store.deployments import list_deployments, list_instances
from sp_dagster.cluster.store.events import recent_changes
from sp_dagster.cluster.store.moves import read_moves
from sp_dagster.errors import ControlPlaneError


def _no_cluster(plane: ControlPlane, why: str) -> ControlPlaneError:
    return ControlPlaneError(f"the control plane {plane.safe_url} {why}; start a manager first: sp-dagster manager --conf FILE")


def require_cluster(plane: ControlPlane) -> int:
    """The control plane's schema version; ControlPlaneError saying what to do when it holds no cluster of this version (read-only)."""
    url = make_url(plane.url)
    if url.get_backend_name() == "sqlite" and url.database and not Path(url.database).expanduser().exists():
        raise _no_cluster(plane, "does not exist yet")
    version = check_version(plane)
    if version == 0:
        raise _no_cluster(plane, "holds no cluster yet")
    if version < SCHEMA_VERSION:
        raise _no_cluster(plane, f"has schema version {version}, older than this sp-dagster's ({SCHEMA_VERSION})")
    return version


def cluster_status(plane: ControlPlane) -> dict[str, Any]:
    """The whole cluster as plain data (the `--json` form); read-only."""
    version = require_cluster(plane)
    with plane.transaction() as conn:
        now = int(conn.execute(select(db_now_ms())).scalar_one())
        lease = read_lease(conn)
        manager_rows = conn.execute(select(managers).order_by(managers.c.group_id, managers.c.node_id)).all()
        nodes = read_nodes(conn)
        moving = {i: m.to_node for i, m in read_moves(conn).items()}
    instances = list_instances(plane)
    per_node: dict[str, int] = {}
    for instance in instances:
        if instance.node_id:
            per_node[instance.node_id] = per_node.get(instance.node_id, 0) + 1
    return {
        "control_plane": plane.safe_url,
        "schema_version": version,
        "database_time_ms": now,
        "leader": None
        if lease is None
        else {
            "group": lease.group_id,
            "node": lease.holder,
            "term": lease.term,
            "alive": lease.alive,
            "expires_in_ms": lease.expires_in_ms,
        },
        "managers": [
            {
                "group": m.group_id,
                "node": m.node_id,
                "state": m.state,
                "address": m.address,
                "metrics_url": m.metrics_url,
                "last_heartbeat_ago_ms": now - m.last_heartbeat,
                "leader": bool(lease and lease.alive and lease.holder_incarnation == m.incarnation),
            }
            for m in manager_rows
        ],
        "nodes": [
            {
                "node": n.node_id,
                "role": n.role,
                "state": n.state,
                "incarnation": n.incarnation,
                "address": n.address,
                "last_heartbeat_ago_ms": now - n.last_heartbeat,
                "silent": _silent(n.state, now - n.last_heartbeat, n.metrics),
                "instances": per_node.get(n.node_id, 0),
                "metrics": n.metrics,
            }
            for n in nodes
        ],
        "deployments": [
            {
                "app": d.app,
                "status": d.status,
                "waiting_reason": d.waiting_reason,
                "content_hash": d.content_hash,
                "generation": d.generation,
                "instances": [
                    {
                        "instance": i.instance_id,
                        "group": i.group,
                        "index": i.parallel_index,
                        "receiver": i.receiver,
                        "node": i.node_id,
                        "moving_to": moving.get(i.instance_id),  # its owner stops it with a last checkpoint first
                        "term": i.term,
                        "status": i.status,
                        "detail": i.status_detail,
                        "metrics": i.metrics,
                    }
                    for i in instances
                    if i.app == d.app
                ],
            }
            for d in list_deployments(plane)
        ],
        "changes": [{"at_ms": e.at, "user": e.actor, "app": e.subject, **e.detail} for e in recent_changes(plane)],
    }


def deployed_apps(plane: ControlPlane, *, masked_plans: bool = True) -> list[dict[str, Any]]:
    """Every deployed app with its status and plan (SiddhiQL secrets masked unless told), as `sp-dagster apps --json` shows them; read-only."""
    from sp_dagster.topology.output import masked

    require_cluster(plane)
    return [
        {
            "app": d.app,
            "status": d.status,
            "waiting_reason": d.waiting_reason,
            "generation": d.generation,
            "content_hash": d.content_hash,
            "plan": masked(d.plan) if masked_plans else d.plan,
        }
        for d in list_deployments(plane)
    ]


def render_apps(apps: list[dict[str, Any]]) -> str:
    """The human-readable form of deployed_apps(): one line per app, one per execution group."""
    if not apps:
        return "no deployments\n"
    lines = []
    for app in apps:
        reason = f": {app['waiting_reason']}" if app["waiting_reason"] else ""
        lines.append(f"{app['app']}: {app['status']}{reason} (generation {app['generation']})")
        rows = [
            [g["name"], g["parallelism"], "yes" if g.get("receiver") else "", ", ".join(sorted(g.get("inputs", {})))] for g in app["plan"].get("groups", [])
        ]
        if rows:
            lines += ["  " + line for line in table(["GROUP", "PARALLELISM", "RECEIVER", "READS"], rows)]
    return "\n".join(lines) + "\n"


def _when(ms: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _silent(state: str, ago_ms: int, metrics: dict | None) -> bool:
    """True for a node recorded alive whose last heartbeat is older than its own fence window (stopped
    or cut off, and no manager has declared it dead yet, as when every manager is down too)."""
    window = (metrics or {}).get("fence_after_s")
    return state == "alive" and isinstance(window, (int, float)) and ago_ms > window * 1000


def _ago(ms: int) -> str:
    return f"{ms / 1000:.1f} s ago"


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """Rows of cells as left-aligned text columns under `header`."""
    cells = [header] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]


def _state(node: dict) -> str:
    """The node's state, and that it cannot reach the messaging layer when it says so."""
    if node.get("silent"):
        return "silent (no heartbeat within its fence window; no manager has declared it dead)"
    cut_off = node["state"] == "alive" and (node.get("metrics") or {}).get("broker") == "unreachable"
    return f"{node['state']} (broker unreachable)" if cut_off else node["state"]


def _load(node: dict) -> str:
    """Instances, out of the node's task slots when it has a limit."""
    slots = (node.get("metrics") or {}).get("slots")
    return f"{node['instances']}/{slots}" if slots else str(node["instances"])


def _flow(metrics: dict) -> list[str]:
    """Events/s, lag and processing latency of an instance, as reported ('' when not yet)."""
    p50, p99 = metrics.get("latency_ms_p50"), metrics.get("latency_ms_p99")
    latency = f"{p50:g}/{p99:g} ms" if isinstance(p50, (int, float)) and isinstance(p99, (int, float)) else ""
    rate = metrics.get("rows_per_s")
    return [f"{rate:g}" if isinstance(rate, (int, float)) else "", str(metrics.get("lag", "")), latency]


def receiver_urls(instance: dict) -> list[str]:
    """The URLs a receiver instance listens at, as its worker reports them ([] for other instances, or before it runs)."""
    urls = (instance.get("metrics") or {}).get("receiver_urls")
    return [u for u in urls if isinstance(u, str)] if isinstance(urls, list) else []


def _detail(instance: dict) -> str:
    urls = receiver_urls(instance)
    note = instance["detail"] or (instance.get("metrics") or {}).get("state_note") or ""
    return "; ".join(filter(None, [note, "receiving at " + ", ".join(urls) if urls else ""]))


def render_status(status: dict[str, Any]) -> str:
    """The human-readable form of cluster_status()."""
    lines = [f"control plane  {status['control_plane']} (schema {status['schema_version']})"]
    leader = status["leader"]
    if leader is None:
        lines.append("leader         none yet: no manager has held the lease")
    elif leader["alive"]:
        lines.append(
            f"leader         {leader['node']} (group {leader['group']}, term {leader['term']}, lease expires in {leader['expires_in_ms'] / 1000:.1f} s)"
        )
    else:
        lines.append(f"leader         none: the lease of {leader['node']} (term {leader['term']}) expired {_ago(-leader['expires_in_ms'])}")
    for m in status["managers"]:
        role = "leader" if m["leader"] else m["state"]
        metrics = f", metrics {m['metrics_url']}" if m["metrics_url"] else ""
        lines.append(f"manager        {m['node']} ({role}, {m['address']}, heartbeat {_ago(m['last_heartbeat_ago_ms'])}{metrics})")
    lines.append("")
    if status["nodes"]:
        lines += table(
            ["NODE", "ROLE", "STATE", "INCARNATION", "LAST HEARTBEAT", "INSTANCES", "ADDRESS", "METRICS"],
            [
                [
                    n["node"],
                    n["role"],
                    _state(n),
                    n["incarnation"],
                    _ago(n["last_heartbeat_ago_ms"]),
                    _load(n),
                    n["address"],
                    (n.get("metrics") or {}).get("metrics_url"),
                ]
                for n in status["nodes"]
            ],
        )
    else:
        lines.append("no resource nodes have registered")
    lines.append("")
    if not status["deployments"]:
        lines.append("no deployments")
    for d in status["deployments"]:
        placed = sum(1 for i in d["instances"] if i["node"])
        reason = f": {d['waiting_reason']}" if d["waiting_reason"] else ""
        lines.append(f"app {d['app']}: {d['status']}, {placed}/{len(d['instances'])} instances placed{reason}")
        lines += [
            "  " + line
            for line in table(
                ["INSTANCE", "NODE", "TERM", "STATUS", "EVENTS/S", "LAG", "LATENCY P50/P99", "DETAIL"],
                [[i["instance"], i["node"] or "-", i["term"] or "-", i["status"], *_flow(i.get("metrics") or {}), _detail(i)] for i in d["instances"]],
            )
        ]
    if status.get("changes"):
        lines += ["", "recent changes (through the manager API)"]
        lines += [
            "  " + line
            for line in table(["WHEN", "USER", "ACTION", "APP"], [[_when(c["at_ms"]), c["user"], c["action"], c["app"] or "-"] for c in status["changes"]])
        ]
    return "\n".join(lines).rstrip() + "\n"
