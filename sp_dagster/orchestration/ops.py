"""The ops of the deploy, undeploy and rebalance jobs; each deploy op calls one deploy-path step.
Through a manager API the manager does the steps that touch the database and the brokers
(`record_deployment` hands it the app); an error a user can act on fails the op with its one-line
message, no traceback.
"""

import contextlib
import functools
import inspect
import time
from typing import Any

import dagster as dg
from pydantic import Field

from sp_dagster.deploy import steps
from sp_dagster.errors import SpDagsterError
from sp_dagster.orchestration.processes import reload_code_location
from sp_dagster.orchestration.resources import ControlPlaneResource, MessagingResource
from sp_dagster.siddhi.secrets import mask_secrets
from sp_dagster.wording import counted


def code_block(text: str) -> dg.MetadataValue:
    """SiddhiQL (or a plan) as a Markdown code block in Dagster metadata, its secrets masked."""
    return dg.MetadataValue.md(f"```\n{mask_secrets(text).rstrip()}\n```")


@contextlib.contextmanager
def user_errors():
    """Turn an sp-dagster error (a SiddhiQL mistake with its line and column, an unreachable broker, an instance that
    could not be placed) into a Dagster Failure carrying its one-line message, no traceback."""
    try:
        yield
    except SpDagsterError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from None


def with_resource_keys(fn, keys: dict[str, str]):
    """`fn` whose resource parameters take other names (Dagster binds resources by parameter name): {parameter: resource key}."""
    keys = {param: key for param, key in keys.items() if param != key}
    if not keys:
        return fn
    signature = inspect.signature(fn)
    renamed = [p.replace(name=keys.get(p.name, p.name)) for p in signature.parameters.values()]

    @functools.wraps(fn)
    def rekeyed(*args, **kwargs):
        for param, key in keys.items():
            if key in kwargs:
                kwargs[param] = kwargs.pop(key)
        return fn(*args, **kwargs)

    rekeyed.__signature__ = signature.replace(parameters=renamed)  # pyright: ignore[reportAttributeAccessIssue]  (what inspect.signature reads)
    return rekeyed


def rekeyed_op(op: dg.OpDefinition, keys: dict[str, str]) -> dg.OpDefinition:
    """The same op reading its resources under other keys ({parameter: resource key}); the op itself when none differ."""
    fn = op.compute_fn.decorated_fn
    if not set(keys) & set(inspect.signature(fn).parameters) or all(p == k for p, k in keys.items()):
        return op
    return dg.op(name=op.name, description=op.description, tags=op.tags)(with_resource_keys(fn, keys))


# -- deploy ---------------------------------------------------------------------------------


class LoadAppConfig(dg.Config):
    """Which app file to deploy."""

    path: str = Field(description="the .siddhi file")
    content_hash: str | None = Field(default=None, description="the hash the sensor saw; a warning if the file changed since")


@dg.op(description="Read, parse and validate the app; an invalid app fails here with the parser's line and column.")
def load_app(context: dg.OpExecutionContext, config: LoadAppConfig) -> steps.LoadedApp:
    """Deploy step 1: steps.load_app."""
    with user_errors():
        loaded = steps.load_app(config.path)
    if config.content_hash and config.content_hash != loaded.content_hash:
        context.log.warning(f"{config.path} changed since the sensor saw it; deploying its current text ({loaded.content_hash[:12]})")
    context.add_output_metadata({"app": loaded.name, "source": loaded.source, "content_hash": loaded.content_hash, "siddhi": code_block(loaded.text)})
    return loaded


class ScaleAppConfig(dg.Config):
    """Which group of which deployed app to run at how many instances."""

    app: str = Field(description="the deployed app's name (@App:name)")
    group: str = Field(description="the execution group (@dist(execGroup))")
    parallel: int = Field(description="how many instances it runs")


@dg.op(description="The deployed app's text with one group at a new parallelism (deploy.scaling), parsed and validated.")
def scale_app(context: dg.OpExecutionContext, config: ScaleAppConfig, control_plane: ControlPlaneResource) -> steps.LoadedApp:
    """Rescale step 1: deploy.scaling.scaled_app; the rest is the deploy job's."""
    import dataclasses

    from sp_dagster.deploy.scaling import scaled_app

    with user_errors():
        if (client := control_plane.client()) is not None:  # the manager rescales; the app's text comes back with its secrets masked
            for line in client.scale(config.app, config.group, config.parallel, wait=None)["lines"]:
                context.log.info(line)
            text = client.app(config.app)["siddhi"]
            loaded = dataclasses.replace(steps.load_app(text=text, source=f"{client.url} ({config.app})"), recorded=True)
        else:
            loaded = scaled_app(control_plane.plane, config.app, config.group, config.parallel, control_plane.config().deployment.max_parallelism)
    context.log.info(f"{config.app}: group {config.group} at {config.parallel} instances")
    context.add_output_metadata({"app": loaded.name, "group": config.group, "parallel": config.parallel, "content_hash": loaded.content_hash})
    return loaded


@dg.op(description="Split the app into execution groups, partial apps and topics.")
def plan_app(context: dg.OpExecutionContext, loaded: steps.LoadedApp, control_plane: ControlPlaneResource):
    """Deploy step 2: steps.plan_app, with the cluster's default room (deployment.config.maxParallelism)."""
    from sp_dagster.topology.output import render_text

    with user_errors():
        topology = steps.plan_app(loaded, control_plane.config().deployment.max_parallelism)
    context.add_output_metadata(
        {
            "groups": len(topology.groups),
            "partial_apps": len(topology.partial_apps),
            "topics": len(topology.topics),
            "plan": code_block(render_text(topology)),
        }
    )
    return topology


def check_state(context, plane, topology) -> list[str]:
    """steps.state_changes, each line in the run log (a rescale that would lose state raises DeployError)."""
    changes = steps.state_changes(plane, topology)
    for line in changes:
        context.log.info(f"state: {line}")
    return changes


@dg.op(
    description="Say what the deploy does to state (a rescale that would lose state silently is refused here, before any "
    "topic changes), then create every topic of the plan (and the dead-letter topic) with enough partitions."
)
def create_topics(context: dg.OpExecutionContext, topology, messaging: MessagingResource, control_plane: ControlPlaneResource) -> list[str]:
    """Deploy step 3: steps.state_changes, then steps.create_topics (through a manager API: the manager's, in the next step)."""
    if control_plane.client() is not None:
        context.log.info("the manager checks state and creates these topics when it records the deployment (next step)")
        context.add_output_metadata({"topics": dg.MetadataValue.json({t.name: t.partitions for t in topology.topics})})
        return [t.name for t in topology.topics]
    with user_errors():
        changes = check_state(context, control_plane.plane, topology)
        topics = steps.create_topics(topology, messaging.transport)
    context.add_output_metadata({"topics": dg.MetadataValue.json({t.name: t.partitions for t in topics}), "state": changes})
    return [t.name for t in topics]


@dg.op(description="Record the deployment (desired state) in the control plane; unchanged instances keep their placement.")
def record_deployment(context: dg.OpExecutionContext, loaded: steps.LoadedApp, topology, topics: list[str], control_plane: ControlPlaneResource) -> str:
    """Deploy step 4: steps.record (after the topics exist); through a manager API, the manager's deploy."""
    if (client := control_plane.client()) is not None:
        return _record_through(context, client, loaded)
    with user_errors():
        result = steps.record(control_plane.plane, loaded, topology)
    context.log.info(
        f"{result.app} generation {result.generation}: "
        + (
            f"{len(result.added)} added, {len(result.updated)} changed, {len(result.removed)} removed, {len(result.unchanged)} unchanged"
            if result.changed
            else "unchanged; nothing to do"
        )
    )
    context.add_output_metadata(
        {
            "app": result.app,
            "changed": result.changed,
            "generation": result.generation,
            "added": list(result.added),
            "updated": list(result.updated),
            "removed": list(result.removed),
        }
    )
    return result.app


def _record_through(context, client, loaded: steps.LoadedApp) -> str:
    """record_deployment through the manager API: its deploy (state check, topics, record), unless it recorded the app already."""
    with user_errors():
        if not loaded.recorded:
            answer = client.deploy(loaded.text, loaded.source, wait=None)
            for line in answer["lines"]:
                context.log.info(line)
        shown = client.app(loaded.name)
    context.log.info(f"{loaded.name} generation {shown['generation']}, recorded by the manager at {client.url}")
    context.add_output_metadata({"app": loaded.name, "generation": shown["generation"], "manager": client.url})
    return loaded.name


class WaitConfig(dg.Config):
    """How long to wait (default: from the deployment.yaml's dagster section)."""

    timeout: float | None = Field(default=None, description="seconds; default dagster.placementTimeout / runningTimeout")


def _wait(context, control_plane: ControlPlaneResource, app: str, step, timeout: float) -> steps.DeploymentState:
    with user_errors():
        state = step(control_plane, app, timeout, progress=lambda s: context.log.info(s.describe()))
    context.add_output_metadata({"status": state.status, "instances": dg.MetadataValue.md(_placement_table(state))})
    return state


def _placement_table(state: steps.DeploymentState) -> str:
    rows = ["| instance | group | worker | status |", "| --- | --- | --- | --- |"]
    rows += [f"| {i.instance} | {i.group} | {i.node or '-'} | {i.status}{': ' + i.detail if i.detail else ''} |" for i in state.instances]
    return "\n".join(rows)


@dg.op(description="Wait until the leader manager has placed every instance on a live worker (or say what waits and why).")
def wait_until_placed(context: dg.OpExecutionContext, app: str, config: WaitConfig, control_plane: ControlPlaneResource) -> str:
    """Deploy step 5 (the leader hands out the execution groups): steps.wait_until_placed."""
    timeout = config.timeout or control_plane.config().dagster.placement_timeout
    _wait(context, control_plane, app, steps.wait_until_placed, timeout)
    return app


@dg.op(description="Wait until every instance reports running on its worker.")
def wait_until_running(context: dg.OpExecutionContext, app: str, config: WaitConfig, control_plane: ControlPlaneResource) -> str:
    """Deploy step 6: steps.wait_until_running."""
    timeout = config.timeout or control_plane.config().dagster.running_timeout
    _wait(context, control_plane, app, steps.wait_until_running, timeout)
    return app


@dg.op(description="Ask the Dagster webserver to reload this code location, so the asset graph shows the change.")
def refresh_asset_graph(context: dg.OpExecutionContext, app: Any, control_plane: ControlPlaneResource) -> None:
    """Reload the code location (best effort: a webserver that does not answer is only a warning)."""
    origin = context.dagster_run.remote_job_origin
    if origin is None:
        context.log.info("not launched from a code location (in-process run): nothing to reload")
        return
    location = origin.repository_origin.code_location_origin.location_name
    settings = control_plane.config().dagster
    message = reload_code_location(settings.host, settings.port, location)
    if message.startswith("reloaded"):
        context.log.info(message)
    else:
        context.log.warning(f"{message} (the address is dagster.host/dagster.port in {control_plane.conf})")


# -- undeploy -------------------------------------------------------------------------------


class ResolveAppConfig(dg.Config):
    """Which deployment to remove: by app name, or the one deployed from a (deleted) file."""

    app: str | None = Field(default=None, description="the app's name (@App:name)")
    path: str | None = Field(default=None, description="the app file that was deleted (for the message)")
    content_hashes: list[str] = Field(default_factory=list, description="the file's known content hashes")


@dg.op(description="Find the deployment to remove: the named app, or the one whose recorded text came from the deleted file.")
def resolve_app(context: dg.OpExecutionContext, config: ResolveAppConfig, control_plane: ControlPlaneResource) -> str | None:
    """The app name to undeploy, or None when nothing recorded came from the file."""
    if config.app:
        return config.app
    with user_errors():
        deployments = control_plane.deployments()
    wanted = set(config.content_hashes)
    match = next((d for d in deployments if d["content_hash"] in wanted), None)
    if match is None:
        context.log.info(f"no deployment was made from {config.path or 'that file'} (it never deployed, or another file replaced it)")
        return None
    context.log.info(f"{config.path} held app {match['app']} (generation {match['generation']})")
    return match["app"]


class UndeployConfig(dg.Config):
    """Whether to delete the app's topics too."""

    delete_topics: bool = Field(default=False, description="also delete the app's topics and the events in them")


@dg.op(description="Remove the deployment; its workers stop its instances. Topics are kept unless delete_topics.")
def undeploy_app(
    context: dg.OpExecutionContext, app: str | None, config: UndeployConfig, control_plane: ControlPlaneResource, messaging: MessagingResource
) -> str | None:
    """Undeploy step: steps.undeploy."""
    if app is None:
        return None
    with user_errors():
        if (client := control_plane.client()) is not None:
            lines = client.undeploy(app, delete_topics=config.delete_topics)["lines"]
            context.log.info("\n".join(lines))
            context.add_output_metadata({"app": app, "manager": client.url, "said": lines})
            return app
        deleted = steps.undeploy(control_plane.plane, app, transport=messaging.transport if config.delete_topics else None, delete_topics=config.delete_topics)
    context.log.info(f"undeployed {app}" + (f"; deleted topics {', '.join(deleted)}" if deleted else "; its topics are kept"))
    context.add_output_metadata({"app": app, "deleted_topics": deleted})
    return app


# -- rebalance ------------------------------------------------------------------------------


@dg.op(description="Ask the leader manager to rebalance placements on its next pass (moving the fewest instances).")
def request_rebalance(context: dg.OpExecutionContext, control_plane: ControlPlaneResource) -> dict | None:
    """The placements before the request, or None when no leader is alive to act on it."""
    from sp_dagster.deploy.rebalance import request_rebalance as ask

    group = control_plane.group_id()
    with user_errors():
        client = control_plane.client()
        asked = client.rebalance() if client is not None else ask(control_plane.plane, group)
    if asked is None:
        context.log.warning(f"no live leader manager in group '{group}': nothing rebalances; start one with `sp-dagster manager`")
        return None
    before = asked["before"]
    context.log.info(f"asked leader {asked['leader']} (term {asked['term']}) to rebalance {counted(len(before), 'instance')}")
    return before


class ReportConfig(dg.Config):
    """How long to watch the placements after the request."""

    seconds: float | None = Field(default=None, description="default: three of the leader's polling intervals")


@dg.op(description="Watch the placements after the request and report which instances moved where.")
def report_rebalance(context: dg.OpExecutionContext, before: dict | None, config: ReportConfig, control_plane: ControlPlaneResource) -> None:
    """Compare placements before and after the leader's rebalancing pass, and name the moves still under way."""
    if before is None:
        return
    strategy = control_plane.config().cluster.strategy_config
    seconds = config.seconds or 3 * (strategy.event_polling_interval + strategy.heartbeat_interval) / 1000
    deadline, moved, moving = time.monotonic() + seconds, {}, {}
    with user_errors():
        while True:
            instances = [i for d in control_plane.status()["deployments"] for i in d["instances"]]
            moved = {i["instance"]: (before[i["instance"]], i["node"]) for i in instances if i["instance"] in before and i["node"] != before[i["instance"]]}
            # graceful moves still waiting for their owner's last checkpoint
            moving = {i["instance"]: (i["node"], i["moving_to"]) for i in instances if i.get("moving_to")}
            if time.monotonic() >= deadline:
                break
            time.sleep(0.5)
    lines = [f"{i}: {old or '-'} -> {new or '-'}" for i, (old, new) in sorted(moved.items())]
    lines += [f"{i}: {old} -> {new} (moving: its owner stops it with a last checkpoint first)" for i, (old, new) in sorted(moving.items())]
    said = f"{counted(len(moved), 'instance')} moved" + (f", {len(moving)} moving" if moving else "")
    context.log.info(said + (":\n" + "\n".join(lines) if lines else " (placements were balanced)"))
    context.add_output_metadata(
        {"moved": len(moved), "moving": len(moving), "moves": dg.MetadataValue.json({**dict(sorted(moved.items())), **dict(sorted(moving.items()))})}
    )
