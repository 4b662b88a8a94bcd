"""Load a deployment.yaml into a `Config`, checking what single fields cannot check alone."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from sp_dagster.config.binding import Context, bind_dataclass, unknown_key_message
from sp_dagster.config.datasources import Datasource, parse_datasources, parse_wso2_datasources
from sp_dagster.config.model import (
    NATS_APP_CREATOR,
    Carbon,
    ClusterConfig,
    Config,
    DagsterConfig,
    DeploymentConfig,
    MetricsConfig,
    PersistenceConfig,
    SiddhiConfig,
    SparkConfig,
)
from sp_dagster.config.yamlsource import LocatedDict, Mark, default_home, load_yaml, parse_yaml

log = logging.getLogger(__name__)

ROLES = ("manager", "worker")

# WSO2 sections that have no meaning here: accepted so a WSO2 file loads, with a warning.
IGNORED_WSO2_SECTIONS = (
    "wso2.transport.http",
    "wso2.metrics",
    "wso2.metrics.jdbc",
    "wso2.artifact.deployment",
    "wso2.securevault",
    "wso2.status.dashboard",
    "data.bridge.config",
    "databridge.config",
    "auth.configs",
    "transports",
    "listenerConfigurations",
    "siddhi.stores.query.api",
)

_SECTIONS = {
    "wso2.carbon": Carbon,
    "cluster.config": ClusterConfig,
    "deployment.config": DeploymentConfig,
    "state.persistence": PersistenceConfig,
    "siddhi": SiddhiConfig,
    "spark": SparkConfig,
    "dagster": DagsterConfig,
    "metrics": MetricsConfig,
}
_DATASOURCE_SECTIONS = {"datasources": parse_datasources, "wso2.datasources": parse_wso2_datasources}


def default_datasources() -> dict[str, Datasource]:
    """The embedded defaults: SQLite files in the data directory."""
    home = Path(default_home())
    return {
        "SP_MGT_DB": Datasource("SP_MGT_DB", f"sqlite:///{home / 'sp_mgt.db'}", "control plane (embedded SQLite)"),
        "WSO2_PERSISTENCE_DB": Datasource("WSO2_PERSISTENCE_DB", f"sqlite:///{home / 'persistence.db'}", "state persistence (embedded SQLite)"),
    }


def guess_role(path: str | Path) -> str:
    """A file under a `manager/` or `worker/` directory belongs to that role; otherwise a worker's."""
    parts = [p.lower() for p in Path(path).parts]
    return "manager" if "manager" in parts[-3:] and "worker" not in parts[-2:] else "worker"


def load_config(path: str | Path | None = None, role: str | None = None, node_id: str | None = None) -> Config:
    """Read and check a deployment.yaml (None or a conf directory: by the search order); every problem is a ConfigError naming file, key and expectation.

    >>> from sp_dagster import load_config
    >>> config = load_config(role="worker")     # --conf, $SP_DAGSTER_CONF, ./conf/, $SP_DAGSTER_HOME/conf/, packaged
    >>> config.role, config.messaging.kind
    ('worker', 'kafka')
    """
    if path is None or Path(path).is_dir():
        from sp_dagster.config.locate import conf_path

        path = conf_path(role or "manager", path)
    return build_config(load_yaml(path), str(path), role or guess_role(path), node_id)


def parse_config(text: str, filename: str = "<string>", role: str = "worker", node_id: str | None = None) -> Config:
    """Like load_config, from YAML text."""
    return build_config(parse_yaml(text, filename), filename, role, node_id)


def build_config(document: LocatedDict, filename: str, role: str, node_id: str | None = None) -> Config:
    """Turn a parsed YAML document into a checked Config."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    root = Context(filename, "", None)
    sections: dict[str, Any] = {}
    datasources = default_datasources()
    for key, value in document.items():
        ctx = root.child(key, document.marks.get(key))
        key_ctx = root.child(key, document.key_marks.get(key))
        if key in _SECTIONS:
            sections[key] = bind_dataclass(_SECTIONS[key], value, ctx)
        elif key in _DATASOURCE_SECTIONS:
            datasources.update(_DATASOURCE_SECTIONS[key](value, ctx))
        elif key in IGNORED_WSO2_SECTIONS:
            log.warning("%s: section '%s' has no effect in sp-dagster; ignored", filename, key)
        else:
            known = [*_SECTIONS, *_DATASOURCE_SECTIONS]
            raise key_ctx.error(unknown_key_message(key, known).replace(f"unknown key '{key}'", "unknown section"))
    carbon = sections.get("wso2.carbon") or Carbon()
    if node_id:
        carbon = dataclasses.replace(carbon, id=node_id)
    config = Config(
        source=filename,
        role=role,
        carbon=carbon,
        cluster=sections.get("cluster.config") or ClusterConfig(),
        deployment=sections.get("deployment.config") or DeploymentConfig(type="distributed"),
        datasources=datasources,
        persistence=sections.get("state.persistence") or PersistenceConfig(),
        siddhi=sections.get("siddhi") or SiddhiConfig(),
        spark=sections.get("spark") or SparkConfig(),
        dagster=sections.get("dagster") or DagsterConfig(),
        metrics=sections.get("metrics") or MetricsConfig(),
    )
    _check(config, document, filename)
    if config.siddhi.extensions:
        log.warning("%s: siddhi.extensions has no effect in sp-dagster (its functions are built in); ignored", filename)
    return config


def _ctx(document: LocatedDict, filename: str, *path: str) -> Context:
    """The context of a key path, with the position of its deepest present key."""
    ctx, node = Context(filename, "", None), document
    for key in path:
        mark: Mark | None = node.marks.get(key) if isinstance(node, LocatedDict) else None
        ctx = ctx.child(key, mark)
        node = node.get(key) if isinstance(node, dict) else None
    return ctx


def _check(config: Config, document: LocatedDict, filename: str) -> None:
    names = ", ".join(sorted(config.datasources))

    def need_datasource(name: str, *path: str) -> None:
        if name not in config.datasources:
            raise _ctx(document, filename, *path).error(f"datasource '{name}' is not defined; define it under datasources: (defined: {names})")

    d = config.deployment
    need_datasource(d.datasource, "deployment.config", "datasource")
    strategy = config.cluster.strategy_config
    own = config.datasources.get(strategy.datasource)
    if strategy.datasource != d.datasource and (own is None or own.url != config.datasources[d.datasource].url):
        # WSO2's own WSO2_CLUSTER_DB (seed 004): the election runs in the control plane, per groupId.
        log.warning(
            "%s: cluster.config.strategyConfig.datasource '%s' is not used: sp-dagster elects group '%s''s leader in "
            "deployment.config.datasource '%s' (coordination and deployments share one database)",
            filename,
            strategy.datasource,
            config.cluster.group_id,
            d.datasource,
        )
    if config.persistence.enabled and config.persistence.persistence_store == "database":
        need_datasource(config.persistence.config.datasource, "state.persistence", "config", "datasource")
        persistence, control = config.persistence_datasource.url, config.datasources[d.datasource].url
        if persistence.startswith("sqlite") and not control.startswith("sqlite"):
            raise _ctx(document, filename, "state.persistence", "config", "datasource").error(
                f"names SQLite on this host ({config.persistence.config.datasource}) while the control plane ({d.datasource}) is a "
                "shared database: a worker taking an instance over would find none of its revisions. Point it at a database "
                f"every worker reaches ({d.datasource} itself will do)"
            )
    spark = config.spark
    if config.role != "manager" and not spark.master.startswith("local") and not spark.authenticate_secret:
        if str(spark.conf.get("spark.authenticate", "")).lower() != "false":
            raise _ctx(document, filename, "spark", "master").error(
                f"is a cluster ({spark.master}) and spark.authenticateSecret is not set: anyone who reaches this worker's driver or "
                "its executors could run code there. Set spark.authenticateSecret: ${SPARK_AUTH_SECRET} (the master and its workers "
                'need the same secret), or spark.conf: {spark.authenticate: "false"} to run without on purpose'
            )
    if d.app_creator_class == NATS_APP_CREATOR and not d.nats_server_url:
        raise _ctx(document, filename, "deployment.config", "natsServerUrl").error(
            "is required: appCreatorClass selects NATS, so expected NATS server URLs (nats://host:4222)"
        )
    if config.messaging.kind == "nats" and not d.cluster_id:
        raise _ctx(document, filename, "deployment.config", "clusterId").error("is required with natsServerUrl: expected the NATS cluster id")
    if config.role == "manager" and d.is_receiver_node:
        raise _ctx(document, filename, "deployment.config", "isReceiverNode").error("is only for worker nodes: a manager cannot be a receiver node")
