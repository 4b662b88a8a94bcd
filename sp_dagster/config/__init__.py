"""Configuration: deployment.yaml files in WSO2 SP's shape, loaded into typed objects."""

from sp_dagster.config.datasources import Datasource, jdbc_to_sqlalchemy
from sp_dagster.config.loader import default_datasources, load_config, parse_config
from sp_dagster.config.model import (
    Carbon,
    ClusterConfig,
    Config,
    DeploymentConfig,
    HttpsInterface,
    MessagingSettings,
    PersistenceConfig,
    SiddhiConfig,
    SparkConfig,
    StrategyConfig,
)

__all__ = [
    "Carbon",
    "ClusterConfig",
    "Config",
    "Datasource",
    "DeploymentConfig",
    "HttpsInterface",
    "MessagingSettings",
    "PersistenceConfig",
    "SiddhiConfig",
    "SparkConfig",
    "StrategyConfig",
    "default_datasources",
    "jdbc_to_sqlalchemy",
    "load_config",
    "parse_config",
]
