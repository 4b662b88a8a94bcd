"""The sp-dagster code location, loaded by `dagster dev` at the repository root through workspace.yaml.

Everything is built by `sp_dagster.orchestration` when Dagster loads the location (importing this
file connects to nothing): resources from the configuration `sp-dagster config where` names
($SP_DAGSTER_CONF and $SP_DAGSTER_WORKER_CONF first, then ./conf/), the app-repository sensor,
the deploy, undeploy, rebalance, manager and worker jobs, and the partial apps of every
recorded deployment as assets.
"""

from sp_dagster.orchestration.definitions import defs

__all__ = ["defs"]
