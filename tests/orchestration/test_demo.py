"""`sp-dagster up --no-ui` then `down`: the whole local system with real workers (Spark), end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from sp_dagster.embedded.broker import free_port
from sp_dagster.messaging.kafka import KafkaTransport
from sp_dagster.orchestration.processes import Detached, alive, group_members
from tests.cluster.helpers import wait_until
from tests.orchestration.conftest import REPO


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sp_dagster.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_up_and_down_help():
    assert "--no-demo" in cli("up", "--help").stdout
    assert "up.json" in cli("down", "--help").stdout


def test_down_when_nothing_is_up(sp_home):
    result = cli("down")
    assert result.returncode == 0 and "not up" in result.stdout


@pytest.mark.slow
def test_up_runs_the_sample_app_on_two_workers_and_down_stops_everything(sp_home):
    up = cli("up", "--no-ui", "--workers", "2", "--broker-port", str(free_port()))
    state = json.loads((sp_home / "up.json").read_text()) if (sp_home / "up.json").exists() else {"processes": []}
    processes = [Detached.from_dict(p) for p in state["processes"]]
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "sp-dagster is up" in up.stdout and "StockAlerts: 5 instances running" in up.stdout
        assert [p.name for p in processes] == ["broker", "manager-1", "worker-1", "worker-2", "generator"]
        assert all(alive(p) for p in processes)

        status = json.loads(cli("status", "--json").stdout)
        [deployment] = status["deployments"]
        assert deployment["app"] == "StockAlerts"
        assert {i["status"] for i in deployment["instances"]} == {"running"}
        assert {i["node"] for i in deployment["instances"]} == {"worker-1", "worker-2"}

        # Events flow: the generator feeds TradeStream, the filter group publishes the large trades.
        kafka = KafkaTransport(state["facts"]["bootstrap"], timeout=15)
        try:
            wait_until(lambda: sum(kafka.end_offsets("StockAlerts.TradeStream").values()) > 10, timeout=60, what="generated events")
            wait_until(lambda: sum(kafka.end_offsets("StockAlerts.LargeTradeStream.symbol").values()) > 0, timeout=240, interval=2, what="events out of the filter group")
            wait_until(lambda: sum(kafka.end_offsets("StockAlerts.AveragePriceStream").values()) > 0, timeout=120, interval=2, what="averages out of the average group")
        finally:
            kafka.close()
    finally:
        down = cli("down")
    assert down.returncode == 0 and "sp-dagster is down" in down.stdout
    assert not (sp_home / "up.json").exists()
    time.sleep(0.5)
    assert not [p.name for p in processes if alive(p)], down.stdout
    assert not [p.name for p in processes if group_members(p.pid)]  # nothing left in their groups (no Spark JVM)

