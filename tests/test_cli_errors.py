"""Every subcommand, given a bad argument, file or connection, says so in one line on stderr: no traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sp_dagster.embedded.broker import free_port

REPO = Path(__file__).resolve().parents[1]
APP = """@App:name('Keyed')
define stream In (symbol string, price double);
@info(name = 'pass') @dist(execGroup = 'pass', parallel = '1')
from In select symbol, price insert into Out;
"""
BAD_CONF = "deployment.config:\n  type: distributed\n  heartbeatIntervall: 10\n"


def cli(cwd: Path, *args: str, stdin: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sp_dagster.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        input=stdin,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def taken_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


CASES = {
    "broker": (("broker", "--port", "{taken}"), "{taken}"),
    "nats": (("nats", "--port", "{taken}"), "{taken}"),
    "validate": (("validate", "missing.siddhi"), "missing.siddhi"),
    "plan": (("plan", "missing.siddhi"), "missing.siddhi"),
    "conformance": (("conformance", "missing.jsonl"), "missing.jsonl"),
    "run": (("run", "app.siddhi", "--input", "missing.jsonl"), "missing.jsonl"),
    "query": (("query", "missing.siddhi", "from T select *"), "missing.siddhi"),
    "manager": (("manager", "--conf", "bad.yaml"), "heartbeatIntervall"),
    "worker": (("worker", "--conf", "bad.yaml"), "heartbeatIntervall"),
    "status": (("status",), "start a manager first"),
    "deploy": (("deploy", "missing.siddhi"), "missing.siddhi"),
    "undeploy": (("undeploy", "Nothing"), "Nothing"),
    "produce": (("produce", "Nothing:In"), "Nothing"),
    "consume": (("consume", "NoColon"), "APP:STREAM"),
    "up": (("up", "--conf", "bad.yaml"), "heartbeatIntervall"),
    "down": (("down",), "up.json"),
    "config": (("config", "where", "--conf", "{taken}:not-a-path"), ""),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_bad_argument_file_or_connection_is_one_line(name, tmp_path, sp_home, taken_port):
    args, expected = CASES[name]
    (tmp_path / "app.siddhi").write_text(APP)
    (tmp_path / "bad.yaml").write_text(BAD_CONF)
    if name in ("produce", "undeploy"):  # a cluster exists (its schema too); the app does not
        from sp_dagster.cluster.db import ControlPlane
        from sp_dagster.config.loader import load_config
        from sp_dagster.config.locate import conf_path

        ControlPlane.from_config(load_config(conf_path("manager"))).close()
    if name == "down":
        sp_home.mkdir(parents=True, exist_ok=True)
        (sp_home / "up.json").write_text("{not json")
    env = {"SP_KAFKA_BOOTSTRAP": f"localhost:{free_port()}"}
    if name == "produce":  # a broker accepts connections (produce checks that first): the app is what is missing
        env["SP_KAFKA_BOOTSTRAP"] = f"localhost:{taken_port}"
    if name == "config":  # `config where` never fails; `config check` reports each file on stdout
        result = cli(tmp_path, "config", "check", "bad.yaml")
        assert result.returncode == 1 and result.stdout.startswith("FAIL bad.yaml:3:3") and not result.stderr
        return
    line = one_line(cli(tmp_path, *(a.format(taken=taken_port) for a in args), env=env))
    assert expected.format(taken=taken_port) in line


def deploy_keyed(tmp_path: Path, broker) -> dict:
    """Deploy APP on the broker; the environment that names it."""
    env = {"SP_KAFKA_BOOTSTRAP": broker.bootstrap_servers}
    (tmp_path / "app.siddhi").write_text(APP)
    deployed = cli(tmp_path, "deploy", "app.siddhi", "--no-wait", env=env)
    assert deployed.returncode == 0, deployed.stderr
    return env


@pytest.mark.broker
def test_produce_with_an_unknown_key_is_one_line(tmp_path, broker, sp_home):
    env = deploy_keyed(tmp_path, broker)
    line = one_line(cli(tmp_path, "produce", "Keyed:In", "--key", "typo", stdin='{"data": ["IBM", 1.0]}\n', env=env))
    assert "'typo'" in line and "symbol, price" in line


@pytest.mark.broker
def test_produce_names_the_line_over_the_message_limit_and_what_was_sent(tmp_path, broker, sp_home):
    env = deploy_keyed(tmp_path, broker)
    huge = '{"data": ["' + "x" * 2_000_000 + '", 3.0]}\n'
    lines = '{"data": ["IBM", 1.0]}\n{"data": ["ACME", 2.0]}\n' + huge + '{"data": ["LATE", 4.0]}\n'
    line = one_line(cli(tmp_path, "produce", "Keyed:In", stdin=lines, env=env))
    assert line.startswith("error: <stdin>:3: ") and f"this line is {len(huge)} bytes" in line, line
    assert "1000000-byte limit" in line and "message.max.bytes" in line and "the 2 events before it were" in line and "resume from line 3" in line, line
    consumed = cli(tmp_path, "consume", "Keyed:In", "--from-beginning", "--timeout", "3", env=env)
    assert [json.loads(e)["data"][0] for e in consumed.stdout.splitlines()] == ["IBM", "ACME"], consumed.stderr


def test_a_connection_lost_while_the_pool_resets_it_logs_no_traceback(tmp_path):
    # What SQLAlchemy's pool logs when a connection's reset fails because the database went away (a manager
    # during an outage): the CLI's logging keeps it off a node's log unless -v asks for details.
    script = (
        "import logging, sys\n"
        "from sp_dagster.cli import main\n"
        "main(['config', 'where'])\n"
        "try:\n"
        "    raise ConnectionResetError(104, 'Connection reset by peer')\n"
        "except ConnectionResetError:\n"
        "    logging.getLogger('sqlalchemy.pool.impl.QueuePool').error('Exception during reset or similar', exc_info=True)\n"
    )
    quiet = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    verbose = subprocess.run(
        [sys.executable, "-c", script.replace("main(['config', 'where'])", "main(['-v', 'config', 'where'])")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert "Exception during reset" not in quiet.stderr and "Traceback" not in quiet.stderr, quiet.stderr
    assert "Exception during reset" in verbose.stderr  # the details stay there for who asks
