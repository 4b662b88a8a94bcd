"""The sp-dagster code location, loaded by `dagster dev` at the repository root through workspace.yaml.

Everything is built by `sp_dagster.orchestration` when Dagster loads the location (importing this
file connects to nothing): resources from conf/ ($SP_DAGSTER_CONF and $SP_DAGSTER_WORKER_CONF
override the two deployment.yaml files), the app-repository sensor, the deploy, undeploy,
rebalance, manager and worker jobs, and the partial apps of every recorded deployment as assets.
"""

import os
from pathlib import Path

import dagster as dg

from sp_dagster.orchestration.definitions import build_definitions

ROOT = Path(__file__).resolve().parent


@dg.definitions
def defs() -> dg.Definitions:
    """The code location, built when Dagster loads it."""
    return build_definitions(
        os.environ.get("SP_DAGSTER_CONF") or str(ROOT / "conf" / "manager" / "deployment.yaml"),
        os.environ.get("SP_DAGSTER_WORKER_CONF") or str(ROOT / "conf" / "worker" / "deployment.yaml"),
    )
