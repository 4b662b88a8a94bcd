"""DeployError: a deployment that could not be made or did not come up in time."""

from __future__ import annotations

from sp_dagster.errors import SpDagsterError


class DeployError(SpDagsterError):
    """A deployment could not be made or did not come up in time."""
