"""deployment.yaml loading: the shipped files, the seeds' shapes, and a table of bad files."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sp_dagster.config import load_config, parse_config
from sp_dagster.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_files_load_with_embedded_defaults(sp_home):
    manager = load_config(ROOT / "conf/manager/deployment.yaml")
    worker = load_config(ROOT / "conf/worker/deployment.yaml")
    assert manager.role == "manager" and worker.role == "worker"
    assert manager.cluster.enabled and manager.cluster.group_id == "sp"
    assert manager.messaging.kind == "kafka" and manager.messaging.bootstrap_servers == "localhost:9092"
    assert manager.control_plane.url == f"sqlite:///{sp_home}/sp_mgt.db"
    assert worker.control_plane.url == manager.control_plane.url
    assert worker.persistence.enabled and worker.persistence.persistence_store == "database"
    assert worker.persistence_datasource.url == f"sqlite:///{sp_home}/persistence.db"
    assert worker.spark.master == "local[8]" and worker.spark.execution_mode == "continuous"
    assert worker.node_id == "worker-1" and worker.shard_id == "worker-1"


def test_env_references_resolve(monkeypatch):
    monkeypatch.setenv("SP_NODE_ID", "worker-7")
    monkeypatch.setenv("SP_KAFKA_BOOTSTRAP", "k1:9092,k2:9092")
    config = load_config(ROOT / "conf/worker/deployment.yaml")
    assert config.node_id == "worker-7"
    assert config.messaging.servers == ("k1:9092", "k2:9092")
    monkeypatch.setenv("HB", "2500")
    typed = parse_config("deployment.config:\n  type: distributed\n  heartbeatInterval: ${HB}\n")
    assert typed.deployment.heartbeat_interval == 2500


def test_node_id_override_and_role():
    config = load_config(ROOT / "conf/worker/deployment.yaml", node_id="w-9")
    assert config.node_id == "w-9" and config.shard_id == "w-9"


SEED_MANAGER = """
wso2.carbon:
  id: wso2-sp-mgr-1
cluster.config:
  enabled: true
  groupId: group-1
  coordinationStrategyClass: org.wso2.carbon.cluster.coordinator.rdbms.RDBMSCoordinationStrategy
  strategyConfig:
    datasource: SP_MGT_DB
    heartbeatInterval: 500
    heartbeatMaxRetry: 4
    eventPollingInterval: 1000
deployment.config:
  type: distributed
  httpsInterface:
    host: localhost
    port: 9543
  heartbeatInterval: 2000
  heartbeatMaxRetry: 4
  datasource: SP_MGT_DB
  minResourceCount: 1
  bootstrapURLs: localhost:9092
  zooKeeperConfig:
    zooKeeperURLs: localhost:2181
    connectionTimeout: 10000
    sessionTimeout: 10000
wso2.datasources:
  dataSources:
    - name: SP_MGT_DB
      description: The MySQL datasource used for Cluster Coordination
      jndiConfig:
        name: jdbc/WSO2ClusterDB
      definition:
        type: RDBMS
        configuration:
          jdbcUrl: 'jdbc:mysql://db.example:3306/SP_MGT_DB?useSSL=false'
          username: root
          password: 'p@ss:word'
          driverClassName: com.mysql.jdbc.Driver
          maxPoolSize: 50
          idleTimeout: 60000
          connectionTestQuery: SELECT 1
          validationTimeout: 30000
          isAutoCommit: false
"""

SEED_WORKER = """
wso2.carbon:
  id: wso2-sp-1
deployment.config:
  type: distributed
  isReceiverNode : true
  httpsInterface:
    host: 192.168.1.3
    port: 9090
    username: admin
    password: admin
  leaderRetryInterval: 10000
  resourceManagers:
    - host: 192.168.1.1
      port: 9543
      username: admin
      password: admin
    - host: 192.168.1.2
      port: 9543
      username: admin
      password: admin
datasources:
  WSO2_PERSISTENCE_DB:
    jdbcUrl: jdbc:postgresql://pg:5432/WSO2_PERSISTENCE_DB
    username: root
    password: root
    driverClassName: org.postgresql.Driver
state.persistence:
  enabled: true
  intervalInMin: 3
  revisionsToKeep: 2
  persistenceStore: org.wso2.carbon.stream.processor.core.persistence.DBPersistenceStore
  config:
    datasource: WSO2_PERSISTENCE_DB
    table: PERSISTENCE_TABLE
siddhi:
  properties:
    partitionById: true
    shardId: wso2-sp-1
"""


def test_seed_manager_shape():
    config = parse_config(SEED_MANAGER, "manager.yaml", role="manager")
    assert config.cluster.strategy_config.heartbeat_interval == 500
    assert config.deployment.heartbeat_max_retry == 4
    assert config.control_plane.url == "mysql+pymysql://root:p%40ss%3Aword@db.example:3306/SP_MGT_DB"
    assert "p%40ss" not in config.control_plane.safe_url and "***" in config.control_plane.safe_url
    assert config.control_plane.max_pool_size == 50


def test_seed_worker_shape():
    config = parse_config(SEED_WORKER, "worker.yaml", role="worker")
    d = config.deployment
    assert d.is_receiver_node and d.leader_retry_interval == 10000
    assert [m.host for m in d.resource_managers] == ["192.168.1.1", "192.168.1.2"]
    assert config.persistence.persistence_store == "database" and config.persistence.interval_in_min == 3
    assert config.persistence_datasource.url == "postgresql+psycopg://root:root@pg:5432/WSO2_PERSISTENCE_DB"
    assert config.siddhi.properties.partition_by_id and config.shard_id == "wso2-sp-1"


def test_defaults_are_wso2s():
    config = parse_config("deployment.config:\n  type: distributed\n")
    d = config.deployment
    assert (d.heartbeat_interval, d.heartbeat_max_retry, d.min_resource_count, d.leader_retry_interval) == (10000, 2, 1, 10000)
    assert config.persistence.revisions_to_keep == 2 and config.persistence.interval_in_min == 1
    assert config.persistence.config.table == "PERSISTENCE_TABLE"


def test_nats_messaging():
    config = parse_config("deployment.config:\n  type: distributed\n  natsServerUrl: nats://a:4222, nats://b:4222\n  clusterId: c1\n")
    assert config.messaging.kind == "nats"
    assert config.messaging.servers == ("nats://a:4222", "nats://b:4222") and config.messaging.cluster_id == "c1"


@pytest.mark.parametrize(
    "jdbc, url",
    [
        ("jdbc:mysql://h:3306/db?useSSL=false", "mysql+pymysql://u:p@h:3306/db"),
        ("jdbc:mariadb://h/db", "mysql+pymysql://u:p@h/db"),
        ("jdbc:postgresql://h:5432/db", "postgresql+psycopg://u:p@h:5432/db"),
        ("jdbc:h2:./database/SP_MGT_DB;DB_CLOSE_ON_EXIT=FALSE;LOCK_TIMEOUT=60000", "sqlite:///{home}/database/SP_MGT_DB.db"),
        ("jdbc:h2:${sys:carbon.home}/wso2/db/X;AUTO_SERVER=TRUE", "sqlite:///{home}/wso2/db/X.db"),
        ("jdbc:h2:mem:test", "sqlite://"),
        ("jdbc:sqlite:/tmp/x.db", "sqlite:////tmp/x.db"),
    ],
)
def test_jdbc_translation(jdbc, url, sp_home):
    config = parse_config(f"datasources:\n  DB:\n    jdbcUrl: '{jdbc}'\n    username: u\n    password: p\n")
    assert config.datasources["DB"].url == url.format(home=sp_home)


def _bad(body: str) -> str:
    return textwrap.dedent(body).lstrip("\n")


BAD_FILES = [
    (
        "unknown key with suggestion",
        """
        deployment.config:
          type: distributed
          heartbeatIntervall: 3000
        """,
        "bad.yaml:3:3: deployment.config.heartbeatIntervall: unknown key 'heartbeatIntervall'; did you mean 'heartbeatInterval'?",
    ),
    (
        "wrong type",
        """
        deployment.config:
          type: distributed
          heartbeatInterval: fast
        """,
        "bad.yaml:3:22: deployment.config.heartbeatInterval: expected a whole number of at least 1 (milliseconds), got 'fast'",
    ),
    (
        "negative count",
        """
        deployment.config:
          type: distributed
          minResourceCount: 0
        """,
        "bad.yaml:3:21: deployment.config.minResourceCount: expected a whole number of at least 1, got 0",
    ),
    (
        "missing required type",
        """
        deployment.config:
          minResourceCount: 2
        """,
        "bad.yaml:2:3: deployment.config.type: is required: expected one of 'distributed'",
    ),
    (
        "wrong deployment type",
        """
        deployment.config:
          type: ha
        """,
        "bad.yaml:2:9: deployment.config.type: expected one of 'distributed', got 'ha'",
    ),
    (
        "unknown kafka source",
        """
        deployment.config:
          type: distributed
        spark:
          kafkaSource: jvm
        """,
        "bad.yaml:4:16: spark.kafkaSource: expected one of 'auto', 'native', 'python', got 'jvm'",
    ),
    (
        "unknown section",
        """
        deployment.configs:
          type: distributed
        """,
        "bad.yaml:1:1: deployment.configs: unknown section; did you mean 'deployment.config'?",
    ),
    (
        "boolean expected",
        """
        cluster.config:
          enabled: sometimes
        """,
        "bad.yaml:2:12: cluster.config.enabled: expected true or false, got 'sometimes'",
    ),
    (
        "nested unknown key in a list",
        """
        deployment.config:
          type: distributed
          resourceManagers:
            - host: a
              prot: 9543
        """,
        "bad.yaml:5:7: deployment.config.resourceManagers[0].prot: unknown key 'prot'; did you mean 'port'?",
    ),
    (
        "undefined datasource",
        """
        deployment.config:
          type: distributed
          datasource: MY_DB
        """,
        "bad.yaml:3:15: deployment.config.datasource: datasource 'MY_DB' is not defined; define it under datasources: (defined: SP_MGT_DB, WSO2_PERSISTENCE_DB)",
    ),
    (
        "unsupported jdbc url",
        """
        datasources:
          DB:
            jdbcUrl: jdbc:db2://h:50000/xe
        """,
        "bad.yaml:3:14: datasources.DB.jdbcUrl: unsupported JDBC URL 'jdbc:db2://h:50000/xe'; expected MySQL/MariaDB (jdbc:mysql://, jdbc:mariadb://), PostgreSQL (jdbc:postgresql://), Oracle (jdbc:oracle:thin:@), MSSQL (jdbc:sqlserver://), H2 (run on SQLite) or SQLite",
    ),
    (
        "bad sqlalchemy url",
        """
        datasources:
          DB: not a url
        """,
        "bad.yaml:2:7: datasources.DB: expected a SQLAlchemy URL such as 'sqlite:///path/to/db.sqlite' or a jdbcUrl, got 'not a url'",
    ),
    (
        "unknown persistence store",
        """
        state.persistence:
          persistenceStore: org.example.RedisStore
        """,
        "bad.yaml:2:21: state.persistence.persistenceStore: expected 'database' (org.wso2.carbon.stream.processor.core.persistence.DBPersistenceStore) or 'file' (org.wso2.carbon.stream.processor.core.persistence.FileSystemPersistenceStore), got 'org.example.RedisStore'",
    ),
    (
        "nats without cluster id",
        """
        deployment.config:
          type: distributed
          natsServerUrl: nats://localhost:4222
        """,
        "bad.yaml:2:3: deployment.config.clusterId: is required with natsServerUrl: expected the NATS cluster id",
    ),
    (
        "unset environment variable",
        """
        datasources:
          DB: mysql+pymysql://sp:${SP_TEST_SURELY_UNSET}@h/db
        """,
        "bad.yaml:2:7: environment variable SP_TEST_SURELY_UNSET is not set; export it, or give a default as ${SP_TEST_SURELY_UNSET:-value}",
    ),
    (
        "invalid yaml",
        """
        deployment.config:
          type: [distributed
        """,
        "bad.yaml:3:1: invalid YAML: expected ',' or ']', but got '<stream end>'",
    ),
    (
        "duplicate key",
        """
        deployment.config:
          type: distributed
          type: distributed
        """,
        "bad.yaml:3:3: key 'type' appears twice in the same section",
    ),
    (
        "section is not a mapping",
        """
        state.persistence: yes
        """,
        "bad.yaml:1:20: state.persistence: expected a mapping with keys such as enabled, intervalInMin, revisionsToKeep, persistenceStore, got True",
    ),
    (
        "top level is a list",
        """
        - deployment.config
        """,
        "bad.yaml:1:1: expected a mapping of sections (such as deployment.config:) at the top level",
    ),
    (
        "persistence datasource undefined",
        """
        state.persistence:
          enabled: true
          persistenceStore: database
          config:
            datasource: PERSIST
        """,
        "bad.yaml:5:17: state.persistence.config.datasource: datasource 'PERSIST' is not defined; define it under datasources: (defined: SP_MGT_DB, WSO2_PERSISTENCE_DB)",
    ),
    (
        "per-host persistence with a shared control plane",
        """
        deployment.config:
          type: distributed
          datasource: SP_MGT_DB
        datasources:
          SP_MGT_DB: postgresql+psycopg://sp@db.example/sp
          LOCAL: sqlite:///state.db
        state.persistence:
          enabled: true
          persistenceStore: database
          config:
            datasource: LOCAL
        """,
        "bad.yaml:11:17: state.persistence.config.datasource: names SQLite on this host (LOCAL) while the control plane (SP_MGT_DB) is a "
        "shared database: a worker taking an instance over would find none of its revisions. Point it at a database every worker reaches "
        "(SP_MGT_DB itself will do)",
    ),
    (
        "a Spark cluster without RPC authentication",
        """
        spark:
          master: spark://spark.example:7077
        """,
        "bad.yaml:2:11: spark.master: is a cluster (spark://spark.example:7077) and spark.authenticateSecret is not set: anyone who "
        "reaches this worker's driver or its executors could run code there. Set spark.authenticateSecret: ${SPARK_AUTH_SECRET} (the "
        'master and its workers need the same secret), or spark.conf: {spark.authenticate: "false"} to run without on purpose',
    ),
]


@pytest.mark.parametrize("body, message", [(b, m) for _, b, m in BAD_FILES], ids=[name for name, _, _ in BAD_FILES])
def test_bad_files_fail_with_one_line(tmp_path, body, message):
    path = tmp_path / "bad.yaml"
    path.write_text(_bad(body))
    with pytest.raises(ConfigError) as caught:
        load_config(path, role="worker")
    text = str(caught.value)
    assert "\n" not in text
    assert text == f"{path.parent}/{message}"


def test_manager_cannot_be_receiver(tmp_path):
    path = tmp_path / "deployment.yaml"
    path.write_text("deployment.config:\n  type: distributed\n  isReceiverNode: true\n")
    with pytest.raises(ConfigError, match="isReceiverNode: is only for worker nodes"):
        load_config(path, role="manager")


def test_missing_file():
    with pytest.raises(ConfigError, match="no such file"):
        load_config("/nonexistent/deployment.yaml")


def test_ignored_wso2_sections_warn(caplog):
    config = parse_config("wso2.metrics:\n  enabled: false\ndeployment.config:\n  type: distributed\n")
    assert config.deployment.type == "distributed"
    assert "wso2.metrics" in caplog.text and "no effect" in caplog.text


def test_docs_reference_is_current():
    from sp_dagster.config.reference import reference_markdown

    page = (ROOT / "docs" / "configuration.md").read_text()
    start, end = "<!-- config-reference:start -->\n", "\n<!-- config-reference:end -->"
    assert page.count(start) == 1 and page.count(end) == 1, "docs/configuration.md must hold the reference between one pair of markers"
    section = page[page.index(start) + len(start) : page.index(end)]
    assert section == reference_markdown(), "docs/configuration.md's reference is stale: paste `sp-dagster config reference`"


def test_a_spark_cluster_authenticates_its_rpc_with_the_secret_from_the_environment(monkeypatch):
    from sp_dagster.worker.node import spark_settings

    monkeypatch.setenv("SPARK_AUTH_SECRET", "s3cr3t")
    cluster = parse_config("spark:\n  master: spark://spark.example:7077\n  authenticateSecret: ${SPARK_AUTH_SECRET}\n")
    settings = spark_settings(cluster)
    assert (settings["spark.authenticate"], settings["spark.authenticate.secret"]) == ("true", "s3cr3t")
    assert "s3cr3t" not in repr(cluster.spark), "the secret must not show where the config is printed"
    opted_out = parse_config('spark:\n  master: spark://spark.example:7077\n  conf: {spark.authenticate: "false"}\n')
    assert spark_settings(opted_out)["spark.authenticate"] == "false"
    local = spark_settings(parse_config("spark:\n  master: local[2]\n"))
    assert "spark.authenticate" not in local and local["spark.driver.bindAddress"] == "127.0.0.1"
