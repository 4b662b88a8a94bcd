"""`sp-dagster manager` and `sp-dagster status` as separate processes, as a user runs them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.election import current_leader
from sp_dagster.cluster.processes import ManagerProcess, manager_config
from sp_dagster.cluster.store.deployments import InstanceSpec, get_deployment, list_instances, record_deployment
from sp_dagster.embedded.broker import free_port
from tests.cluster.helpers import Workers
from tests.fixtures.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
# Workers fence themselves after about interval x retry without a renewed heartbeat: on a loaded
# machine a SQLite write can wait a few hundred milliseconds, so they get most of a second.
FAST = dict(heartbeat_interval_ms=150, heartbeat_max_retry=3, event_polling_interval_ms=150, worker_heartbeat_interval_ms=150, worker_heartbeat_max_retry=6)
WORKER_TIMING = dict(interval_ms=150, max_retry=6)


def cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "sp_dagster.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def write_conf(tmp_path, url, **timing):
    conf = tmp_path / "manager.yaml"
    conf.write_text(manager_config(url, **{**FAST, **timing}))
    return conf


def managers(tmp_path, conf, count):
    return [ManagerProcess(conf, f"m{i}", log_path=tmp_path / f"m{i}.log", journal=tmp_path / f"m{i}.jsonl", cwd=ROOT).start() for i in range(1, count + 1)]


def seen(workers) -> list[str]:
    """Every instance the workers see assigned to them, sorted."""
    return sorted(workers.instances("w1") + workers.instances("w2"))


def test_managers_elect_place_and_hand_over_on_sigterm(tmp_path, database_url):
    plane = ControlPlane(database_url)
    plane.migrate()
    conf = write_conf(tmp_path, database_url)
    procs = managers(tmp_path, conf, 2)
    try:
        with Workers(plane, ["w1", "w2"], **WORKER_TIMING) as workers:
            record_deployment(plane, "app", content_hash="h", source="s", plan={}, instances=[InstanceSpec(f"app-g-{i}", "g", i, "x") for i in (1, 2)])
            first = wait_until(lambda: (current_leader(plane) or None) and current_leader(plane).alive and current_leader(plane), what="a leader")
            wait_until(lambda: get_deployment(plane, "app").status == "placed", what="placement")
            wait_until(lambda: seen(workers) == ["app-g-1", "app-g-2"], what="the workers to see their instances")
            leader_proc = next(p for p in procs if p.node_id == first.holder)
            started = time.monotonic()
            assert leader_proc.stop() == 0  # SIGTERM: resigns the lease
            second = wait_until(lambda: (lambda lead: lead if lead and lead.alive and lead.term > first.term else None)(current_leader(plane)), what="takeover")
            # Resigning hands over within a heartbeat or two, not after the lease runs out.
            assert time.monotonic() - started < 3
            assert second.holder != first.holder
            wait_until(lambda: {i.term for i in list_instances(plane)} == {second.term}, what="placements in the new term")
            wait_until(lambda: seen(workers) == ["app-g-1", "app-g-2"], what="the workers to see their instances")
    finally:
        for p in procs:
            p.stop()
        plane.close()
    log = (tmp_path / f"{first.holder}.log").read_text()
    assert f"became leader of group 'sp' (term {first.term})" in log and "resigned leadership" in log


def test_status_command_shows_leader_nodes_and_placements(tmp_path):
    url = f"sqlite:///{tmp_path / 'cp.db'}"
    plane = ControlPlane(url)
    plane.migrate()
    conf = write_conf(tmp_path, url)
    procs = managers(tmp_path, conf, 1)
    try:
        with Workers(plane, ["w1"], **WORKER_TIMING):
            record_deployment(plane, "orders", content_hash="h", source="s", plan={}, instances=[InstanceSpec("orders-g-1", "g", 1, "x")])
            wait_until(lambda: get_deployment(plane, "orders").status == "placed", what="placement")
            text = cli("status", "--conf", str(conf))
            as_json = cli("status", "--conf", str(conf), "--json")
    finally:
        procs[0].stop()
        plane.close()
    assert text.returncode == 0, text.stderr
    assert "leader         m1 (group sp, term 1, lease expires in" in text.stdout
    assert "manager        m1 (leader" in text.stdout
    assert any(line.split()[:3] == ["w1", "worker", "alive"] for line in text.stdout.splitlines())
    assert "app orders: placed, 1/1 instances placed" in text.stdout
    status = json.loads(as_json.stdout)
    assert status["leader"]["node"] == "m1" and status["leader"]["alive"]
    assert status["nodes"][0]["node"] == "w1" and status["nodes"][0]["instances"] == 1
    assert status["deployments"][0]["instances"][0]["node"] == "w1"


def test_status_without_a_cluster_is_one_clear_line(tmp_path):
    conf = write_conf(tmp_path, f"sqlite:///{tmp_path / 'nothing.db'}")
    result = cli("status", "--conf", str(conf))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: the control plane sqlite:///{tmp_path / 'nothing.db'} does not exist yet; start a manager first: sp-dagster manager --conf FILE"
    )
    assert not (tmp_path / "nothing.db").exists()


def test_status_with_an_unreachable_database_names_it(tmp_path):
    conf = write_conf(tmp_path, f"postgresql+psycopg://sp:pw@127.0.0.1:{free_port()}/cp")
    result = cli("status", "--conf", str(conf))
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "error: control-plane database postgresql+psycopg://sp:***@127.0.0.1:" in result.stderr
    assert "is unreachable" in result.stderr and "Traceback" not in result.stderr


def test_manager_keeps_trying_an_unreachable_database_and_says_so_once(tmp_path):
    conf = write_conf(tmp_path, f"postgresql+psycopg://sp@127.0.0.1:{free_port()}/cp")
    log_path = tmp_path / "m1.log"
    proc = ManagerProcess(conf, "m1", log_path=log_path, cwd=ROOT).start()
    # Its stop handler is set once it has logged its first line (a SIGTERM before that kills it, as any process).
    wait_until(lambda: proc.ready and "is unreachable:" in log_path.read_text(), 60, 0.1, what="the manager to start and say the database is unreachable")
    time.sleep(2)  # it keeps trying meanwhile, without saying so again
    assert proc.alive
    proc.signal(signal.SIGTERM)
    assert proc.process.wait(15) == 0
    log = log_path.read_text()
    assert log.count("is unreachable:") == 1, log
    assert "Traceback" not in log


def test_manager_with_a_bad_conf_is_one_line(tmp_path):
    bad = tmp_path / "deployment.yaml"
    bad.write_text("deployment.config:\n  type: distributed\n  heartbeatInterval: soon\n")
    result = cli("manager", "--conf", str(bad))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "deployment.config.heartbeatInterval" in result.stderr


@pytest.mark.parametrize("command", [("manager",), ("status",)])
def test_help(command):
    result = cli(*command, "--help")
    assert result.returncode == 0 and "usage: sp-dagster" in result.stdout
