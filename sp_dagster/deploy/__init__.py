"""The deploy path: parse, plan, create topics, record, wait; and undeploy."""

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
    "DeployError", "DeploymentState", "LoadedApp", "content_hash", "create_topics", "dead_letter_topic", "deploy",
    "deployment_state", "instance_specs", "load_app", "plan_app", "record", "undeploy", "wait_until_placed", "wait_until_running",
]
