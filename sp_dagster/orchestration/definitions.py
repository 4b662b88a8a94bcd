"""The sp-dagster code location: `build_definitions()`, and `defs` for `dagster dev -m` / definitions.py.
Importing this module connects to nothing: the configuration is found as `sp-dagster config where`
says, and the control plane is read when Dagster loads the definitions (assets.DeploymentsLoader).
"""

from __future__ import annotations

import logging
import os
import warnings

import dagster as dg

from sp_dagster.errors import SpDagsterError
from sp_dagster.orchestration.aggregations import AGGREGATION_META, build_aggregation_checks, deployment_aggregations
from sp_dagster.orchestration.assets import APP_META, FINGERPRINT, GROUP_META, DeploymentsLoader, SpDagsterTranslator, fetch_deployments
from sp_dagster.orchestration.autoscaling import build_autoscaling_sensor
from sp_dagster.orchestration.graph_sync import build_graph_sync_sensor
from sp_dagster.orchestration.health import build_health_checks, topic_targets
from sp_dagster.orchestration.jobs import build_node_jobs, deploy_job, rebalance_job, rescale_job, undeploy_job
from sp_dagster.orchestration.resources import ControlPlaneResource, MessagingResource, load_conf, spark_resource
from sp_dagster.orchestration.schedules import build_health_schedule, build_rebalance_schedule
from sp_dagster.orchestration.sensors import build_app_repository_sensor

log = logging.getLogger(__name__)

# Resource field -> the variable it reads (an EnvVar, when set): SP_MGT_DB_URL replaces the control-plane
# datasource, SP_KAFKA_SASL_USERNAME and SP_KAFKA_SASL_PASSWORD authenticate to Kafka.
SECRETS = {"url": "SP_MGT_DB_URL", "sasl_username": "SP_KAFKA_SASL_USERNAME", "sasl_password": "SP_KAFKA_SASL_PASSWORD"}


def _env(name: str, resolved: bool):
    """EnvVar(name) (resolved by Dagster at run time) or its value, when the variable is set; else None."""
    if name not in os.environ:
        return None
    return os.environ[name] if resolved else dg.EnvVar(name)


def control_plane_resource(conf: str, *, resolved: bool = False) -> ControlPlaneResource:
    """The control-plane resource for a manager conf (the URL from SP_MGT_DB_URL when set)."""
    return ControlPlaneResource(conf=conf, url=_env(SECRETS["url"], resolved))


def dagster_settings(conf: str):
    """The conf's `dagster:` section; the defaults (and a warning) when the file cannot be read."""
    from sp_dagster.config.model import DagsterConfig

    try:
        return load_conf(conf).dagster
    except (SpDagsterError, OSError) as exc:
        log.warning("%s; the Dagster settings take their defaults", exc)
        return DagsterConfig()


def _autoscaling_enabled(conf: str) -> bool:
    """`deployment.config.autoscaling.enabled` of the conf (False when it cannot be read: dagster_settings warns)."""
    try:
        return load_conf(conf).deployment.autoscaling.enabled
    except (SpDagsterError, OSError):
        return False


def build_definitions(
    manager_conf: str | None = None, worker_conf: str | None = None, translator: SpDagsterTranslator | None = None, app_repository: str | None = None
) -> dg.Definitions:
    """Every sp-dagster definition (resources, jobs, sensor, schedules, the recorded deployments' assets), assembled from the building blocks in sp_dagster.dagster."""
    from sp_dagster.config.locate import conf_path

    manager_conf, worker_conf = conf_path("manager", manager_conf), conf_path("worker", worker_conf)
    with warnings.catch_warnings():  # Dagster's notes on preview/beta APIs we use on purpose (reconstruction metadata)
        warnings.simplefilter("ignore", dg.PreviewWarning)
        warnings.simplefilter("ignore", dg.BetaWarning)
        return _build(manager_conf, worker_conf, translator, app_repository)


def _build(manager_conf: str, worker_conf: str, translator: SpDagsterTranslator | None, app_repository: str | None) -> dg.Definitions:
    settings = dagster_settings(manager_conf)  # a broken conf also shows on the control_plane asset
    translator = translator or SpDagsterTranslator()
    resources = {
        "control_plane": control_plane_resource(manager_conf),
        "messaging": MessagingResource(
            conf=manager_conf, sasl_username=_env(SECRETS["sasl_username"], False), sasl_password=_env(SECRETS["sasl_password"], False)
        ),
        "spark": spark_resource(worker_conf),
    }
    jobs = [deploy_job, undeploy_job, rebalance_job, rescale_job, *build_node_jobs(manager_conf, worker_conf)]
    autoscaling = dg.DefaultSensorStatus.RUNNING if _autoscaling_enabled(manager_conf) else dg.DefaultSensorStatus.STOPPED
    static = dg.Definitions(
        jobs=jobs,
        sensors=[
            build_app_repository_sensor(app_repository or settings.app_repository, [deploy_job, undeploy_job], interval_seconds=settings.sensor_interval),
            build_autoscaling_sensor(rescale_job, interval_seconds=settings.sensor_interval, default_status=autoscaling),
        ],
        schedules=[build_rebalance_schedule(rebalance_job, settings.rebalance_interval)],
        resources=resources,
    )

    def from_snapshot(snapshot: dict, specs: list[dg.AssetSpec]) -> dg.Definitions:
        """The assets and the sensor keeping them in step with the control plane, plus their health checks, job and schedule when there are partial apps."""
        sync = build_graph_sync_sensor(snapshot[FINGERPRINT], lambda: fetch_deployments(control_plane), settings, interval_seconds=settings.sensor_interval)
        targets = {s.key: (s.metadata[APP_META], s.metadata[GROUP_META]) for s in specs if GROUP_META in s.metadata}
        if not targets:
            return dg.Definitions(assets=specs, sensors=[sync])
        checks = [build_health_checks(targets, topic_targets(snapshot, specs))]
        aggregations = {(d["app"], a["name"]): a for d in snapshot["deployments"] for a in deployment_aggregations(d)}
        found = {s.key: aggregations.get((s.metadata.get(APP_META), s.metadata.get(AGGREGATION_META))) for s in specs}
        stored = {key: aggregation for key, aggregation in found.items() if aggregation and aggregation["store"]}
        if stored:
            checks.append(build_aggregation_checks(stored, worker_conf))
        health = dg.define_asset_job(
            "health", selection=dg.AssetSelection.checks(*checks), description="Observe every partial app and aggregation and run their health checks."
        )
        return dg.Definitions(
            assets=specs, asset_checks=checks, jobs=[health], sensors=[sync], schedules=[build_health_schedule(health, settings.health_interval)]
        )

    control_plane = control_plane_resource(manager_conf, resolved=True)  # read at load (the loader) and by the graph's sync sensor
    loader = DeploymentsLoader(control_plane, from_snapshot, translator)
    return dg.Definitions.merge(static, loader.build_defs())


@dg.definitions
def defs() -> dg.Definitions:
    """The code location, built when Dagster loads it (not at import)."""
    return build_definitions()
