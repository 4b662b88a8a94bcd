"""The deploy path: parse, plan, create topics, record, wait; and undeploy.
The package is callable as `deploy` itself, so the public `sp_dagster.deploy(...)` and this
package share one name:
    >>> import sp_dagster
    >>> config = sp_dagster.load_config()                              # doctest: +SKIP
    >>> result = sp_dagster.deploy("apps/stock-alerts.siddhi", config)   # doctest: +SKIP
    >>> result.app, [t.name for t in result.topics][:1]                 # doctest: +SKIP
    ('StockAlerts', ['StockAlerts.AveragePriceStream'])
"""

import sys
import types

from sp_dagster.deploy.steps import (
    DeployError,
    DeploymentState,
    LoadedApp,
    content_hash,
    create_topics,
    dead_letter_topic,
    deploy,
    deployment_state,
    instance_specs,
    load_app,
    plan_app,
    record,
    undeploy,
    wait_until_placed,
    wait_until_running,
)

__all__ = [
    "DeployError",
    "DeploymentState",
    "LoadedApp",
    "content_hash",
    "create_topics",
    "dead_letter_topic",
    "deploy",
    "deployment_state",
    "instance_specs",
    "load_app",
    "plan_app",
    "record",
    "undeploy",
    "wait_until_placed",
    "wait_until_running",
]


class _CallableModule(types.ModuleType):
    """This package, callable as `steps.deploy`."""

    def __call__(self, *args, **kwargs):
        """deploy(path, config, *, wait=True, timeout=120.0, progress=None): see steps.deploy."""
        return deploy(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
