"""The typed configuration of a manager or worker node, in the shape of WSO2 SP's deployment.yaml.
Each field names its YAML key; defaults are WSO2's own (see docs/configuration.md).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sp_dagster.config.binding import Context, describe, setting
from sp_dagster.config.datasources import Datasource
from sp_dagster.config.yamlsource import default_home

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

    id: str = setting("id", factory=socket.gethostname, shown="host name", doc="this node's unique id (workers: also `--id`)")
    name: str = setting("name", "WSO2 Stream Processor", doc="a display name")
    ports: dict[str, int] = setting("ports", factory=dict, doc="accepted for compatibility; unused")


@dataclass(frozen=True)
class StrategyConfig:
    """`cluster.config.strategyConfig`: timing of the manager cluster's coordination."""

    datasource: str = setting(
        "datasource",
        "SP_MGT_DB",
        doc="the coordination database: sp-dagster's is `deployment.config.datasource` (another, such as WSO2's `WSO2_CLUSTER_DB`, is ignored with a warning)",
    )
    heartbeat_interval: int = setting("heartbeatInterval", 1000, minimum=1, unit="milliseconds", doc="ms between renewals of the leader lease")
    heartbeat_max_retry: int = setting("heartbeatMaxRetry", 2, minimum=1, doc="missed renewals before another manager takes over")
    event_polling_interval: int = setting("eventPollingInterval", 1000, minimum=1, unit="milliseconds", doc="ms between checks of membership and deployments")


@dataclass(frozen=True)
class ClusterConfig:
    """`cluster.config`: the manager cluster (leader election through a relational database)."""

    enabled: bool = setting("enabled", False, doc="run several managers with one elected leader")
    group_id: str = setting("groupId", "sp", doc="the same for every manager of one cluster")
    coordination_strategy_class: str = setting("coordinationStrategyClass", RDBMS_COORDINATION, choices=(RDBMS_COORDINATION,), shown="RDBMS")
    strategy_config: StrategyConfig = setting("strategyConfig", factory=StrategyConfig)


@dataclass(frozen=True)
class HttpsInterface:
    """`httpsInterface`: the address by which a node is known to the others."""

    host: str = setting("host", "localhost", doc="host name or LAN address")
    port: int = setting("port", 9090, minimum=1, doc="port (a manager's API listens here when `api.enabled`; otherwise informational)")
    username: str | None = setting("username", None, doc="accepted for compatibility")
    password: str | None = setting("password", None, doc="accepted for compatibility; use `${ENV}`")


@dataclass(frozen=True)
class ReceiverUser:
    """One user that HTTP receivers with `basic.auth.enabled='true'` accept."""

    username: str = setting("username", "", doc="the user name")
    password: str = setting("password", "", doc="the password; use `${ENV}` (never logged)")

    def __repr__(self) -> str:
        return f"ReceiverUser(username={self.username!r}, password='***')"


@dataclass(frozen=True)
class ReceiverTls:
    """`deployment.config.receiverTls`: the certificate HTTP receivers serve an `https://` receiver.url with."""

    cert_file: str | None = setting("certFile", None, doc="the TLS certificate (PEM) of every `https://` receiver on this node, with `keyFile`")
    key_file: str | None = setting("keyFile", None, doc="the certificate's private key (PEM)")

    @property
    def enabled(self) -> bool:
        """True when this node can serve https:// receivers (both files named)."""
        return bool(self.cert_file and self.key_file)


API_ROLES = ("viewer", "deployer", "admin")


@dataclass(frozen=True)
class ApiUser:
    """One user of the manager API and the role it acts in."""

    username: str = setting("username", "", doc="the user name")
    password: str = setting("password", "", doc="the password; use `${ENV}` (kept only hashed in memory, never logged)")
    role: str = setting("role", "viewer", choices=API_ROLES, doc="`viewer` reads, `deployer` also deploys and undeploys, `admin` also drops state")

    def __repr__(self) -> str:
        return f"ApiUser(username={self.username!r}, password='***', role={self.role!r})"


@dataclass(frozen=True)
class ApiConfig:
    """`deployment.config.api`: the manager API (deploy, undeploy, apps, status) on `httpsInterface`, and where the CLI finds it."""

    enabled: bool = setting("enabled", False, doc="managers serve the API on `httpsInterface` (the leader answers; the others redirect to it with 307)")
    users: tuple[ApiUser, ...] = setting("users", (), doc="who may use the API: `[{username, password, role}]`")
    cert_file: str | None = setting("certFile", None, doc="the TLS certificate (PEM) the API serves HTTPS with, with `keyFile`")
    key_file: str | None = setting("keyFile", None, doc="the certificate's private key (PEM)")
    allow_plain_http: bool = setting(
        "allowPlainHttp", False, doc="serve plain HTTP on an address that is not loopback (Basic credentials then cross the network in clear)"
    )
    url: str | None = setting(
        "url", None, doc="where `deploy`, `undeploy`, `status` and `apps` reach the API (`https://manager-1:9090`); `--manager` and $SP_DAGSTER_MANAGER win"
    )
    ca_file: str | None = setting("caFile", None, doc="the CLI trusts this certificate (PEM) for the API, as for a self-signed one")


@dataclass(frozen=True)
class ZooKeeperConfig:
    """`zooKeeperConfig`: accepted for compatibility; topics are created with Kafka's admin API."""

    zoo_keeper_urls: str | None = setting("zooKeeperURLs", None, doc="ignored")
    connection_timeout: int = setting("connectionTimeout", 10000, doc="ignored")
    session_timeout: int = setting("sessionTimeout", 10000, doc="ignored")


def _utilization(value: Any, ctx: Context) -> float:
    """A fraction of an instance's time: above 0, at most 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ctx.error(f"expected a fraction above 0 and at most 1 (0.7: busy 70% of the time), got {describe(value)}")
    return float(value)


@dataclass(frozen=True)
class AutoscalingConfig:
    """`deployment.config.autoscaling`: how the leader advises each execution group's parallelism (`sp-dagster advise`),
    and whether Dagster's `autoscaling` sensor applies that advice."""

    enabled: bool = setting("enabled", False, doc="Dagster's `autoscaling` sensor launches a `rescale` run when a group's advice has held (off: advice only)")
    target_utilization: float = setting(
        "targetUtilization",
        0.7,
        parse=_utilization,
        doc="the fraction of its time an instance should be busy: advice gives enough instances to stay below it (0.1 either side is the band where advice holds)",
    )
    catch_up_seconds: int = setting(
        "catchUpSeconds", 300, minimum=1, unit="seconds", doc="seconds within which advice drains a group's backlog (lag) on top of its arrival rate"
    )
    stabilization_seconds: int = setting(
        "stabilizationSeconds", 120, minimum=0, unit="seconds", doc="seconds every load sample must agree before advice differs from the running parallelism"
    )
    cooldown_seconds: int = setting(
        "cooldownSeconds", 300, minimum=0, unit="seconds", doc="seconds after a group's rescale before the sensor rescales it again"
    )
    max_rescales_per_hour: int = setting(
        "maxRescalesPerHour", 4, minimum=1, doc="the most rescales the sensor starts per group in any hour (more advice is recorded, not applied)"
    )


@dataclass(frozen=True)
class DeploymentConfig:
    """`deployment.config`: distributed-deployment settings of a manager, worker or receiver node."""

    type: str = setting("type", choices=("distributed",), doc="the fully distributed deployment")
    https_interface: HttpsInterface = setting(
        "httpsInterface", factory=HttpsInterface, aliases=("httpInterface",), doc="this node's address, shown in status (SP 4.1: `httpInterface`)"
    )
    heartbeat_interval: int = setting("heartbeatInterval", 10000, minimum=1, unit="milliseconds", doc="ms between worker heartbeats")
    heartbeat_max_retry: int = setting("heartbeatMaxRetry", 2, minimum=1, doc="missed heartbeats before a worker is declared dead")
    datasource: str = setting("datasource", "SP_MGT_DB", doc="the control-plane database, shared by managers and workers")
    min_resource_count: int = setting("minResourceCount", 1, minimum=1, doc="apps wait until this many workers are alive")
    max_parallelism: int | None = setting(
        "maxParallelism",
        None,
        minimum=1,
        shown="each group's own parallel",
        doc="the room a group running in parallel (parallel > 1) gets when its @dist names no maxParallel: its topics are laid out "
        "for this many instances, so `sp-dagster scale` up to it changes no topic (never below the group's parallel; a group at "
        "parallel 1 grows only with its own maxParallel, which holds it to the parallel rules)",
    )
    allocation_algorithm: str | None = setting("allocationAlgorithm", None, doc="how instances are placed on workers (default: balanced, spread per group)")
    app_creator_class: str | None = setting("appCreatorClass", None, choices=(KAFKA_APP_CREATOR, NATS_APP_CREATOR), doc="selects Kafka or NATS")
    bootstrap_urls: tuple[str, ...] | None = setting(
        "bootstrapURLs", None, parse=_url_list, shown="localhost:9092", doc="Kafka brokers, `host:port` separated by commas"
    )
    kafka_properties: dict[str, str] = setting("kafkaProperties", factory=dict, doc="extra librdkafka client settings (security.protocol, sasl.*, ...)")
    broker_profile: str = setting(
        "brokerProfile",
        "auto",
        choices=("auto", "kafka", "tansu"),
        doc="`tansu`: read again what a fetch stepped over and drop outputs an open transaction let through (the embedded broker's quirks); "
        "`kafka`: neither (Apache Kafka keeps its ordering); `auto`: `tansu` when the broker's cluster id begins with tansu",
    )
    zoo_keeper_urls: str | None = setting("zooKeeperURLs", None, doc="ignored: topics are created with Kafka's admin API")
    zoo_keeper_config: ZooKeeperConfig | None = setting("zooKeeperConfig", None, doc="ignored")
    nats_server_url: tuple[str, ...] | None = setting(
        "natsServerUrl", None, parse=_url_list, doc="NATS servers with JetStream (`nats://host:4222`), separated by commas (with `clusterId`)"
    )
    cluster_id: str | None = setting(
        "clusterId", None, doc="names this cluster's JetStream streams and subjects, so clusters sharing a NATS server never collide"
    )
    leader_retry_interval: int = setting(
        "leaderRetryInterval", 10000, minimum=1, unit="milliseconds", doc="ms without a live leader before a worker stops its apps"
    )
    resource_managers: tuple[HttpsInterface, ...] = setting("resourceManagers", (), doc="the managers; accepted for compatibility")
    is_receiver_node: bool = setting("isReceiverNode", False, doc="run only receiver (passthrough) partial apps")
    receiver_users: tuple[ReceiverUser, ...] = setting("receiverUsers", (), doc="users HTTP receivers with basic.auth.enabled accept: `[{username, password}]`")
    receiver_tls: ReceiverTls = setting(
        "receiverTls", factory=ReceiverTls, doc="`{certFile, keyFile}`: the TLS certificate of this node's `https://` receivers (docs/operations/security.md)"
    )
    autoscaling: AutoscalingConfig = setting(
        "autoscaling", factory=AutoscalingConfig, doc="parallelism advice (`sp-dagster advise`) and the autoscaling sensor"
    )
    api: ApiConfig = setting("api", factory=ApiConfig, doc="the manager API (docs/operations/security.md)")


@dataclass(frozen=True)
class PersistenceStoreConfig:
    """`state.persistence.config`: where revisions go (a datasource and table, or a directory)."""

    datasource: str = setting("datasource", "WSO2_PERSISTENCE_DB", doc="database store: the datasource")
    table: str = setting("table", "PERSISTENCE_TABLE", doc="database store: the table")
    location: str = setting(
        "location", factory=lambda: str(Path(default_home()) / "persistence"), shown="$SP_DAGSTER_HOME/persistence", doc="file store: the directory"
    )


@dataclass(frozen=True)
class PersistenceConfig:
    """`state.persistence`: periodic snapshots of every partial app's state."""

    enabled: bool = setting("enabled", False, doc="snapshot every partial app's state")
    interval_in_min: float = setting("intervalInMin", 1.0, minimum=1e-9, unit="minutes", doc="minutes between snapshots")
    revisions_to_keep: int = setting("revisionsToKeep", 2, minimum=1, doc="snapshots kept per instance")
    persistence_store: str = setting(
        "persistenceStore", "file", parse=_persistence_store, doc="`database` (DBPersistenceStore) or `file` (FileSystemPersistenceStore)"
    )
    config: PersistenceStoreConfig = setting("config", factory=PersistenceStoreConfig, doc="where snapshots go")


@dataclass(frozen=True)
class SiddhiProperties:
    """`siddhi.properties`: distributed incremental aggregation settings."""

    partition_by_id: bool = setting("partitionById", False, doc="distributed incremental aggregations for every aggregation")
    shard_id: str | None = setting("shardId", None, shown="wso2.carbon.id", doc="this node's shard; never change it once set")


@dataclass(frozen=True)
class SiddhiConfig:
    """`siddhi`: Siddhi runtime properties."""

    properties: SiddhiProperties = setting("properties", factory=SiddhiProperties, doc="Siddhi properties")
    extensions: tuple[Any, ...] = setting(
        "extensions", (), doc="accepted for compatibility (WSO2's Java extensions and their properties); ignored with a warning"
    )


@dataclass(frozen=True)
class SparkConfig:
    """`spark`: the worker's Spark application (master URL and any spark.* settings)."""

    master: str = setting("master", "local[*]", doc="the Spark master URL")
    app_name: str | None = setting("appName", None, shown="sp-dagster-worker-<id>", doc="the Spark application name")
    conf: dict[str, str] = setting("conf", factory=dict, doc="any `spark.*` settings")
    authenticate_secret: str | None = setting(
        "authenticateSecret",
        None,
        doc="with a master that is not `local[...]`: the secret Spark's RPC between this worker's driver, its executors and a standalone "
        "master is authenticated with (`spark.authenticate`; the master and its workers need the same); write `${SPARK_AUTH_SECRET}` "
        'to take it from the environment. Required there, unless `conf` sets `spark.authenticate: "false"` on purpose',
        secret=True,
    )
    kafka_source: str = setting(
        "kafkaSource",
        "auto",
        choices=("auto", "native", "python"),
        doc="how instances read Kafka: Spark's connector (`native`, needs spark-sql-kafka-0-10 in `spark.jars.packages`), "
        "the built-in Python source (`python`), or the connector when its jar is loadable (`auto`); the two keep offsets apart, so keep one choice while instances have checkpoints",
    )
    execution_mode: str = setting(
        "executionMode",
        "continuous",
        choices=("continuous", "microbatch"),
        doc="how instances run: each as a long-running Spark task that processes events as they come (`continuous`: "
        "milliseconds of latency, one task slot per instance), or as a Structured Streaming query (`microbatch`: "
        "Spark's checkpoints and state store, about a second per micro-batch and hop); the two keep state apart, so "
        "an instance switched to the other mode starts afresh",
    )
    checkpoint_interval: int = setting(
        "checkpointInterval",
        2000,
        minimum=100,
        unit="milliseconds",
        doc="continuous mode: ms between an instance's checkpoints (engine snapshot and the input offsets it covers) "
        "kept by its worker; revisions go to the persistence store every `state.persistence.intervalInMin`",
    )
    exactly_once: bool = setting(
        "exactlyOnce",
        True,
        doc="continuous mode on Kafka: publish each turn's outputs with its input offsets in one transaction "
        "(exactly-once; a stateless instance that only feeds other groups commits its offsets after a flush instead, "
        "the next group dropping replays by origin); false: at-least-once, replays dropped by origin between groups "
        "(fewer round trips per turn)",
    )
    task_slots: int | None = setting(
        "taskSlots",
        None,
        minimum=1,
        shown="the cores granted to the application",
        doc="continuous mode: how many instances this worker runs at once (each holds one task slot); told to the managers, which place no more here. "
        "By default Spark's default parallelism, read again every poll: on a cluster manager, the cores its executors were granted (at least 2)",
    )


def _interval_minutes(value: Any, ctx: Context) -> int:
    """Minutes that a cron schedule can repeat exactly: a divisor of 60, or whole hours dividing a day."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ctx.error(f"expected a whole number of minutes of at least 1, got {describe(value)}")
    if 60 % value == 0 or (value % 60 == 0 and 1440 % value == 0):
        return value
    raise ctx.error(
        f"expected minutes that divide an hour (1, 2, 5, 10, 15, 30, ...) or whole hours that divide a day (60, 120, 180, 240, 360, 480, 720, 1440), got {value}"
    )


@dataclass(frozen=True)
class DagsterConfig:
    """`dagster`: the Dagster window (app-repository sensor, schedules, deploy waits, the UI's address)."""

    app_repository: str = setting("appRepository", "apps", doc="the directory of `*.siddhi` files the sensor deploys (relative: to the working directory)")
    sensor_interval: int = setting("sensorInterval", 30, minimum=1, unit="seconds", doc="seconds between looks at the app repository")
    rebalance_interval: int = setting("rebalanceInterval", 30, parse=_interval_minutes, unit="minutes", doc="minutes between scheduled rebalancing runs")
    health_interval: int = setting("healthInterval", 1, parse=_interval_minutes, unit="minutes", doc="minutes between health checks of the partial apps")
    lag_growth_samples: int = setting("lagGrowthSamples", 3, minimum=2, doc="consecutive checks of rising lag that fail the lag check")
    sink_freshness: int = setting(
        "sinkFreshness",
        60,
        minimum=0,
        unit="minutes",
        doc="minutes a sink topic may go without new events before Dagster shows it stale (0: no freshness policy)",
    )
    placement_timeout: int = setting("placementTimeout", 60, minimum=1, unit="seconds", doc="seconds a deploy run waits for every instance to be placed")
    running_timeout: int = setting("runningTimeout", 180, minimum=1, unit="seconds", doc="seconds a deploy run waits for every instance to run")
    host: str = setting("host", "127.0.0.1", doc="the Dagster webserver's host (`sp-dagster up`; `deploy` and `undeploy` reload its asset graph)")
    port: int = setting("port", 3000, minimum=1, doc="the Dagster webserver's port")


@dataclass(frozen=True)
class MetricsConfig:
    """`metrics`: the Prometheus endpoint (`/metrics`) every manager and worker serves."""

    enabled: bool = setting("enabled", True, doc="serve Prometheus metrics")
    host: str = setting("host", "127.0.0.1", doc="the address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)")
    port: int = setting("port", 0, minimum=0, doc="the port (0: any free one; `sp-dagster status` shows each node's URL)")


@dataclass(frozen=True)
class MessagingSettings:
    """The messaging layer a node uses, derived from deployment.config."""

    kind: str  # "kafka" or "nats"
    servers: tuple[str, ...]
    cluster_id: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    broker_profile: str = "auto"  # deployment.config.brokerProfile (messaging/profiles.py)

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
    dagster: DagsterConfig = field(default_factory=DagsterConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

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
        return MessagingSettings("kafka", d.bootstrap_urls or (EMBEDDED_BOOTSTRAP,), None, dict(d.kafka_properties), d.broker_profile)

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
