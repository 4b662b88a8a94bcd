"""An app file as Dagster assets, dagster-dbt style: `build_partial_app_specs`, `@siddhi_app_assets` and `deploy_siddhi_app`.
The app is planned where the definitions load, connecting to nothing; materializing its
`multi_asset` deploys it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg

from sp_dagster.orchestration.assets import APP_META, SpDagsterTranslator, build_asset_specs, group_name
from sp_dagster.orchestration.resources import ControlPlaneResource, MessagingResource

SOURCE_META = "sp_dagster/source"


def planned_snapshot(app: str | Path) -> dict[str, Any]:
    """A snapshot holding one app file's plan, as build_asset_specs reads recorded ones (nothing is recorded)."""
    from sp_dagster.deploy import steps
    from sp_dagster.topology.output import to_dict

    loaded = steps.load_app(app)
    topology = steps.plan_app(loaded)
    deployment = {"app": topology.app, "content_hash": loaded.content_hash, "generation": 0, "status": "planned", "plan": to_dict(topology), "placement": {}}
    return {"deployments": [deployment]}


def build_partial_app_specs(app: str | Path, translator: SpDagsterTranslator | None = None) -> list[dg.AssetSpec]:
    """The partial apps, aggregations and topics of one app file as asset specs (SiddhiQLError when the app is wrong).

    >>> specs = build_partial_app_specs("apps/stock-alerts.siddhi")          # doctest: +SKIP
    >>> sorted(s.key.to_user_string() for s in specs)[:2]                    # doctest: +SKIP
    ['StockAlerts/alert', 'StockAlerts/average']
    """
    source = str(Path(app).resolve())
    return [spec.merge_attributes(metadata={SOURCE_META: source}) for spec in build_asset_specs(planned_snapshot(app), translator)]


def _is_entry_topic(spec: dg.AssetSpec) -> bool:
    return "topic" in spec.metadata and not spec.deps


def siddhi_app_assets(
    *, app: str | Path, translator: SpDagsterTranslator | None = None, name: str | None = None
) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
    """A `multi_asset` over an app file's partial apps, aggregations and published topics; the decorated function deploys it
    (the whole app: an app runs whole, so materializing a selection of its assets deploys it all and reports those).

    Name the resources in the function's parameters, under any keys::

        @siddhi_app_assets(app="apps/stock-alerts.siddhi")
        def stock_alerts(context: dg.AssetExecutionContext, sp_db: ControlPlaneResource, sp_bus: MessagingResource):
            yield from deploy_siddhi_app(context, sp_db, sp_bus)
    """
    specs = [s for s in build_partial_app_specs(app, translator) if not _is_entry_topic(s)]
    default_name = f"deploy_{group_name(str(specs[0].metadata.get(APP_META, 'app')))}" if specs else "deploy_app"
    return dg.multi_asset(specs=specs, name=name or default_name, can_subset=True)


def deploy_siddhi_app(
    context: dg.AssetExecutionContext, control_plane: ControlPlaneResource, messaging: MessagingResource, *, wait: bool = True, timeout: float | None = None
) -> Iterator[dg.MaterializeResult]:
    """Deploy the app behind a `@siddhi_app_assets` multi-asset (topics, record, wait until running); one result per asset."""
    from sp_dagster.deploy import steps
    from sp_dagster.orchestration.ops import check_state, user_errors

    sources = {str(spec.metadata[SOURCE_META]) for spec in context.assets_def.specs if spec.metadata.get(SOURCE_META) is not None}
    with user_errors():
        if len(sources) != 1:
            raise steps.DeployError(f"deploy_siddhi_app runs inside a @siddhi_app_assets function (one app file), not over {sorted(sources) or 'no app'}")
        loaded = steps.load_app(sources.pop())
        topology = steps.plan_app(loaded, control_plane.config().deployment.max_parallelism)
        if (client := control_plane.client()) is not None:  # the manager checks state, creates the topics and records
            answer = client.deploy(loaded.text, loaded.source, wait=None)
            generation, changed = client.app(topology.app)["generation"], answer["changed"]
            topics = [t.name for t in topology.topics] + [steps.dead_letter_topic(topology.app)]
        else:
            check_state(context, control_plane.plane, topology)  # before the topics grow: a refused rescale changes nothing
            topics = [t.name for t in steps.create_topics(topology, messaging.transport)]
            result = steps.record(control_plane.plane, loaded, topology)
            generation, changed = result.generation, result.changed
        if wait:
            state = steps.wait_until_running(control_plane, topology.app, timeout or control_plane.config().dagster.running_timeout)
        else:
            state = control_plane.deployment_state(topology.app)
    context.log.info(f"{topology.app} generation {generation}: {state.describe()}")
    metadata = {"generation": generation, "changed": changed, "status": state.status, "topics": topics}
    for key in _upstream_first(context.assets_def.specs, context.selected_asset_keys):
        yield dg.MaterializeResult(asset_key=key, metadata=metadata)


def _upstream_first(specs, selected) -> list[dg.AssetKey]:
    """The selected keys, each after the ones it depends on (Dagster wants a multi-asset's results in that order)."""
    from graphlib import TopologicalSorter

    deps = {spec.key: {d.asset_key for d in spec.deps} & set(selected) for spec in specs if spec.key in selected}
    return list(TopologicalSorter(deps).static_order())
