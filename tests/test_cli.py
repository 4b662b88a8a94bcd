"""The `sp-dagster` command line as a user runs it: help, config check, the embedded broker."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sp_dagster.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_help_lists_subcommands():
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("config", "broker"):
        assert command in result.stdout


@pytest.mark.parametrize("command", [("config", "check"), ("broker",)])
def test_every_subcommand_has_help(command):
    result = run_cli(*command, "--help")
    assert result.returncode == 0 and "usage: sp-dagster" in result.stdout


def test_config_check_ok_and_fail(tmp_path):
    bad = tmp_path / "deployment.yaml"
    bad.write_text("deployment.config:\n  type: distributed\n  bootstrapUrls: localhost:9092\n")
    result = run_cli("config", "check", "conf/manager/deployment.yaml", "conf/worker/deployment.yaml", str(bad))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("OK   conf/manager/deployment.yaml (manager 'manager-1'")
    assert lines[1].startswith("OK   conf/worker/deployment.yaml (worker 'worker-1'")
    assert lines[2] == f"FAIL {bad}:3:3: deployment.config.bootstrapUrls: unknown key 'bootstrapUrls'; did you mean 'bootstrapURLs'?"
    assert "Traceback" not in result.stderr


def test_config_check_names_a_managers_file_a_manager(tmp_path):
    """By the file's name or directory, else by the sections only a manager's (or a worker's) file has."""
    manager, base = (ROOT / "conf/manager/deployment.yaml").read_text(), tmp_path / "x" / "y"  # no role in the names above
    (base / "plain").mkdir(parents=True)
    (base / "manager-deployment.yaml").write_text(manager)
    (base / "plain" / "deployment.yaml").write_text(manager)
    (base / "deployment.yaml").write_text((ROOT / "conf/worker/deployment.yaml").read_text())
    files = [str(base / "manager-deployment.yaml"), str(base / "plain" / "deployment.yaml"), str(base / "deployment.yaml")]
    result = run_cli("config", "check", *files)
    assert result.returncode == 0, result.stdout + result.stderr
    roles = [line.split("(", 1)[1].split()[0] for line in result.stdout.splitlines()]
    assert roles == ["manager", "manager", "worker"]


def test_config_check_loads_a_workers_receiver_certificate(tmp_path):
    worker = (ROOT / "conf/worker/deployment.yaml").read_text()
    conf = tmp_path / "worker.yaml"
    conf.write_text(
        worker.replace("deployment.config:\n", f"deployment.config:\n  receiverTls: {{certFile: {tmp_path / 'r.crt'}, keyFile: {tmp_path / 'r.key'}}}\n", 1)
    )
    result = run_cli("config", "check", str(conf))
    assert result.returncode == 1
    assert result.stdout.startswith(f"FAIL {conf}: deployment.config.receiverTls: cannot load certFile {tmp_path / 'r.crt'}"), result.stdout
    assert "Traceback" not in result.stderr


def test_config_check_all_good_exits_zero():
    result = run_cli("config", "check", "conf/worker/deployment.yaml")
    assert result.returncode == 0 and result.stdout.startswith("OK")


@pytest.mark.slow
@pytest.mark.broker
def test_broker_command_serves_a_kafka_client(tmp_path):
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from sp_dagster.embedded import free_port

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "sp_dagster.cli", "broker", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    try:
        lines = [process.stdout.readline() for _ in range(2)]
        assert any(f"broker ready at 127.0.0.1:{port}" in line for line in lines), lines
        servers = f"127.0.0.1:{port}"
        admin = AdminClient({"bootstrap.servers": servers})
        admin.create_topics([NewTopic("cli.check", num_partitions=1)])["cli.check"].result(10)
        producer = Producer({"bootstrap.servers": servers})
        producer.produce("cli.check", b"hello", partition=0)
        assert producer.flush(10) == 0
        consumer = Consumer({"bootstrap.servers": servers, "group.id": "cli-check"})
        consumer.assign([TopicPartition("cli.check", 0, 0)])
        message, deadline = None, time.monotonic() + 15
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
        consumer.close()
        assert message is not None and message.value() == b"hello"
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=20)
    assert process.returncode == 0 and "broker stopped" in output
    from sp_dagster.embedded import port_open

    assert not port_open("127.0.0.1", port)


def test_broker_command_refuses_a_busy_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = run_cli("broker", "--port", str(port))
    assert result.returncode == 1
    assert f"error: port {port} on 127.0.0.1 is already in use" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [["run", "{path}", "--input", "-"], ["query", "{path}", "from T select a"]])
def test_a_missing_app_file_is_one_line_naming_it(tmp_path, command):
    path = tmp_path / "missing.siddhi"
    result = run_cli(*[part.format(path=path) for part in command])
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: {path}: No such file or directory"
