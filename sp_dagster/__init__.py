"""sp-dagster: distributed SiddhiQL streaming apps on Kafka and Spark, orchestrated by Dagster.
The public API is `parse`, `plan`, `AppRuntime`, `load_config`, `deploy` and the error classes
(every failure a user can act on is an `SpDagsterError`), each imported on first use so
`import sp_dagster` stays cheap; the Dagster building blocks are in `sp_dagster.dagster`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module that defines it
_EXPORTS = {
    "AppRuntime": "sp_dagster.engine.runtime",
    "parse": "sp_dagster.siddhi.parser",
    "plan": "sp_dagster.topology.planner",
    "deploy": "sp_dagster.deploy",  # the package itself, callable as steps.deploy
    "load_config": "sp_dagster.config.loader",
    "SpDagsterError": "sp_dagster.errors",
    "ConfigError": "sp_dagster.errors",
    "MessagingError": "sp_dagster.errors",
    "ControlPlaneError": "sp_dagster.errors",
    "SiddhiQLError": "sp_dagster.siddhi.errors",
    "TopologyError": "sp_dagster.topology.errors",
    "EngineError": "sp_dagster.engine.errors",
    "DeployError": "sp_dagster.deploy.errors",
}

__all__ = [  # every name _EXPORTS resolves, spelled out for type checkers
    "__version__",
    "AppRuntime",
    "parse",
    "plan",
    "deploy",
    "load_config",
    "SpDagsterError",
    "ConfigError",
    "MessagingError",
    "ControlPlaneError",
    "SiddhiQLError",
    "TopologyError",
    "EngineError",
    "DeployError",
]

if TYPE_CHECKING:  # what __getattr__ resolves, for type checkers (`X as X`: re-exported)
    __version__: str
    from sp_dagster import deploy as deploy
    from sp_dagster.config.loader import load_config as load_config
    from sp_dagster.deploy.errors import DeployError as DeployError
    from sp_dagster.engine.errors import EngineError as EngineError
    from sp_dagster.engine.runtime import AppRuntime as AppRuntime
    from sp_dagster.errors import ConfigError as ConfigError
    from sp_dagster.errors import ControlPlaneError as ControlPlaneError
    from sp_dagster.errors import MessagingError as MessagingError
    from sp_dagster.errors import SpDagsterError as SpDagsterError
    from sp_dagster.siddhi.errors import SiddhiQLError as SiddhiQLError
    from sp_dagster.siddhi.parser import parse as parse
    from sp_dagster.topology.errors import TopologyError as TopologyError
    from sp_dagster.topology.planner import plan as plan


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sp-dagster")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    """Import a public name on first use."""
    if name == "__version__":
        value = _version()
    elif name in _EXPORTS:
        module = importlib.import_module(_EXPORTS[name])
        value = module if name == "deploy" else getattr(module, name)
    else:
        raise AttributeError(f"module 'sp_dagster' has no attribute '{name}'")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
