"""The typed configuration of a manager or worker node, in the shape of WSO2 SP's deployment.yaml.

Each field names its YAML key; defaults are WSO2's own (see README "Configuration reference").
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from sp_dagster.config.binding import Context, describe, setting
from sp_dagster.config.datasources import Datasource

RDBMS_COORDINATION = "org.wso2.carbon.cluster.coordinator.rdbms.RDBMSCoordinationStrategy"
DB_STORE = "org.wso2.carbon.stream.processor.core.persistence.DBPersistenceStore"
FILE_STORE = "org.wso2.carbon.stream.processor.core.persistence.FileSystemPersistenceStore"
KAFKA_APP_CREATOR = "org.wso2.carbon.sp.jobmanager.core.appcreator.KafkaSiddhiAppCreator"
NATS_APP_CREATOR = "org.wso2.carbon.sp.jobmanager.core.appcreator.NatsSiddhiAppCreator"
EMBEDDED_BOOTSTRAP = "localhost:9092"

_STORES = {"database": "database", "db": "database", DB_STORE: "database", "file": "file", FILE_STORE: "file"}


def _persistence_store(value: Any, ctx: Context) -> str:
    if isinstance(value, str) and value in _STORES:
        return _STORES[value]
    raise ctx.error(f"expected 'database' ({DB_STORE}) or 'file' ({FILE_STORE}), got {describe(value)}")


def _url_list(value: Any, ctx: Context) -> tuple[str, ...]:
    """A comma-separated string or a YAML list of host:port addresses."""
    items = value if isinstance(value, list) else str(value).split(",") if isinstance(value, (str, int)) else None
    if items is None:
        raise ctx.error(f"expected host:port addresses separated by commas, got {describe(value)}")
    urls = tuple(str(item).strip() for item in items if str(item).strip())
    if not urls:
        raise ctx.error("expected at least one host:port address")
    return urls


@dataclass(frozen=True)
class Carbon:
    """`wso2.carbon`: the node's identity."""

    id: str = setting("id", factory=socket.gethostname, doc="this node's unique id")
    name: str = setting("name", "WSO2 Stream Processor")
    ports: dict[str, int] = setting("ports", factory=dict)


@dataclass(frozen=True)
class StrategyConfig:
    """`cluster.config.strategyConfig`: timing of the manager cluster's coordination."""

    datasource: str = setting("datasource", "SP_MGT_DB")
    heartbeat_interval: int = setting("heartbeatInterval", 1000, minimum=1, doc="milliseconds")
    heartbeat_max_retry: int = setting("heartbeatMaxRetry", 2, minimum=1)
    event_polling_interval: int = setting("eventPollingInterval", 1000, minimum=1, doc="milliseconds")


@dataclass(frozen=True)
class ClusterConfig:
    """`cluster.config`: the manager cluster (leader election through a relational database)."""

    enabled: bool = setting("enabled", False)
    group_id: str = setting("groupId", "sp")
    coordination_strategy_class: str = setting("coordinationStrategyClass", RDBMS_COORDINATION, choices=(RDBMS_COORDINATION,))
    strategy_config: StrategyConfig = setting("strategyConfig", factory=StrategyConfig)


@dataclass(frozen=True)
class HttpsInterface:
    """`httpsInterface`: the address by which a node is known to the others."""

    host: str = setting("host", "localhost")
    port: int = setting("port", 9090, minimum=1)
    username: str | None = setting("username", None)
    password: str | None = setting("password", None)


@dataclass(frozen=True)
class ZooKeeperConfig:
    """`zooKeeperConfig`: accepted for compatibility; topics are created with Kafka's admin API."""

    zoo_keeper_urls: str | None = setting("zooKeeperURLs", None)
    connection_timeout: int = setting("connectionTimeout", 10000)
    session_timeout: int = setting("sessionTimeout", 10000)


@dataclass(frozen=True)
class DeploymentConfig:
    """`deployment.config`: distributed-deployment settings of a manager, worker or receiver node."""

    type: str = setting("type", choices=("distributed",))
    https_interface: HttpsInterface = setting("httpsInterface", factory=HttpsInterface)
    heartbeat_interval: int = setting("heartbeatInterval", 10000, minimum=1, doc="milliseconds")
    heartbeat_max_retry: int = setting("heartbeatMaxRetry", 2, minimum=1)
    datasource: str = setting("datasource", "SP_MGT_DB")
    min_resource_count: int = setting("minResourceCount", 1, minimum=1)
    allocation_algorithm: str | None = setting("allocationAlgorithm", None)
    app_creator_class: str | None = setting("appCreatorClass", None, choices=(KAFKA_APP_CREATOR, NATS_APP_CREATOR))
    bootstrap_urls: tuple[str, ...] | None = setting("bootstrapURLs", None, parse=_url_list)
    kafka_properties: dict[str, str] = setting("kafkaProperties", factory=dict, doc="librdkafka client settings")
    zoo_keeper_urls: str | None = setting("zooKeeperURLs", None)
    zoo_keeper_config: ZooKeeperConfig | None = setting("zooKeeperConfig", None)
    nats_server_url: tuple[str, ...] | None = setting("natsServerUrl", None, parse=_url_list)
    cluster_id: str | None = setting("clusterId", None)
    leader_retry_interval: int = setting("leaderRetryInterval", 10000, minimum=1, doc="milliseconds")
    resource_managers: tuple[HttpsInterface, ...] = setting("resourceManagers", ())
    is_receiver_node: bool = setting("isReceiverNode", False)


@dataclass(frozen=True)
class PersistenceStoreConfig:
    """`state.persistence.config`: where revisions go (a datasource and table, or a directory)."""

    datasource: str = setting("datasource", "WSO2_PERSISTENCE_DB")
    table: str = setting("table", "PERSISTENCE_TABLE")
    location: str = setting("location", "${SP_DAGSTER_HOME}/persistence", doc="a directory for the file store")


@dataclass(frozen=True)
class PersistenceConfig:
    """`state.persistence`: periodic snapshots of every partial app's state."""

    enabled: bool = setting("enabled", False)
    interval_in_min: float = setting("intervalInMin", 1.0, minimum=1e-9, doc="minutes")
    revisions_to_keep: int = setting("revisionsToKeep", 2, minimum=1)
    persistence_store: str = setting("persistenceStore", "file", parse=_persistence_store)
    config: PersistenceStoreConfig = setting("config", factory=PersistenceStoreConfig)


@dataclass(frozen=True)
class SiddhiProperties:
    """`siddhi.properties`: distributed incremental aggregation settings."""

    partition_by_id: bool = setting("partitionById", False)
    shard_id: str | None = setting("shardId", None)


@dataclass(frozen=True)
class SiddhiConfig:
    """`siddhi`: Siddhi runtime properties."""

    properties: SiddhiProperties = setting("properties", factory=SiddhiProperties)


@dataclass(frozen=True)
class SparkConfig:
    """`spark`: the worker's Spark application (master URL and any spark.* settings)."""

    master: str = setting("master", "local[*]")
    app_name: str | None = setting("appName", None)
    conf: dict[str, str] = setting("conf", factory=dict, doc="spark.* settings")


@dataclass(frozen=True)
class MessagingSettings:
    """The messaging layer a node uses, derived from deployment.config."""

    kind: str  # "kafka" or "nats"
    servers: tuple[str, ...]
    cluster_id: str | None = None
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def bootstrap_servers(self) -> str:
        """The servers as one comma-separated string (librdkafka's bootstrap.servers)."""
        return ",".join(self.servers)


@dataclass(frozen=True)
class Config:
    """A whole deployment.yaml, typed; `role` is manager or worker."""

    source: str
    role: str
    carbon: Carbon
    cluster: ClusterConfig
    deployment: DeploymentConfig
    datasources: dict[str, Datasource]
    persistence: PersistenceConfig
    siddhi: SiddhiConfig
    spark: SparkConfig

    @property
    def node_id(self) -> str:
        """This node's id (`wso2.carbon.id`)."""
        return self.carbon.id

    @property
    def messaging(self) -> MessagingSettings:
        """Kafka (bootstrapURLs) or NATS (natsServerUrl + clusterId); the embedded broker when neither."""
        d = self.deployment
        if d.nats_server_url and (d.app_creator_class == NATS_APP_CREATOR or not d.bootstrap_urls):
            return MessagingSettings("nats", d.nats_server_url, d.cluster_id)
        return MessagingSettings("kafka", d.bootstrap_urls or (EMBEDDED_BOOTSTRAP,), None, dict(d.kafka_properties))

    @property
    def control_plane(self) -> Datasource:
        """The control-plane database (`deployment.config.datasource`), shared by managers and workers."""
        return self.datasources[self.deployment.datasource]

    @property
    def shard_id(self) -> str:
        """The shard id of distributed aggregations: `siddhi.properties.shardId`, else the node id."""
        return self.siddhi.properties.shard_id or self.carbon.id

    @property
    def persistence_datasource(self) -> Datasource:
        """The datasource of the database persistence store."""
        return self.datasources[self.persistence.config.datasource]
