"""sp-dagster's Dagster building blocks, to compose into your own `Definitions` the way dagster-dbt's are.

- resources: `ControlPlaneResource`, `MessagingResource` (typed fields the launchpad shows), `spark_resource`
- assets: `build_partial_app_specs(app)`, `@siddhi_app_assets(app=...)` over `multi_asset` with
  `deploy_siddhi_app(...)` inside, and `SpDagsterTranslator` (one hook: `get_asset_spec(props)`)
- automation: `build_deploy_jobs(...)`, `build_rescale_job(...)` and `build_node_jobs(...)` (resource keys of your
  choice), `build_app_repository_sensor(...)`, `build_autoscaling_sensor(...)`, `build_rebalance_schedule(...)`,
  `build_health_schedule(...)`
- everything at once: `build_definitions(...)`, or `SpDagsterComponent` in a defs.yaml

Example (your resource keys, only the assets and the sensor)::

    import dagster as dg
    from sp_dagster.dagster import (ControlPlaneResource, MessagingResource, build_app_repository_sensor,
                                    build_deploy_jobs, deploy_siddhi_app, siddhi_app_assets)

    @siddhi_app_assets(app="apps/stock-alerts.siddhi")
    def stock_alerts(context: dg.AssetExecutionContext, sp_db: ControlPlaneResource, sp_bus: MessagingResource):
        yield from deploy_siddhi_app(context, sp_db, sp_bus)

    deploy, undeploy, _ = build_deploy_jobs(control_plane_key="sp_db", messaging_key="sp_bus")
    defs = dg.Definitions(
        assets=[stock_alerts],
        sensors=[build_app_repository_sensor("apps", [deploy, undeploy])],
        resources={"sp_db": ControlPlaneResource(conf="conf"), "sp_bus": MessagingResource(conf="conf")},
    )
"""

from sp_dagster.orchestration.app_assets import build_partial_app_specs, deploy_siddhi_app, siddhi_app_assets
from sp_dagster.orchestration.assets import SiddhiAssetProps, SpDagsterTranslator
from sp_dagster.orchestration.autoscaling import build_autoscaling_sensor
from sp_dagster.orchestration.component import SpDagsterComponent
from sp_dagster.orchestration.definitions import build_definitions
from sp_dagster.orchestration.jobs import build_deploy_jobs, build_node_jobs, build_rescale_job
from sp_dagster.orchestration.resources import ControlPlaneResource, MessagingResource, spark_resource
from sp_dagster.orchestration.schedules import build_health_schedule, build_rebalance_schedule
from sp_dagster.orchestration.sensors import build_app_repository_sensor

__all__ = [
    "ControlPlaneResource",
    "MessagingResource",
    "SiddhiAssetProps",
    "SpDagsterComponent",
    "SpDagsterTranslator",
    "build_app_repository_sensor",
    "build_autoscaling_sensor",
    "build_definitions",
    "build_deploy_jobs",
    "build_health_schedule",
    "build_node_jobs",
    "build_partial_app_specs",
    "build_rebalance_schedule",
    "build_rescale_job",
    "deploy_siddhi_app",
    "siddhi_app_assets",
    "spark_resource",
]
