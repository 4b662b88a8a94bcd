"""`output snapshot every T`: placeholder until the snapshot limiters land."""

from __future__ import annotations

from sp_dagster.engine.errors import app_error


def snapshot_limiter(query, period: int, scheduler):
    """The snapshot rate limiter for `query`."""
    raise app_error("output snapshot is not supported by the engine yet", query.query.rate)
