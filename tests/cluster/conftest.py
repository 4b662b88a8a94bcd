"""Fixtures of the control-plane tests: a migrated control plane on each database backend."""

from __future__ import annotations

import pytest

from tests.fixtures.databases import BACKENDS


@pytest.fixture(scope="session")
def _shared_planes(tmp_path_factory):
    """One migrated database per backend for the session (made on first use), closed at the end."""
    planes = {}
    yield planes
    for plane in planes.values():
        plane.close()


@pytest.fixture(params=BACKENDS)
def plane(request, _shared_planes, tmp_path_factory):
    """A ControlPlane with the current schema and empty tables, on SQLite, MariaDB and PostgreSQL in turn.

    The database is created and migrated once per backend and emptied before each test (much
    faster than a new database each time). Tests that need a database no schema has touched
    use `database_url` instead.
    """
    from sp_dagster.cluster import schema
    from sp_dagster.cluster.db import ControlPlane

    kind = request.param
    if kind not in _shared_planes:
        if kind == "sqlite":
            url = f"sqlite:///{tmp_path_factory.mktemp('plane') / 'control-plane.db'}"
        else:
            url = request.getfixturevalue(f"{'postgres' if kind == 'postgresql' else kind}_server").create_database()
        _shared_planes[kind] = ControlPlane(url)
        _shared_planes[kind].migrate()
    control_plane = _shared_planes[kind]
    with control_plane.transaction() as conn:
        for table in reversed(schema.metadata.sorted_tables):
            if table is schema.schema_version:
                conn.execute(table.update().values(version=schema.SCHEMA_VERSION))
            else:
                conn.execute(table.delete())
    return control_plane


@pytest.fixture
def other_database_url(plane, request, tmp_path) -> str:
    """A fresh empty database on the same backend as `plane` (a persistence datasource of its own)."""
    if plane.dialect == "sqlite":
        return f"sqlite:///{tmp_path / 'persistence.db'}"
    server = "postgres_server" if plane.dialect == "postgresql" else "mariadb_server"
    return request.getfixturevalue(server).create_database()
