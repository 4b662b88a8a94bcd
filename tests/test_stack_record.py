"""Commands find the stack `sp-dagster up` started (its record in $SP_DAGSTER_HOME/up.json); an unreachable broker is one quiet line."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sp_dagster.cli import build_parser
from sp_dagster.cli.options import load_role_config
from sp_dagster.config.locate import defaults_root
from sp_dagster.embedded.broker import free_port
from sp_dagster.orchestration.demo import down, new_stack

REPO = Path(__file__).resolve().parents[1]
PACKAGED = defaults_root() / "conf"
CLIENT_COMMANDS = (
    ["consume", "StockAlerts:AveragePriceStream"],
    ["produce", "StockAlerts:TradeStream"],
    ["deploy", str(REPO / "apps" / "stock-alerts.siddhi")],
)


def cli(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "sp_dagster.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def user(tmp_path, sp_home, monkeypatch) -> Path:
    """A user's directory with its own ./conf, and no SP_* variable naming a conf or an address."""
    for name in ("SP_DAGSTER_CONF", "SP_DAGSTER_WORKER_CONF", "SP_KAFKA_BOOTSTRAP", "SP_NATS_URL"):
        monkeypatch.delenv(name, raising=False)
    directory = tmp_path / "work"
    for role in ("manager", "worker"):
        (directory / "conf" / role).mkdir(parents=True)
        (directory / "conf" / role / "deployment.yaml").write_text((PACKAGED / role / "deployment.yaml").read_text())
    monkeypatch.chdir(directory)
    return directory


def record_stack(messaging: str, address: str, apps: Path) -> dict[str, str]:
    """Write the confs and the record as `sp-dagster up` does (it starts no process here); the confs it records."""
    sources = {role: str(Path("conf", role, "deployment.yaml").resolve()) for role in ("manager", "worker")}
    stack = new_stack(messaging, address, sources, apps, 3999)
    stack.save()
    return stack.facts["conf"]


def resolved(*argv: str):
    return load_role_config(build_parser().parse_args(list(argv)))


@pytest.fixture
def listening() -> Iterator[int]:
    """A port something accepts connections on (produce and consume check that first)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_commands_use_the_stack_up_recorded_until_down(user, sp_home, monkeypatch, listening):
    port = listening
    confs = record_stack("kafka", f"localhost:{port}", sp_home / "apps")
    for argv in CLIENT_COMMANDS:
        config = resolved(*argv)
        assert (config.source, config.messaging.servers) == (confs["manager"], (f"localhost:{port}",)), argv
        assert (config.dagster.app_repository, config.dagster.port) == (str(sp_home / "apps"), 3999)
    where = cli(user, "config", "where").stdout.splitlines()
    assert where[0] == f"manager  {confs['manager']} (from the stack `sp-dagster up` started, recorded in {sp_home / 'up.json'})"
    assert where[1].startswith(f"worker   {confs['worker']} (from the stack")
    assert where[2] == f"         kafka at localhost:{port}"

    # An explicit --conf, $SP_DAGSTER_CONF or an exported address still wins, and `config where` says the stack is passed over.
    given = resolved("deploy", "app.siddhi", "--conf", str(PACKAGED))
    assert (given.source, given.messaging.servers) == (str(PACKAGED / "manager" / "deployment.yaml"), ("localhost:9092",))
    explicit = cli(user, "config", "where", "--conf", str(PACKAGED)).stdout
    assert "(from --conf)" in explicit and f"note: the stack `sp-dagster up` started ({sp_home / 'up.json'}) is not used: --conf comes first" in explicit
    monkeypatch.setenv("SP_KAFKA_BOOTSTRAP", "elsewhere:9092")
    assert resolved("deploy", "app.siddhi").messaging.servers == ("elsewhere:9092",)
    monkeypatch.delenv("SP_KAFKA_BOOTSTRAP")

    assert down(say=lambda line: None) == 0
    assert not (sp_home / "up.json").exists()
    assert resolved("deploy", "app.siddhi").source == str(user / "conf" / "manager" / "deployment.yaml")


def test_down_names_the_nodes_it_did_not_start_that_still_run(user, sp_home, listening):
    from sp_dagster.cluster.db import ControlPlane
    from sp_dagster.cluster.membership import register_node
    from sp_dagster.config.loader import load_config

    confs = record_stack("kafka", f"localhost:{listening}", sp_home / "apps")
    with ControlPlane.from_config(load_config(confs["manager"])) as plane:
        register_node(plane, "worker-7", address="lab-3:9090", metrics={"fence_after_s": 60})  # restarted by hand, heartbeating
        register_node(plane, "worker-8", metrics={"fence_after_s": 0.01})  # silent: gone without a word
    time.sleep(0.05)
    said: list[str] = []
    assert down(say=said.append) == 0
    assert len(said) == 2 and said[0].startswith("worker-7     still running: not started by `up` (heartbeat ")
    assert said[0].endswith("at lab-3:9090); stop it where it runs (Ctrl-C, or kill its process)")
    assert said[1] == "sp-dagster is down, but for 1 node started by hand"


def test_down_stops_a_node_a_command_under_this_home_started_and_forgets_it(user, sp_home, listening):
    """As `sp-dagster worker` does (cli/worker.py): the node notes itself under the home while it runs."""
    record_stack("kafka", f"localhost:{listening}", sp_home / "apps")
    code = "import sys, time; from sp_dagster.orchestration.demo import registered_node\nwith registered_node('worker-5', 'worker'):\n    print('up', flush=True); time.sleep(600)"
    node = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env={**os.environ, "SP_DAGSTER_HOME": str(sp_home)})
    try:
        assert node.stdout is not None and node.stdout.readline().strip() == "up"
        assert (sp_home / "nodes" / "worker-5.json").is_file()
        said: list[str] = []
        assert down(say=said.append) == 1
        assert said == ["worker-5     stopped (started by `sp-dagster worker`)", "sp-dagster is down"]
        assert node.wait(10) is not None and not (sp_home / "nodes" / "worker-5.json").exists()
    finally:
        if node.poll() is None:
            node.kill()


def test_up_names_the_processes_of_a_running_stack_that_stopped(sp_home):
    from sp_dagster.orchestration.demo import Stack, up
    from sp_dagster.orchestration.errors import DemoError
    from sp_dagster.orchestration.processes import Detached, this_process

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    me = this_process("broker")
    assert me is not None
    stack = Stack(sp_home / "up.json", [me, Detached("worker-2", int(gone.stdout), "1", "/logs/worker-2.log", ())], {})
    stack.save()
    with pytest.raises(DemoError) as refused:
        up(demo=False, ui=False)
    assert str(refused.value) == (
        f"sp-dagster is up ({sp_home / 'up.json'}) but 1 process of it stopped: worker-2 (its log: /logs/worker-2.log); "
        "run `sp-dagster down`, then `sp-dagster up`"
    )


def test_a_nats_stack_is_where_deploy_goes(user, sp_home):
    confs = record_stack("nats", "nats://localhost:4333", sp_home / "apps")
    config = resolved("deploy", "app.siddhi")
    assert config.source == confs["manager"]
    assert (config.messaging.kind, config.messaging.servers) == ("nats", ("nats://localhost:4333",))
    assert "nats at nats://localhost:4333" in cli(user, "config", "where").stdout


@pytest.mark.parametrize("argv", CLIENT_COMMANDS, ids=lambda argv: argv[0])
def test_a_stack_that_is_gone_is_one_line_saying_what_to_do(user, sp_home, argv):
    record_stack("kafka", f"localhost:{free_port()}", sp_home / "apps")  # nothing listens there
    started = time.monotonic()
    result = cli(user, *argv)
    assert time.monotonic() - started < 8
    assert result.returncode == 1 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("error: cannot reach the Kafka broker at localhost:")
    assert line.endswith(f"the stack `sp-dagster up` started (recorded in {sp_home / 'up.json'}) is not running: run `sp-dagster down`, then `sp-dagster up`")


def test_a_kafka_client_of_a_command_logs_nothing_on_stderr(user, capfd):
    """A real client against a closed port: one error, and librdkafka's lines only in Python logging at debug."""
    from sp_dagster.errors import BrokerUnavailable
    from sp_dagster.messaging import transport_for

    port = free_port()
    config = resolved("undeploy", "App", "--conf", str(PACKAGED))  # undeploy checks no broker first
    config = dataclasses.replace(config, deployment=dataclasses.replace(config.deployment, bootstrap_urls=(f"localhost:{port}",)))
    transport = transport_for(config.messaging, timeout=2)
    try:
        with pytest.raises(BrokerUnavailable, match=f"cannot reach the Kafka broker at localhost:{port}"):
            transport.list_topics()
    finally:
        transport.close()
    assert "rdkafka" not in capfd.readouterr().err


def test_query_finds_a_deployed_app_through_the_stack_as_the_other_commands_do(user, sp_home, tmp_path):
    from sp_dagster.cluster.db import ControlPlane
    from sp_dagster.cluster.store.deployments import record_deployment
    from sp_dagster.config.loader import load_config
    from sp_dagster.deploy import instance_specs, load_app
    from sp_dagster.topology.output import to_dict

    confs = record_stack("kafka", f"localhost:{free_port()}", sp_home / "apps")
    path = tmp_path / "prices.siddhi"
    path.write_text(
        "@App:name('Prices')\ndefine stream In (symbol string, price double);\ndefine table Latest (symbol string, price double);\nfrom In insert into Latest;\n"
    )
    loaded = load_app(path)
    with ControlPlane.from_config(load_config(confs["manager"])) as plane:  # the stack's control plane; no broker needed
        plan = to_dict(loaded.topology)
        record_deployment(plane, "Prices", content_hash=loaded.content_hash, source=loaded.text, plan=plan, instances=instance_specs(loaded.topology))
    result = cli(user, "query", "Prices", "from Latest select symbol, price")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["symbol  price", "(0 rows)"]


def test_an_unreachable_server_with_credentials_is_named_without_them(user, tmp_path):
    port = free_port()
    conf = tmp_path / "nats.yaml"
    conf.write_text(f"deployment.config:\n  type: distributed\n  natsServerUrl: nats://app:s3cret@127.0.0.1:{port}\n  clusterId: c\n")
    result = cli(user, "consume", "App:In", "--conf", str(conf))
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: cannot reach the NATS server at nats://127.0.0.1:{port} (") and "s3cret" not in line
    assert "s3cret" not in cli(user, "config", "where", "--conf", str(conf)).stdout
