"""`sp-dagster up --no-ui` then `down`: the whole local system with real workers (Spark), end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from sp_dagster.config.loader import load_config
from sp_dagster.embedded.broker import free_port
from sp_dagster.messaging import transport_for
from sp_dagster.orchestration.processes import Detached, alive, group_members
from tests.fixtures.waiting import wait_until
from tests.orchestration.conftest import REPO


def listening(pids: list[int]) -> list[tuple[int, str]]:
    """(pid, address:port) of every TCP socket the processes listen on (from /proc: no tool needed)."""
    import ipaddress
    import os
    from pathlib import Path

    inodes = {}
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:  # gone meanwhile
                continue
            if target.startswith("socket:["):
                inodes[target[8:-1]] = pid
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                host, port = fields[1].split(":")
                raw = bytes.fromhex(host)
                # /proc prints each 32-bit word in host (little-endian) order
                address = ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))
                found.append((inodes[fields[9]], f"{address}:{int(port, 16)}"))
    return found


def loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback addresses."""
    import ipaddress

    ip = ipaddress.ip_address(address.rsplit(":", 1)[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sp_dagster.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_up_and_down_help():
    assert "--no-demo" in cli("up", "--help").stdout
    assert "up.json" in cli("down", "--help").stdout


def test_down_when_nothing_is_up(sp_home):
    result = cli("down")
    assert result.returncode == 0 and "not up" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("messaging", ["kafka", pytest.param("nats", marks=pytest.mark.nats)])
def test_up_runs_the_sample_app_on_two_workers_and_down_stops_everything(sp_home, messaging, monkeypatch):
    for name in ("SP_DAGSTER_CONF", "SP_DAGSTER_WORKER_CONF", "SP_KAFKA_BOOTSTRAP", "SP_NATS_URL"):  # as on a new user's machine
        monkeypatch.delenv(name, raising=False)
    up = cli("up", "--no-ui", "--workers", "2", "--broker-port", str(free_port()), "--messaging", messaging)
    state = json.loads((sp_home / "up.json").read_text()) if (sp_home / "up.json").exists() else {"processes": []}
    processes = [Detached.from_dict(p) for p in state["processes"]]
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "sp-dagster is up" in up.stdout and "StockAlerts: 5 instances running" in up.stdout
        assert [p.name for p in processes] == ["broker", "manager-1", "worker-1", "worker-2", "generator"]
        assert all(alive(p) for p in processes)
        # The stack runs "on this machine only": no process of it (Spark's JVMs included) listens beyond loopback.
        pids = [member for p in processes for member in group_members(p.pid)]
        sockets = listening(pids)
        assert sockets, "nothing listens: the check below would prove nothing"
        assert not [(pid, address) for pid, address in sockets if not loopback(address)], sockets

        status = json.loads(cli("status", "--json").stdout)
        [deployment] = status["deployments"]
        assert deployment["app"] == "StockAlerts"
        assert {i["status"] for i in deployment["instances"]} == {"running"}
        assert {i["node"] for i in deployment["instances"]} == {"worker-1", "worker-2"}

        # Events flow: the generator feeds TradeStream, the filter group publishes the large trades.
        transport = transport_for(load_config(state["facts"]["env"]["SP_DAGSTER_CONF"]).messaging, timeout=15)
        assert transport.kind == messaging
        try:
            wait_until(lambda: sum(transport.end_offsets("StockAlerts.TradeStream").values()) > 10, timeout=60, what="generated events")
            wait_until(
                lambda: sum(transport.end_offsets("StockAlerts.LargeTradeStream.symbol").values()) > 0,
                timeout=240,
                interval=2,
                what="events out of the filter group",
            )
            wait_until(
                lambda: sum(transport.end_offsets("StockAlerts.AveragePriceStream").values()) > 0,
                timeout=120,
                interval=2,
                what="averages out of the average group",
            )
        finally:
            transport.close()
        # The averages as users read them, the same on either layer: the README's command, with no --conf
        # and no variable set, finds the stack on its non-default port through the stack's record.
        consumed = cli(
            "consume",
            "--from-beginning",
            "--count",
            "3",
            "--timeout",
            "30",
            "StockAlerts:AveragePriceStream",
            timeout=120,
        )
        averages = [json.loads(line) for line in consumed.stdout.splitlines() if line.strip()]
        assert consumed.returncode == 0 and len(averages) == 3, consumed.stdout + consumed.stderr
        for average in averages:
            symbol, price, trades = average["data"]
            assert average["stream"] == "AveragePriceStream" and isinstance(symbol, str) and price > 0 and trades >= 1, average
    finally:
        down = cli("down")
    assert down.returncode == 0 and "sp-dagster is down" in down.stdout
    assert not (sp_home / "up.json").exists()
    time.sleep(0.5)
    assert not [p.name for p in processes if alive(p)], down.stdout
    assert not [p.name for p in processes if group_members(p.pid)]  # nothing left in their groups (no Spark JVM)
