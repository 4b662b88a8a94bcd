"""Stock WSO2 files load: tabs, SP 4.1's httpInterface, siddhi extensions, Carbon placeholders, Oracle/MSSQL URLs, WSO2_CLUSTER_DB."""

from __future__ import annotations

import logging

import pytest

from sp_dagster.config import parse_config
from sp_dagster.errors import ConfigError

# Seed 003's resource-node sample as printed: tabs before the comments.
SEED_003_WORKER = (
    "deployment.config:\n"
    "  type: distributed           # required in both manager / resource\n"
    "  httpsInterface:              # required in both manager / resource\n"
    "    host: 192.168.1.3\n"
    "    port: 9090\n"
    "    username: admin\t\t\t  # username of current resource node\n"
    "    password: admin\t\t\t  # password of current resource node\n"
    "  leaderRetryInterval: 10000  # only required in worker\n"
    "  resourceManagers:           # only required in worker\n"
    "    - host: 192.168.1.1\n"
    "      port: 9543\n"
    "      username: admin\t\t  # username of manager node\n"
    "      password: admin\t\t  # password of manager node\n"
)


def test_tabs_before_comments_as_seed_003_prints_them():
    config = parse_config(SEED_003_WORKER)
    assert config.deployment.https_interface.username == "admin" and config.deployment.resource_managers[0].password == "admin"


def test_a_tab_that_indents_says_so():
    with pytest.raises(ConfigError, match=r"<string>:2:1: invalid YAML: .*\(a tab; YAML indents with spaces\)"):
        parse_config("deployment.config:\n\ttype: distributed\n")


def test_sp_41_http_interface():
    config = parse_config("deployment.config:\n  type: distributed\n  httpInterface:\n    host: node-1\n    port: 9190\n")
    assert (config.deployment.https_interface.host, config.deployment.https_interface.port) == ("node-1", 9190)
    with pytest.raises(ConfigError, match="httpInterface: an older name of 'httpsInterface', which is also given"):
        parse_config("deployment.config:\n  httpsInterface: {port: 1}\n  httpInterface: {port: 2}\n")


def test_siddhi_extensions_are_accepted_with_a_warning(caplog):
    text = "siddhi:\n  extensions:\n    - extension:\n        name: findAndReplace\n        namespace: str\n        properties: {key: value}\n"
    with caplog.at_level(logging.WARNING):
        config = parse_config(text)
    assert config.siddhi.extensions[0]["extension"]["name"] == "findAndReplace"
    assert "siddhi.extensions has no effect" in caplog.text


def test_carbon_placeholders_resolve_or_say_what_to_set(sp_home, monkeypatch):
    jdbc = "datasources:\n  SP_MGT_DB:\n    jdbcUrl: 'jdbc:h2:${sys:carbon.home}/wso2/${sys:wso2.runtime}/database/SP_MGT_DB;AUTO_SERVER=TRUE'\n"
    monkeypatch.delenv("WSO2_RUNTIME", raising=False)
    with pytest.raises(
        ConfigError, match=r"<string>:3:14: \$\{sys:wso2.runtime\} is a Java system property; sp-dagster reads it from \$WSO2_RUNTIME, which is not set"
    ):
        parse_config(jdbc)
    monkeypatch.setenv("WSO2_RUNTIME", "worker")
    assert parse_config(jdbc).datasources["SP_MGT_DB"].url == f"sqlite:///{sp_home}/wso2/worker/database/SP_MGT_DB.db"
    monkeypatch.setenv("NODE", "n-7")
    assert parse_config("wso2.carbon:\n  id: ${env:NODE}\n").node_id == "n-7"
    with pytest.raises(ConfigError, match=r"\$\{sec:db.password\} is a WSO2 secure-vault alias"):
        parse_config("datasources:\n  X:\n    jdbcUrl: 'jdbc:h2:mem:x'\n    password: ${sec:db.password}\n")


@pytest.mark.parametrize(
    "jdbc, url",
    [
        ("jdbc:oracle:thin:@db-host:1521:ORCL", "oracle+oracledb://sp:pw@db-host:1521/ORCL"),
        ("jdbc:oracle:thin:@//db-host:1521/sp.example.com", "oracle+oracledb://sp:pw@db-host:1521/?service_name=sp.example.com"),
        ("jdbc:oracle:thin:@db-host:1521/SPDB", "oracle+oracledb://sp:pw@db-host:1521/?service_name=SPDB"),
        ("jdbc:sqlserver://db-host:1433;databaseName=WSO2_DB;SendStringParametersAsUnicode=false", "mssql+pymssql://sp:pw@db-host:1433/WSO2_DB"),
        ("jdbc:sqlserver://db-host;database=SP", "mssql+pymssql://sp:pw@db-host/SP"),
    ],
)
def test_oracle_and_mssql_urls(jdbc, url):
    config = parse_config(f"datasources:\n  SP_MGT_DB:\n    jdbcUrl: '{jdbc}'\n    username: sp\n    password: pw\n")
    assert config.datasources["SP_MGT_DB"].url == url


@pytest.mark.parametrize(
    "jdbc, install", [("jdbc:oracle:thin:@h:1521:X", "sp-dagster[oracle]"), ("jdbc:sqlserver://h:1433;databaseName=X", "sp-dagster[mssql]")]
)
def test_a_missing_driver_is_one_line_naming_the_package(jdbc, install):
    from sp_dagster.cluster.db import ControlPlane

    config = parse_config(f"datasources:\n  SP_MGT_DB:\n    jdbcUrl: '{jdbc}'\n    username: sp\n    password: secret\n")
    module = "oracledb" if "oracle" in jdbc else "pymssql"
    try:
        __import__(module)
    except ModuleNotFoundError:
        pass
    else:
        pytest.skip(f"{module} is installed")
    with pytest.raises(ConfigError) as caught:
        ControlPlane.from_config(config, migrate=False)
    assert "\n" not in str(caught.value) and f"({module})" in str(caught.value) and f"pip install '{install}'" in str(caught.value)
    assert "secret" not in str(caught.value)


def test_seed_004_cluster_config_with_its_own_cluster_db(caplog):
    text = (
        "cluster.config:\n  enabled: true\n  groupId:  group 1\n"
        "  coordinationStrategyClass: org.wso2.carbon.cluster.coordinator.rdbms.RDBMSCoordinationStrategy\n"
        "  strategyConfig:\n    datasource: WSO2_CLUSTER_DB\n    heartbeatInterval: 5000\n    heartbeatMaxRetry: 5\n"
    )
    with caplog.at_level(logging.WARNING):
        config = parse_config(text, role="manager")
    assert (config.cluster.group_id, config.cluster.strategy_config.heartbeat_interval) == ("group 1", 5000)
    assert "'WSO2_CLUSTER_DB' is not used: sp-dagster elects group 'group 1''s leader in deployment.config.datasource 'SP_MGT_DB'" in caplog.text
