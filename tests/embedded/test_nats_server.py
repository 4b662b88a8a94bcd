"""The embedded NATS server, `up --messaging nats`'s confs, and produce/consume/deploy against NATS from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from sp_dagster.embedded import EmbeddedNatsServer, port_open
from sp_dagster.embedded.local_cluster import LocalCluster
from sp_dagster.messaging.nats import NatsTransport

pytestmark = pytest.mark.nats

APP = """@App:name('{name}')
define stream In (id int, msg string);

@sink(type = 'kafka', topic = '{name}.Out', @map(type = 'json'))
define stream Out (id int, msg string);

@info(name = 'evens') @dist(execGroup = 'filter', parallel = '2')
from In[id % 2 == 0]
select id, msg
insert into Out;
"""


def test_start_keeps_jetstream_under_the_home_and_stop_frees_the_port(sp_home):
    server = EmbeddedNatsServer().start()
    try:
        assert server.store_dir == sp_home / "nats"
        transport = NatsTransport(server.url, "life", timeout=5)
        transport.ensure_topic("life.cycle", 2)
        transport.close()
        assert (sp_home / "nats" / "jetstream").is_dir()
    finally:
        server.stop()
    assert not port_open(server.host, server.port)


def test_up_derives_confs_that_name_nats(sp_home, monkeypatch):
    from sp_dagster.config.loader import load_config
    from sp_dagster.config.locate import conf_path
    from sp_dagster.orchestration.demo import nats_conf

    monkeypatch.setenv("SP_NATS_URL", "nats://localhost:4999")
    for role in ("manager", "worker"):
        path = nats_conf(conf_path(role), sp_home / "conf" / role / "deployment.yaml")
        config = load_config(path, role=role)
        assert (config.messaging.kind, config.messaging.servers, config.messaging.cluster_id) == ("nats", ("nats://localhost:4999",), "sp-dagster")


def test_deploy_produce_consume_and_undeploy_on_nats(nats_server, tmp_path):
    name = f"Echo{uuid.uuid4().hex[:6]}"
    cluster = LocalCluster(tmp_path / "cluster", nats_server.url, workers=0, messaging="nats", cluster_id=f"cli-{name}")
    app = tmp_path / "echo.siddhi"
    app.write_text(APP.format(name=name))

    def cli(*args, stdin=None):
        return subprocess.run(
            [sys.executable, "-m", "sp_dagster.cli", *args, "--conf", str(cluster.manager_conf)],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            env=cluster.env,
        )

    deployed = cli("deploy", str(app), "--no-wait")
    assert deployed.returncode == 0, deployed.stderr + deployed.stdout
    transport = NatsTransport(nats_server.url, f"cli-{name}", timeout=10)
    try:
        assert transport.topic_info(f"{name}.In").partitions == 2  # sized to its widest reader
        events = "\n".join(json.dumps({"data": {"id": i, "msg": f"m{i}"}, "timestamp": 5000 + i}) for i in range(4))
        produced = cli("produce", f"{name}:In", stdin=events)
        assert produced.returncode == 0 and f"sent 4 events to {name}.In" in produced.stderr, produced.stderr
        consumed = cli("consume", f"{name}:In", "--from-beginning", "--count", "4", "--timeout", "30")
        assert consumed.returncode == 0, consumed.stderr
        lines = sorted((json.loads(line) for line in consumed.stdout.splitlines()), key=lambda line: line["timestamp"])
        assert lines == [{"stream": "In", "data": [i, f"m{i}"], "timestamp": 5000 + i} for i in range(4)]
        removed = cli("undeploy", name, "--delete-topics")
        assert removed.returncode == 0 and "deleted topics" in removed.stdout, removed.stderr
        assert transport.list_topics() == {}
    finally:
        transport.close()


def test_the_nats_command_serves_until_stopped(tmp_path):
    from sp_dagster.embedded import free_port

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "sp_dagster.cli", "nats", "--port", str(port), "--store-dir", str(tmp_path / "js")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert f"NATS server ready at nats://127.0.0.1:{port}" in line and "natsServerUrl" in line
    finally:
        process.terminate()
        assert process.wait(15) == 0
    assert "NATS server stopped" in process.stdout.read()
