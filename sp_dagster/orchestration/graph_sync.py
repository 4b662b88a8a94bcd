"""The asset-graph sync sensor: the code location reloads when the recorded deployments change.
It catches the changes no one asks the webserver to reload for (a deploy through the manager API,
another Dagster instance, the leader moving instances) by comparing the graph's snapshot with the
control plane now.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import dagster as dg

from sp_dagster.orchestration.processes import LOCATION_NAME, reload_code_location
from sp_dagster.wording import counted


def graph_fingerprint(snapshot: dict[str, Any]) -> str:
    """What the asset graph shows of a snapshot: each deployment's app, version, generation and placement, and whether it could be read."""
    shown = sorted((d["app"], d["content_hash"], d["generation"], sorted(d.get("placement", {}).items())) for d in snapshot["deployments"])
    body = json.dumps([shown, snapshot.get("error") is None], sort_keys=True).encode()
    return hashlib.sha256(body).hexdigest()[:16]


def build_graph_sync_sensor(built: str, fetch, settings, *, interval_seconds: int = 30) -> dg.SensorDefinition:
    """The sensor of a graph built from a snapshot with fingerprint `built`; `fetch()` reads the control plane's
    snapshot now (`assets.fetch_deployments`); `settings`: the conf's `dagster` section (where the webserver is)."""

    @dg.sensor(
        name="asset_graph_sync",
        minimum_interval_seconds=interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Reloads this code location when the recorded deployments differ from those its asset graph shows (changes made outside this UI).",
    )
    def asset_graph_sync(context: dg.SensorEvaluationContext):
        """Compare the control plane with the graph's snapshot; ask the webserver to reload when they differ."""
        now = fetch()
        if now.get("error") is not None:
            return dg.SkipReason(f"the control plane cannot be read ({now['error']}): the graph stays as it is")
        if graph_fingerprint(now) == built:
            return dg.SkipReason(f"the asset graph shows the control plane's {counted(len(now['deployments']), 'deployment')}")
        origin = context.code_location_origin
        location = origin.location_name if origin is not None else LOCATION_NAME
        apps = ", ".join(sorted(d["app"] for d in now["deployments"])) or "none"
        said = reload_code_location(settings.host, settings.port, location)
        context.log.info(f"the recorded deployments changed (now: {apps}): {said}")
        return dg.SkipReason(f"the recorded deployments changed (now: {apps}): {said}")

    return asset_graph_sync
