"""`sp-dagster up` / `down`: the whole system on one machine, started and stopped with one command each.
`up` records what it starts in $SP_DAGSTER_HOME/up.json as it goes, so `down` stops exactly
those processes, even after a failed `up`, and every other command run with the same
$SP_DAGSTER_HOME and no --conf reaches the stack (config/locate.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sp_dagster.errors import SpDagsterError
from sp_dagster.orchestration.errors import DemoError
from sp_dagster.orchestration.processes import (
    Detached,
    alive,
    cli_command,
    start_detached,
    stop_detached,
    this_process,
    webserver_answers,
    webserver_command,
    workspace_yaml,
)
from sp_dagster.wording import counted

SAMPLE_APP = "stock-alerts.siddhi"
STOP_TIMEOUTS = {"generator": 10.0, "dagster": 30.0, "worker": 60.0, "manager": 15.0, "broker": 10.0}


def home() -> Path:
    """$SP_DAGSTER_HOME (default ~/.sp-dagster)."""
    from sp_dagster.config.yamlsource import default_home

    return Path(default_home()).expanduser().resolve()


def sample_repository() -> Path:
    """./apps when it holds the sample app; else $SP_DAGSTER_HOME/apps, given the packaged sample if it lacks one."""
    import shutil

    from sp_dagster.config.locate import defaults_root

    local = Path.cwd() / "apps"
    if (local / SAMPLE_APP).is_file():
        return local.resolve()
    apps = home() / "apps"
    if not (apps / SAMPLE_APP).is_file():
        apps.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(defaults_root() / "apps" / SAMPLE_APP, apps / SAMPLE_APP)
    return apps


@dataclass
class Stack:
    """What `up` started, as recorded in up.json."""

    path: Path
    processes: list[Detached] = field(default_factory=list)
    facts: dict = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Stack | None:
        """The recorded stack, or None when there is none."""
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            raise DemoError(f"{path} is not what `sp-dagster up` wrote ({exc}); stop its processes by hand, then delete it") from None
        return cls(path, [Detached.from_dict(p) for p in data.get("processes", [])], data.get("facts", {}))

    def save(self) -> None:
        """Write up.json (after every start, so a failed `up` can still be taken down)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = {"processes": [p.to_dict() for p in self.processes], "facts": self.facts}
        self.path.write_text(json.dumps(body, indent=2, sort_keys=True))

    def start(self, name: str, command: list[str], env: dict[str, str], cwd: str | None = None) -> Detached:
        """Start one detached process, logging to $SP_DAGSTER_HOME/logs/<name>.log, and record it."""
        process = start_detached(name, command, self.path.parent / "logs" / f"{name}.log", env=env, cwd=cwd)
        self.processes.append(process)
        self.save()
        return process


def _state_path() -> Path:
    return home() / "up.json"


def _wait(what: str, condition, timeout: float, processes: Sequence[Detached] = ()) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        for process in processes:
            if not alive(process):
                raise DemoError(f"{process.name} exited while waiting for {what}; see {process.log}")
        time.sleep(0.5)
    logs = ", ".join(p.log for p in processes)
    raise DemoError(f"timed out after {timeout:.0f} s waiting for {what}" + (f"; see {logs}" if logs else ""))


def _cluster(conf: str) -> dict | None:
    """The cluster status, or None while there is none yet."""
    from sp_dagster.cluster.db import ControlPlane
    from sp_dagster.cluster.status import cluster_status
    from sp_dagster.config.loader import load_config

    try:
        with ControlPlane.from_config(load_config(conf), migrate=False) as plane:
            return cluster_status(plane)
    except SpDagsterError:
        return None


def up(
    *,
    workers: int = 2,
    ui: bool = True,
    demo: bool = True,
    port: int | None = None,
    broker_port: int | None = None,
    conf: str | None = None,
    worker_conf: str | None = None,
    timeout: float = 300.0,
    messaging: str = "kafka",
    receivers: int = 0,
    say=print,
) -> Stack:
    """Bring the system up; on failure, stop what was started and raise DemoError.

    Starts, each as a detached process with its log under $SP_DAGSTER_HOME/logs: the embedded broker, a manager,
    `workers` workers, `receivers` receiver nodes and (with `ui`) `dagster dev` with DAGSTER_HOME under
    $SP_DAGSTER_HOME/dagster; the control plane is the SQLite file the shipped confs name. With `demo` it deploys
    the sample app through the same deploy path as `sp-dagster deploy`, waits until every instance runs, and starts
    the event generator. The processes read the copies of the confs that `new_stack` writes under
    $SP_DAGSTER_HOME/up-conf (naming the broker's address, the apps folder and a given `port`); up.json records them
    (facts.conf).
    """
    from sp_dagster.config.loader import load_config
    from sp_dagster.config.locate import find_conf
    from sp_dagster.embedded.broker import EmbeddedBroker, free_port, port_open
    from sp_dagster.embedded.nats_server import EmbeddedNatsServer

    path = _state_path()
    existing = Stack.load(path)
    if existing and any(alive(p) for p in existing.processes):
        dead = [p for p in existing.processes if not alive(p)]
        if dead:
            logs = ", ".join(f"{p.name} (its log: {p.log})" for p in dead)
            raise DemoError(
                f"sp-dagster is up ({path}) but {counted(len(dead), 'process', 'processes')} of it stopped: {logs}; run `sp-dagster down`, then `sp-dagster up`"
            )
        raise DemoError(f"sp-dagster is already up ({path}); run `sp-dagster down` first")
    # The confs the stack's copies derive from: never an earlier stack's copies.
    sources = {role: str(find_conf(role, given, stack=False).path) for role, given in (("manager", conf), ("worker", worker_conf))}
    sp_home = home()
    if not demo:
        apps = sp_home / "apps"  # an empty repository: the sensor deploys nothing on its own
        apps.mkdir(parents=True, exist_ok=True)
    else:
        apps = sample_repository()
    layer = MESSAGING[messaging]
    broker_port = broker_port or layer.port
    if port_open("127.0.0.1", broker_port):
        free = free_port()
        say(f"port {broker_port} is taken; the embedded {layer.what} listens on {free} instead (the stack's confs name it)")
        broker_port = free
    address = layer.address(broker_port)
    stack = new_stack(messaging, address, sources, apps, port)
    confs: dict[str, str] = stack.facts["conf"]
    manager_conf, workers_conf = confs["manager"], confs["worker"]
    env = {
        "SP_DAGSTER_HOME": str(sp_home),
        layer.variable: address,
        "SP_DAGSTER_APPS": str(apps),
        "SP_DAGSTER_CONF": manager_conf,
        "SP_DAGSTER_WORKER_CONF": workers_conf,
        "DAGSTER_HOME": str(sp_home / "dagster"),
    }
    if port:
        env["SP_DAGSTER_PORT"] = str(port)  # the shipped manager conf reads dagster.port from it
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # this process reads the same confs as its children
    stack.facts["env"] = env
    try:
        config = load_config(manager_conf)
        settings = config.dagster
        if port and port != settings.port:
            say(f"note: {manager_conf} sets dagster.port {settings.port}; deploy runs reload the UI there, not on {port}")
        port = port or settings.port
        stack.facts.update(control_plane=config.control_plane.safe_url, ui=f"http://{settings.host}:{port}" if ui else None, ui_port=port if ui else None)
        stack.save()
        server_class = EmbeddedNatsServer if messaging == "nats" else EmbeddedBroker
        broker = stack.start("broker", cli_command(layer.command, "--port", str(broker_port)), env)
        _wait(f"the {layer.what} on port {broker_port}", lambda: _broker_ready(server_class, broker_port), 30, [broker])
        say(f"broker       {address} ({layer.what}; the stack's confs: {Path(manager_conf).parent.parent})")
        manager = stack.start("manager-1", cli_command("manager", "--conf", manager_conf, "--id", "manager-1"), env)
        nodes = [stack.start(f"worker-{n}", cli_command("worker", "--conf", workers_conf, "--id", f"worker-{n}"), env) for n in range(1, workers + 1)]
        if receivers:  # receiver nodes host the apps' HTTP receivers (without any, workers do)
            node_conf = receiver_conf(workers_conf, sp_home / "receiver-conf" / "deployment.yaml")
            nodes += [stack.start(f"receiver-{n}", cli_command("worker", "--conf", node_conf, "--id", f"receiver-{n}"), env) for n in range(1, receivers + 1)]
        max_age_ms = config.deployment.heartbeat_interval * config.deployment.heartbeat_max_retry
        names = [p.name for p in nodes]
        _wait("a leader manager and every worker", lambda: _ready(manager_conf, names, max_age_ms), timeout, [manager, *nodes])
        say(f"manager      manager-1 (leader); workers {', '.join(p.name for p in nodes)}; control plane {stack.facts['control_plane']}")
        if ui:
            dagster_home = sp_home / "dagster"
            dagster_home.mkdir(parents=True, exist_ok=True)
            if not (dagster_home / "dagster.yaml").exists():
                (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
            workspace = dagster_home / "workspace.yaml"
            workspace.write_text(workspace_yaml(str(Path.cwd())))
        if demo:
            _deploy_sample(stack, apps / SAMPLE_APP, config, say)
        if ui:
            server = stack.start("dagster", webserver_command(workspace, settings.host, port), env)
            _wait(f"the Dagster UI at {stack.facts['ui']}", lambda: webserver_answers(stack.facts["ui"]), timeout, [server])
            say(f"Dagster UI   {stack.facts['ui']} (DAGSTER_HOME {dagster_home})")
        if demo:
            state = _wait_running(config, stack.facts["app"], timeout)
            say(f"app          {state.app}: {len(state.instances)} instances running")
            for instance, note in _state_notes(config, state.app).items():
                say(f"             {instance}: {note}")
            generator = stack.start("generator", [sys.executable, "-m", "sp_dagster.orchestration.generator", "--conf", manager_conf, "--app", state.app], env)
            time.sleep(2)
            if not alive(generator):
                raise DemoError(f"the event generator exited at once; see {generator.log}")
    except BaseException:
        down(say=lambda *_: None)
        raise
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    say(summary(stack))
    return stack


@dataclass(frozen=True)
class Layer:
    """How `up` runs one messaging layer's embedded server."""

    what: str
    command: str  # the sp-dagster command that runs it
    port: int
    variable: str  # the environment variable the confs read its address from
    scheme: str = ""
    setting: str = "bootstrapURLs"  # the deployment.config key naming it

    def address(self, port: int) -> str:
        """The server's address as the confs take it."""
        return f"{self.scheme}localhost:{port}"


MESSAGING = {
    "kafka": Layer("broker", "broker", 9092, "SP_KAFKA_BOOTSTRAP"),
    "nats": Layer("NATS server", "nats", 4222, "SP_NATS_URL", "nats://", "natsServerUrl"),
}


def new_stack(messaging: str, address: str, sources: dict[str, str], apps: Path, port: int | None = None) -> Stack:
    """The record of a new stack (not saved yet), with the copies of each role's conf in `sources` it runs on, written under $SP_DAGSTER_HOME/up-conf."""
    from sp_dagster.config.locate import CONF_FILE

    layer, directory = MESSAGING[messaging], home() / "up-conf"  # not conf/: that is a later step of the search order
    confs = {role: stack_conf(source, directory / role / CONF_FILE, layer, address, apps, port) for role, source in sources.items()}
    # facts.conf is what the search order reads (config/locate.py); the rest says what runs where.
    facts = {"bootstrap": address, "messaging": messaging, "conf": confs, "conf_sources": dict(sources), "apps": str(apps)}
    return Stack(_state_path(), facts=facts)


def stack_conf(source: str, target: Path, layer: Layer, address: str, apps: Path, port: int | None = None) -> str:
    """Write the stack's copy of a deployment.yaml: its messaging layer at `address` (an exported ${VARIABLE} still wins), its apps folder and UI port."""

    def change(document: dict) -> None:
        deployment = document.setdefault("deployment.config", {})
        if layer.command == "nats":  # the shipped confs name Kafka
            _name_nats(deployment)
        deployment[layer.setting] = f"${{{layer.variable}:-{address}}}"
        if isinstance(document.get("dagster"), dict):
            document["dagster"]["appRepository"] = f"${{SP_DAGSTER_APPS:-{apps}}}"
            if port:
                document["dagster"]["port"] = f"${{SP_DAGSTER_PORT:-{port}}}"

    return _derived_conf(source, target, f"for its {layer.what} at {address}", change)


def nats_conf(source: str, target: Path) -> str:
    """Write a copy of a deployment.yaml that names NATS ($SP_NATS_URL, clusterId) instead of Kafka; returns its path."""
    return _derived_conf(source, target, "with NATS instead of Kafka", lambda document: _name_nats(document.setdefault("deployment.config", {})))


def _name_nats(deployment: dict) -> None:
    """Make a deployment.config section name NATS ($SP_NATS_URL, clusterId) instead of Kafka."""
    from sp_dagster.config.model import NATS_APP_CREATOR

    for key in ("bootstrapURLs", "kafkaProperties", "zooKeeperURLs", "zooKeeperConfig"):
        deployment.pop(key, None)
    deployment["natsServerUrl"] = "${SP_NATS_URL:-nats://localhost:4222}"
    deployment["clusterId"] = deployment.get("clusterId") or "sp-dagster"
    deployment["appCreatorClass"] = NATS_APP_CREATOR


def receiver_conf(source: str, target: Path) -> str:
    """Write a copy of a worker's deployment.yaml for a receiver node (isReceiverNode: true); returns its path."""
    return _derived_conf(source, target, "for a receiver node", lambda document: document.setdefault("deployment.config", {}).update(isReceiverNode=True))


def _derived_conf(source: str, target: Path, what: str, change) -> str:
    import yaml

    document = yaml.safe_load(Path(source).read_text()) or {}
    change(document)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"# Written by `sp-dagster up` from {source}, {what}.\n" + yaml.safe_dump(document, sort_keys=False))
    return str(target)


def _broker_ready(broker_class, port: int) -> bool:
    try:
        broker_class(port=port).wait_ready(2)
        return True
    except SpDagsterError:
        return False


def _ready(conf: str, names: list[str], max_age_ms: int) -> bool:
    """A live leader, and each named worker alive with a fresh heartbeat (not a row left from an earlier run)."""
    status = _cluster(conf)
    if not status or not (status["leader"] and status["leader"]["alive"]):
        return False
    fresh = {n["node"] for n in status["nodes"] if n["state"] == "alive" and n["last_heartbeat_ago_ms"] < max_age_ms}
    return fresh >= set(names)


def _deploy_sample(stack: Stack, path: Path, config, say) -> None:
    """Record the sample app through the deploy path (the sensor later finds it unchanged)."""
    from sp_dagster.deploy import deploy

    result = deploy(path, config, wait=False)
    stack.facts["app"] = result.app
    stack.save()
    say(f"deployed     {result.app} from {path} (topics {', '.join(t.name for t in result.topics)})")


def _wait_running(config, app: str, timeout: float):
    from sp_dagster.cluster.db import ControlPlane
    from sp_dagster.deploy import DeployError, wait_until_running

    try:
        with ControlPlane.from_config(config) as plane:
            return wait_until_running(plane, app, timeout)
    except DeployError as exc:
        raise DemoError(f"{exc}\nthe workers' logs are in {home() / 'logs'}") from None


def _state_notes(config, app: str, timeout: float = 15.0) -> dict[str, str]:
    """What running instances say about the state they started with (a reset, a partial restore), once each has reported."""
    from sp_dagster.cluster.db import ControlPlane
    from sp_dagster.cluster.store.deployments import list_instances

    deadline = time.monotonic() + timeout
    with ControlPlane.from_config(config) as plane:
        while True:
            instances = list_instances(plane, app)
            if all(i.metrics for i in instances) or time.monotonic() > deadline:
                return {i.instance_id: i.metrics["state_note"] for i in instances if i.metrics.get("state_note")}
            time.sleep(0.5)


def summary(stack: Stack) -> str:
    """Where to look, once everything runs."""
    facts, logs = stack.facts, home() / "logs"
    lines = ["", "sp-dagster is up. Where to look:"]
    if facts.get("ui"):
        lines += [
            f"  {facts['ui']}/assets                 partial apps and topics as assets (lineage: topic -> partial app -> topic)",
            f"  {facts['ui']}/runs                   deploy runs started by the app-repository sensor",
            f"  {facts['ui']}/overview/automation    the app-repository sensor, rebalance and health schedules",
        ]
    lines += [
        "  sp-dagster status                     leader, workers and where each instance runs",
    ]
    if facts.get("app"):
        consume = f"sp-dagster consume {facts['app']}"
        lines += [f"  {consume}:AveragePriceStream   the averages, live", f"  {consume}:PriceAlertStream     the alerts"]
    lines += [
        f"  {logs}/                 every process's log",
        f"Deploy an app: drop a .siddhi file into {facts['apps']} (the app repository the sensor watches), or sp-dagster deploy APP.siddhi."
        if facts.get("ui")
        else "Deploy an app: sp-dagster deploy APP.siddhi (with --no-ui no sensor watches an app repository).",
        f"Commands run with SP_DAGSTER_HOME={home()} and no --conf use this stack's confs (sp-dagster config where).",
        "Stop everything: sp-dagster down",
    ]
    return "\n".join(lines)


def down(*, say=print) -> int:
    """Stop what `up` started, newest first; returns how many processes were running.

    up.json names each process by pid and start time, so only those processes are signalled."""
    path = _state_path()
    stack = Stack.load(path)
    if stack is None:
        say("nothing to stop: sp-dagster is not up (no up.json)")
        return 0
    running = 0
    for process in reversed(stack.processes):
        kind = process.name.split("-")[0]
        result = stop_detached(process, STOP_TIMEOUTS.get(kind, 30.0))
        running += result != "not running"
        say(f"{process.name:12} {result}")
    path.unlink(missing_ok=True)
    for kind, process, record in _registered_nodes():  # started by a command under this home, not by `up`
        result = stop_detached(process, STOP_TIMEOUTS.get(kind, 30.0), own_group=False)
        running += result != "not running"
        say(f"{process.name:12} {result} (started by `sp-dagster {kind}`)")
        record.unlink(missing_ok=True)
    others = _nodes_left_running(stack)
    for node in others:
        say(
            f"{node['node']:12} still running: not started by `up` (heartbeat {node['last_heartbeat_ago_ms'] / 1000:.1f} s ago, "
            f"at {node['address']}); stop it where it runs (Ctrl-C, or kill its process)"
        )
    say("sp-dagster is down" + (f", but for {counted(len(others), 'node')} started by hand" if others else ""))
    return running


NODES_DIR = "nodes"  # $SP_DAGSTER_HOME/nodes/<id>.json: a node a command started under this home, while it runs


@contextlib.contextmanager
def registered_node(node_id: str, kind: str) -> Iterator[None]:
    """Note this process (a `manager` or `worker` command) under $SP_DAGSTER_HOME/nodes/ while it runs, so `down` stops it with the stack."""
    me, path = this_process(node_id), home() / NODES_DIR / f"{node_id}.json"
    try:
        if me is not None:  # None without /proc: the node runs, `down` only names it
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"kind": kind, **me.to_dict()}))
    except OSError:  # a home that cannot be written: the same
        me = None
    try:
        yield
    finally:
        if me is not None:
            path.unlink(missing_ok=True)


def _registered_nodes() -> list[tuple[str, Detached, Path]]:
    """(kind, process, record) of every node a command under this home started that still runs (stale records are removed)."""
    found = []
    for path in sorted((home() / NODES_DIR).glob("*.json")):
        try:
            data = json.loads(path.read_text())
            process = Detached.from_dict(data)
        except (OSError, ValueError, KeyError):
            continue
        if alive(process):
            found.append((data.get("kind", "worker"), process, path))
        else:
            path.unlink(missing_ok=True)
    return found


def _nodes_left_running(stack: Stack) -> list[dict]:
    """The stack's nodes `up` did not start that still heartbeat (a worker restarted by hand, say)."""
    conf = (stack.facts.get("conf") or {}).get("manager")
    status = _cluster(conf) if conf else None
    if status is None:
        return []
    started = {process.name for process in stack.processes}
    return [n for n in status["nodes"] if n["state"] == "alive" and not n["silent"] and n["node"] not in started]
