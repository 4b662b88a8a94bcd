"""sp-dagster's Dagster building blocks, to compose into your own `Definitions` the way dagster-dbt's are.
Resources, the asset decorator and translator, factories for the jobs, sensors and schedules,
`build_definitions` for all of them, and `SpDagsterComponent` for a defs.yaml; docs/dagster.md
shows how they fit together, with an example under your own resource keys.
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
