"""Fixtures of the control-plane tests: a migrated control plane on each database backend."""

from __future__ import annotations

import pytest


@pytest.fixture
def plane(database_url):
    """A ControlPlane on a fresh database (SQLite, MariaDB, PostgreSQL in turn), schema created."""
    from sp_dagster.cluster.db import ControlPlane

    control_plane = ControlPlane(database_url)
    control_plane.migrate()
    yield control_plane
    control_plane.close()
