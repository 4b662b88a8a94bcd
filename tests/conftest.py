"""Shared fixtures: one embedded broker and one NATS server per test session, an isolated data directory per test."""

from __future__ import annotations

import os
import uuid

import pytest

from tests.fixtures.jvm import submit_args

pytest_plugins = ["tests.fixtures.databases"]

# Every Spark driver a test starts, in this process or a worker process it runs, starts cheaper (tests/fixtures/jvm.py).
os.environ.setdefault("PYSPARK_SUBMIT_ARGS", submit_args())

# A test that asks for one of these runs against a real server or Spark, as does one marked with one of the
# markers (modules that start servers of their own, or reach one through request.getfixturevalue): the integration tier.
SERVER_FIXTURES = {"broker", "nats_server", "spark", "postgres_server", "mariadb_server", "database_server_factory"}
SERVER_MARKERS = ("slow", "broker", "nats")


def pytest_collection_modifyitems(items):
    """Mark server-backed and slow tests `integration`, and put slow tests first so parallel workers end together."""
    for item in items:
        if any(item.get_closest_marker(name) for name in SERVER_MARKERS) or SERVER_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.integration)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """A real Kafka-protocol broker (tansu, in memory) on a free port, for the whole session."""
    from sp_dagster.embedded import EmbeddedBroker

    log_path = tmp_path_factory.mktemp("broker") / "tansu.log"
    with EmbeddedBroker(log_path=log_path) as running:
        yield running


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory):
    """A real nats-server with JetStream on (storing in a temporary directory) on a free port, for the whole session."""
    from sp_dagster.embedded import EmbeddedNatsServer

    base = tmp_path_factory.mktemp("nats")
    with EmbeddedNatsServer(store_dir=base / "store", log_path=base / "nats-server.log") as running:
        yield running


@pytest.fixture
def nats(nats_server):
    """A NatsTransport connected to the session NATS server, in a cluster id of its own."""
    from sp_dagster.messaging.nats import NatsTransport

    transport = NatsTransport(nats_server.url, f"test-{uuid.uuid4().hex[:8]}", timeout=15)
    yield transport
    transport.close()


@pytest.fixture
def kafka(broker):
    """A KafkaTransport connected to the session broker."""
    from sp_dagster.messaging.kafka import KafkaTransport

    transport = KafkaTransport(broker.bootstrap_servers, timeout=15)
    yield transport
    transport.close()


@pytest.fixture
def topic_name():
    """A fresh topic name per test, so tests never see each other's events."""
    return f"test.{uuid.uuid4().hex[:10]}"


@pytest.fixture(autouse=True)
def sp_home(tmp_path, monkeypatch):
    """Point the embedded defaults (SQLite files, persistence) at a per-test directory."""
    home = tmp_path / "sp-home"
    monkeypatch.setenv("SP_DAGSTER_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One local SparkSession for the whole test session, with sp-dagster's data sources registered."""
    from pyspark.sql import SparkSession

    from sp_dagster.worker.spark.kafka_source import KafkaPartitionsSource
    from sp_dagster.worker.spark.nats_source import NatsPartitionsSource

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = (
        # Up to 3 attempts per task, as on a cluster (spark.task.maxFailures): on 2 cores busy with other tests a
        # task's Python worker once failed to connect back within Spark's fixed 10 s, which local[4] does not retry.
        SparkSession.builder.master("local[4,3]")
        .appName("sp-dagster-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.stateStore.providerClass", "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(KafkaPartitionsSource)
    session.dataSource.register(NatsPartitionsSource)
    yield session
    session.stop()


def pytest_terminal_summary(terminalreporter):
    """Repeat each failure's own message last: CI shows the end of the output, after captured logs."""
    failed = terminalreporter.stats.get("failed", [])
    if not failed:
        return
    terminalreporter.section("failure digest")
    for report in failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr)
        terminalreporter.write_line(f"{report.nodeid}:")
        for line in message.splitlines()[:40]:
            terminalreporter.write_line(f"    {line[:2000]}")
