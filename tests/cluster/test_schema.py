"""Schema creation and upgrades, the database clock, and errors for an unreachable database."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import inspect, select

from sp_dagster.cluster import schema
from sp_dagster.cluster.db import ControlPlane
from sp_dagster.embedded.broker import free_port
from sp_dagster.errors import ControlPlaneError, DatabaseUnavailable
from tests.cluster.helpers import all_at_once


def table_names(plane: ControlPlane) -> set[str]:
    with plane.transaction() as conn:
        return set(inspect(conn).get_table_names())


def test_fresh_database_gets_every_table(plane):
    assert {table.name for table in schema.metadata.sorted_tables} <= table_names(plane)
    assert schema.check_version(plane) == schema.SCHEMA_VERSION
    assert plane.migrate() == schema.SCHEMA_VERSION  # idempotent


def test_older_database_is_upgraded_with_its_data_kept(database_url):
    plane = ControlPlane(database_url)
    assert schema.migrate(plane, target=1) == 1
    assert "sp_deployments" not in table_names(plane)
    with plane.transaction() as conn:
        conn.execute(schema.nodes.insert().values(
            node_id="w1", role="worker", address="h:1", incarnation=3, state="alive",
            registered_at=1, last_heartbeat=2, state_changed_at=1,
        ))
    assert plane.migrate() == schema.SCHEMA_VERSION
    with plane.transaction() as conn:
        assert conn.execute(select(schema.nodes.c.incarnation)).scalar_one() == 3
    assert "sp_deployments" in table_names(plane)
    plane.close()


def test_newer_database_is_refused(plane):
    with plane.transaction() as conn:
        conn.execute(schema.schema_version.update().values(version=schema.SCHEMA_VERSION + 1))
    with pytest.raises(ControlPlaneError, match=r"schema version \d+, newer than this sp-dagster's"):
        plane.migrate()


def test_concurrent_first_migrations_agree(database_url):
    planes = [ControlPlane(database_url) for _ in range(4)]
    assert all_at_once(lambda plane: plane.migrate(), planes) == [schema.SCHEMA_VERSION] * len(planes)
    for plane in planes:
        plane.close()


def test_database_clock(plane):
    # Same host, so the server's clock and ours agree to well within a second.
    assert abs(plane.now_ms() - time.time() * 1000) < 1000
    first = plane.now_ms()
    time.sleep(0.05)
    assert plane.now_ms() - first >= 40


@pytest.mark.parametrize("scheme", ["postgresql+psycopg", "mysql+pymysql"])
def test_unreachable_database_is_one_clear_line(scheme):
    url = f"{scheme}://sp:s3cret@127.0.0.1:{free_port()}/cluster"
    plane = ControlPlane(url, datasource_name="SP_MGT_DB")
    with pytest.raises(DatabaseUnavailable) as caught:
        plane.migrate()
    message = str(caught.value)
    assert "s3cret" not in message and "sp:***@127.0.0.1" in message
    assert "(datasource SP_MGT_DB) is unreachable" in message and "\n" not in message
    assert "check that the database server is running" in message
