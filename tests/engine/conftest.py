"""Fixtures of the engine tests: a fresh @store database on each backend."""

from __future__ import annotations

import pytest

from tests.fixtures.databases import BACKENDS
from tests.fixtures.stores import Store, store_for


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path) -> Store:
    """A fresh empty database on SQLite, MariaDB and PostgreSQL in turn, as @store sees it."""
    kind = request.param
    url = "" if kind == "sqlite" else request.getfixturevalue(f"{'postgres' if kind == 'postgresql' else kind}_url")
    return store_for(kind, url, tmp_path)
