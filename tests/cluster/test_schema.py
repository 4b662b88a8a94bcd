"""Schema creation and upgrades, the database clock, and errors for an unreachable database."""

from __future__ import annotations

import gzip
import time
import zlib

import pytest
from sqlalchemy import inspect, select

from sp_dagster.cluster import schema
from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.store.revisions import RevisionStore
from sp_dagster.embedded.broker import free_port
from sp_dagster.errors import ControlPlaneError, DatabaseUnavailable
from tests.cluster.helpers import all_at_once, first_revision_layout


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
        conn.execute(
            schema.nodes.insert().values(
                node_id="w1",
                role="worker",
                address="h:1",
                incarnation=3,
                state="alive",
                registered_at=1,
                last_heartbeat=2,
                state_changed_at=1,
            )
        )
    assert plane.migrate() == schema.SCHEMA_VERSION
    with plane.transaction() as conn:
        assert conn.execute(select(schema.nodes.c.incarnation)).scalar_one() == 3
    assert "sp_deployments" in table_names(plane)
    plane.close()


def test_version_6_adds_the_managers_metrics_url_to_a_table_of_the_first_layout(database_url):
    from sqlalchemy import BigInteger, Column, MetaData, String, Table

    plane = ControlPlane(database_url)
    names = ("group_id", "node_id", "incarnation", "address", "started_at", "last_heartbeat", "state")
    columns = [Column(n, BigInteger if n in ("started_at", "last_heartbeat") else String(64), primary_key=n in names[:2]) for n in names]
    old = Table("sp_managers", MetaData(), *columns)  # as versions 1-5 made it
    with plane.transaction() as conn:
        old.create(conn)
        conn.execute(old.insert().values(group_id="g", node_id="m1", incarnation="i", address="h:1", started_at=1, last_heartbeat=2, state="running"))
    with plane.schema_transaction() as conn:
        schema.MIGRATIONS[5](conn)
        schema.MIGRATIONS[5](conn)  # idempotent
    with plane.transaction() as conn:
        assert conn.execute(select(schema.managers.c.node_id, schema.managers.c.metrics_url)).one() == ("m1", None)
    plane.close()


def test_version_2_state_revisions_move_to_the_persistence_table(database_url):
    plane = ControlPlane(database_url)
    assert schema.migrate(plane, target=2) == 2
    version_2 = [("a-g-1", 1, 1000, b"a1" * 500), ("a-g-1", 2, 3000, b"a2" * 500), ("b-g-1", 7, 1500, b"b7")]
    first_layout = first_revision_layout()
    with plane.transaction() as conn:
        conn.execute(
            schema.state_revisions.insert(),
            [dict(instance_id=i, revision=n, created_at=at, raw_size=len(data), data=zlib.compress(data)) for i, n, at, data in version_2],
        )
        # The worker's store kept its revisions in the same database: they are merged in save order.
        first_layout.create(conn)
        conn.execute(first_layout.insert().values(siddhiAppName="a-g-1", revision="2000__a-g-1", snapshot=gzip.compress(b"worker"), savedAt=2000))

    assert plane.migrate() == schema.SCHEMA_VERSION
    assert "sp_state_revisions" not in table_names(plane)
    store = RevisionStore(plane, plane, keep=10)
    assert [(r.revision, r.created_at, r.raw_size) for r in store.revisions("a-g-1")] == [(1, 1000, 1000), (2, 2000, 6), (3, 3000, 1000)]
    assert store.latest("a-g-1").data == b"a2" * 500
    only = store.latest("b-g-1")
    assert (only.revision, only.data, only.saved_by) == (1, b"b7", None)
    assert store.save("a-g-1", b"a4") == 4
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
