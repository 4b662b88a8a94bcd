"""The deploy path, one function per step; the CLI and the Dagster ops call the same ones.
Deploy is load_app -> plan_app -> create_topics -> record -> wait_until_running; undeploy removes.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sp_dagster.deploy.errors import DeployError
from sp_dagster.errors import TopicCannotGrow
from sp_dagster.siddhi import SiddhiQLError, ast, load
from sp_dagster.siddhi.transports import WIRE_FORMATS
from sp_dagster.siddhi.validate import read_text
from sp_dagster.topology import Topology, plan
from sp_dagster.wording import counted

log = logging.getLogger(__name__)

RUNNING = "running"


@dataclass(frozen=True)
class LoadedApp:
    """A parsed, validated and planned app with its source and content hash."""

    name: str
    text: str
    source: str
    content_hash: str
    app: ast.App
    topology: Topology
    recorded: bool = False  # the manager API recorded it already (a rescale through the API): later steps only report


@dataclass(frozen=True)
class InstanceState:
    """Where one instance is and how it runs, as the control plane has it."""

    instance: str
    group: str
    node: str | None
    status: str
    detail: str | None


@dataclass(frozen=True)
class DeploymentState:
    """A deployment's status, why it waits (if it does), and its instances."""

    app: str
    status: str
    waiting_reason: str | None
    instances: tuple[InstanceState, ...] = ()

    @property
    def running(self) -> bool:
        """Every instance reports running."""
        return bool(self.instances) and all(i.status == RUNNING for i in self.instances)

    def not_running(self) -> tuple[InstanceState, ...]:
        """The instances that do not run yet."""
        return tuple(i for i in self.instances if i.status != RUNNING)

    @classmethod
    def from_status(cls, entry: dict) -> DeploymentState:
        """One deployment of `cluster_status()` (the manager API's /api/status too) as a DeploymentState."""
        instances = tuple(
            InstanceState(i["instance"], i["group"], i["node"], i["status"], i["detail"] or (i.get("metrics") or {}).get("state_note"))
            for i in entry["instances"]
        )
        return cls(entry["app"], entry["status"], entry["waiting_reason"], instances)

    def describe(self) -> str:
        """A few lines saying what runs where and what does not, and why."""
        lines = [f"{self.app}: {self.status}" + (f" ({self.waiting_reason})" if self.waiting_reason else "")]
        for i in self.instances:
            where = f"on {i.node}" if i.node else "not placed"
            lines.append(f"  {i.instance:40} {i.status:9} {where}" + (f": {i.detail}" if i.detail else ""))
        return "\n".join(lines)


def content_hash(text: str) -> str:
    """The hash that identifies one version of an app's text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_app(path: str | Path | None = None, *, text: str | None = None, source: str | None = None) -> LoadedApp:
    """Read, parse, validate and plan an app: the one support check of validate, plan, deploy and the
    Dagster runs (SiddhiQLError naming the file, line and column when the app cannot be deployed)."""
    if text is None:
        if path is None:
            raise ValueError("load_app needs a path or text")
        try:
            text = read_text(path)
        except OSError as exc:
            raise DeployError(f"{path}: cannot be read: {exc.strerror}") from None
    source = source or (str(path) if path is not None else "<app>")
    app = load(text, source)
    name = app.name or (Path(path).stem if path is not None else "SiddhiApp")
    return LoadedApp(name, text, source, content_hash(text), app, _planned(app, name, text, source))


def _planned(app: ast.App, name: str, text: str, source: str, max_parallelism: int | None = None) -> Topology:
    try:
        return plan(app, name, max_parallelism=max_parallelism)
    except SiddhiQLError as exc:
        raise exc.attach(text, source) from None


def plan_app(loaded: LoadedApp, max_parallelism: int | None = None) -> Topology:
    """The app's execution groups, partial apps and topics; with the cluster's `deployment.config.maxParallelism`,
    groups running in parallel that name no maxParallel get that room (see topology.grouping.build_groups)."""
    if max_parallelism is None:
        return loaded.topology
    return _planned(loaded.app, loaded.name, loaded.text, loaded.source, max_parallelism)


def dead_letter_topic(app: str) -> str:
    """The topic where an app's undecodable events go, with the reason."""
    return f"{app}.deadletter"


def create_topics(topology: Topology, transport) -> list:
    """Make sure every topic of the plan (and the app's dead-letter topic) exists with enough partitions."""
    wanted = [(t.name, t.partitions) for t in topology.topics] + [(dead_letter_topic(topology.app), 1)]
    if not topology.create_topics:
        existing = transport.list_topics()
        missing = [name for name, _ in wanted if name not in existing]
        if missing:
            raise DeployError(
                f"{topology.app} disables topic creation (@App:transportChannelCreationEnabled('false')) "
                f"but these topics do not exist: {', '.join(missing)}; create them first"
            )
        return [existing[name] for name, _ in wanted]
    try:
        return [transport.ensure_topic(name, partitions) for name, partitions in wanted]
    except TopicCannotGrow as exc:
        raise DeployError(
            f"{exc}. Next time, leave the group room to grow: @dist(maxParallel='N') lays its topics out for N instances, "
            "and rescaling within N changes no topic"
        ) from None


def instance_specs(topology: Topology) -> list:
    """The control plane's view of every partial-app instance of a plan."""
    from sp_dagster.cluster.allocation import RECEIVER_TLS, RECEIVER_USERS, WIRE_FORMATS
    from sp_dagster.cluster.store.deployments import InstanceSpec
    from sp_dagster.siddhi.transports import basic_auth_streams, https_streams, wire_formats

    specs = []
    for group in topology.groups:
        for instance in group.instances:
            specs.append(
                InstanceSpec(
                    instance.name,
                    group.exec_group,
                    instance.index,
                    instance.siddhi,
                    receiver=group.receiver,
                    extra={
                        "group": group.name,
                        "dead_letter_topic": dead_letter_topic(topology.app),
                        **({"shard_id": instance.shard_id} if instance.shard_id else {}),
                        **({RECEIVER_USERS: True} if basic_auth_streams(instance.app) else {}),
                        **({RECEIVER_TLS: True} if https_streams(instance.app) else {}),
                        **({WIRE_FORMATS: wires} if (wires := wire_formats(instance.app)) else {}),
                    },
                )
            )
    return specs


def state_changes(plane, topology: Topology, *, fresh: bool = False) -> list[str]:
    """What a redeploy does to state: groups whose parallelism changes (DeployError when a stateful one
    would lose its state silently, unless `fresh`), and per changed instance the queries that keep theirs."""
    from sp_dagster.cluster.store.deployments import list_instances
    from sp_dagster.deploy.rescale import check_rescales, rescales
    from sp_dagster.engine.stateparts import carry_over

    check_wire_formats(plane, topology.app)
    found = rescales(plane, topology)
    lines = check_rescales(found, fresh=fresh)
    restarting = {r.group for r in found if not r.stateless}
    before = {i.instance_id: i.siddhi_app for i in list_instances(plane, topology.app)}
    for spec in instance_specs(topology):
        old = before.get(spec.instance_id)
        if old is not None and old != spec.siddhi_app and spec.extra["group"] not in restarting:
            lines.append(f"{spec.instance_id}: {carry_over(old, spec.siddhi_app).describe()}")
    return lines


def check_wire_formats(plane, app: str) -> None:
    """DeployError when the recorded deployment's topics hold a wire format this version cannot read
    (a newer sp-dagster recorded it): going on would dead-letter every event in them."""
    from sp_dagster.cluster.store.deployments import get_deployment

    recorded = get_deployment(plane, app)
    topics = (recorded.plan.get("topics") or []) if recorded is not None else []
    unknown = [(t["name"], t["wire"]) for t in topics if t.get("wire") not in (None, *WIRE_FORMATS)]
    if unknown:
        name, wire = unknown[0]
        raise DeployError(
            f"{app}: topic {name} holds events in wire format '{wire}', recorded by a newer sp-dagster, which this version "
            f"({', '.join(WIRE_FORMATS)}) cannot read: deploy with that version, or undeploy with --delete-topics first (their events are lost)"
        )


def record(plane, loaded: LoadedApp, topology: Topology, *, fresh: bool = False, timeout: float = 120.0):
    """Record the desired state; unchanged instances keep their placement and state. A keyed group whose
    parallelism changes moves its per-key state first; other stateful groups whose parallelism changes
    start empty when `fresh` (see deploy.rescale)."""
    from sp_dagster.cluster.store.deployments import list_instances, record_deployment
    from sp_dagster.deploy.rescale import move_state, rescales, state_specs
    from sp_dagster.topology.output import to_dict

    found = rescales(plane, topology)
    previous = {i.instance_id: i.extra for i in list_instances(plane, topology.app)}
    specs = instance_specs(topology)

    def record_specs(instances, content_hash=loaded.content_hash):
        return record_deployment(plane, topology.app, content_hash=content_hash, source=loaded.text, plan=to_dict(topology), instances=instances)

    # while state moves the recorded hash is not the app's: a deploy cut short is done again, not found unchanged
    moving = [r for r in found if r.stateless] if fresh else found  # fresh empties state, but never re-reads a partition
    move_state(plane, topology, state_specs(specs, [], previous, fresh=False), moving, lambda i: record_specs(i, f"rescaling:{loaded.content_hash}"), timeout)
    return record_specs(after_drops(plane, state_specs(specs, found, previous, fresh=fresh, since=int(time.time() * 1000))))


def after_drops(plane, specs: list) -> list:
    """The specs, each instance whose state was dropped (cluster.store.drops) starting empty since then."""
    import dataclasses

    from sp_dagster.cluster.store.drops import drop_times
    from sp_dagster.deploy.rescale import FRESH_SINCE

    dropped = drop_times(plane, [spec.instance_id for spec in specs])
    return [
        dataclasses.replace(spec, extra={**spec.extra, FRESH_SINCE: max(spec.extra.get(FRESH_SINCE) or 0, dropped[spec.instance_id])})
        if spec.instance_id in dropped
        else spec
        for spec in specs
    ]


def deployment_state(plane, app: str) -> DeploymentState:
    """The recorded status of a deployment and of each of its instances."""
    from sp_dagster.cluster.store.deployments import get_deployment, list_instances

    record_ = get_deployment(plane, app)
    if record_ is None:
        raise DeployError(f"no deployment named '{app}'; `sp-dagster status` lists the deployments")
    instances = tuple(
        InstanceState(i.instance_id, i.group, i.node_id, i.status, i.status_detail or i.metrics.get("state_note")) for i in list_instances(plane, app)
    )
    return DeploymentState(app, record_.status, record_.waiting_reason, instances)


def wait_until_running(
    plane,
    app: str,
    timeout: float = 120.0,
    *,
    progress: Callable[[DeploymentState], None] | None = None,
    poll: float = 0.5,
    check: Callable[[], None] | None = None,
) -> DeploymentState:
    """Poll until every instance reports running; DeployError saying what does not run when time is up.

    `plane` is a ControlPlane, or anything with a `deployment_state(app)` (Dagster's resource, through the manager API);
    `check`, called at every poll, may raise DeployError to stop waiting early."""
    return _wait(plane, app, timeout, progress, poll, DeploymentState.not_running, "not running", check)


def wait_until_placed(
    plane, app: str, timeout: float = 60.0, *, progress: Callable[[DeploymentState], None] | None = None, poll: float = 0.5
) -> DeploymentState:
    """Poll until the leader has placed every instance on a worker; DeployError saying what waits and why when time is up.

    `plane` is a ControlPlane, or anything with a `deployment_state(app)` (Dagster's resource, through the manager API)."""
    return _wait(plane, app, timeout, progress, poll, lambda state: tuple(i for i in state.instances if not i.node), "not placed")


def _wait(plane, app, timeout, progress, poll, pending, what, check=None) -> DeploymentState:
    """Poll until some instances exist and none is pending; DeployError on a failed instance or at the deadline."""
    read = getattr(plane, "deployment_state", None) or (lambda name: deployment_state(plane, name))
    deadline, last = time.monotonic() + timeout, None
    while True:
        state = read(app)
        if progress and state != last:
            progress(state)
        last = state
        if state.instances and not pending(state):
            return state
        failed = [i for i in state.instances if i.status == "failed"]
        if failed or time.monotonic() > deadline:
            why = "failed" if failed else f"{what} after {timeout:.0f}s"
            raise DeployError(f"{app}: {counted(len(pending(state)), 'instance')} {why}:\n{state.describe()}")
        if check:
            check()
        time.sleep(poll)


@dataclass
class DeployResult:
    """What a deploy did."""

    app: str
    topics: list = field(default_factory=list)
    changed: bool = True
    state: DeploymentState | None = None
    state_changes: list[str] = field(default_factory=list)

    def summary(self) -> list[str]:
        """What `sp-dagster deploy` prints when done: the topics, state changes and where the instances run."""
        lines = [f"deployed {self.app}" + ("" if self.changed else " (unchanged)") + f"; topics: {', '.join(t.name for t in self.topics)}"]
        lines += [f"  state: {line}" for line in self.state_changes]
        return lines + ([self.state.describe()] if self.state is not None else [])


def deploy(app: str | Path | LoadedApp, config, *, wait: bool = True, timeout: float = 120.0, progress=None, fresh: bool = False, check=None) -> DeployResult:
    """Parse (unless `app` is loaded already), plan, create topics, record, and (optionally) wait until
    every instance runs; `fresh`, `check`: see deploy.rescale and wait_until_running (example: the package's docstring)."""
    from sp_dagster.cluster.db import ControlPlane
    from sp_dagster.messaging import transport_for

    loaded = app if isinstance(app, LoadedApp) else load_app(app)
    topology = plan_app(loaded, config.deployment.max_parallelism)
    plane = ControlPlane.from_config(config)
    try:
        changes = state_changes(plane, topology, fresh=fresh)  # before the topics grow: a refused rescale changes nothing
        transport = transport_for(config.messaging)
        try:
            topics = create_topics(topology, transport)
        finally:
            transport.close()
        result = record(plane, loaded, topology, fresh=fresh, timeout=timeout)
        state = wait_until_running(plane, topology.app, timeout, progress=progress, check=check) if wait else deployment_state(plane, topology.app)
    finally:
        plane.close()
    return DeployResult(topology.app, topics, result.changed, state, changes)


def undeploy(plane, app: str, *, transport=None, delete_topics: bool = False) -> list[str]:
    """Remove a deployment (its workers stop its instances); delete its topics only when asked."""
    from sp_dagster.cluster.store.deployments import get_deployment, remove_deployment

    record_ = get_deployment(plane, app)
    if record_ is None:
        raise DeployError(f"no deployment named '{app}'; `sp-dagster status` lists the deployments")
    remove_deployment(plane, app)
    deleted = []
    if delete_topics and transport is not None:
        for topic in [t["name"] for t in record_.plan.get("topics", [])] + [dead_letter_topic(app)]:
            transport.delete_topic(topic)
            deleted.append(topic)
    return deleted
