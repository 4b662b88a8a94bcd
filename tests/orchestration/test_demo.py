"""The README's quickstart as written, `up` to `down`: the whole local system with real workers (Spark) and the UI, end to end."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sp_dagster.embedded.broker import free_port
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


def readme_quickstart() -> tuple[list[str], str]:
    """The README quickstart's commands after the install, as written (comments dropped), and its sample app."""
    section = (REPO / "README.md").read_text().split("\n## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    lines = [line.split("  #")[0].strip() for kind, body in blocks if kind == "bash" for line in body.splitlines()]
    (app,) = [body for kind, body in blocks if kind == "sql"]
    return [line for line in lines if line.startswith(("sp-dagster", "echo", "grep"))], app


@pytest.mark.slow
@pytest.mark.parametrize("messaging", ["kafka", pytest.param("nats", marks=pytest.mark.nats)])
def test_the_readmes_quickstart_runs_as_written_on_other_ports_and_down_stops_everything(tmp_path, messaging):
    """A new user's machine: a home of its own, no SP_* variable, the commands run in a clone's folder."""
    commands, app = readme_quickstart()
    verbs = [line.split()[1] if line.startswith("sp-dagster") else line.split()[0] for line in commands]
    assert verbs == ["up", "status", "consume", "plan", "deploy", "echo", "grep", "down"], commands
    clone, home = tmp_path / "clone", tmp_path / "user"
    for folder in ("apps", "conf"):
        shutil.copytree(REPO / folder, clone / folder)
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SP_") and k != "PYTHONPATH"}
    env.update(HOME=str(home), PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    sp_home = home / ".sp-dagster"

    def run(line: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", line], cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)

    ui_port = free_port()
    up_line = f"{commands[0]} --broker-port {free_port()} --port {ui_port}" + (" --messaging nats" if messaging == "nats" else "")
    up = run(up_line)
    state = json.loads((sp_home / "up.json").read_text()) if (sp_home / "up.json").exists() else {"processes": []}
    processes = [Detached.from_dict(p) for p in state["processes"]]
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "sp-dagster is up" in up.stdout and "StockAlerts: 5 instances running" in up.stdout
        assert [p.name for p in processes] == ["broker", "manager-1", "worker-1", "worker-2", "dagster", "generator"]
        assert all(alive(p) for p in processes)
        # The stack runs "on this machine only": no process of it (Spark's JVMs and the UI included) listens beyond loopback.
        pids = [member for p in processes for member in group_members(p.pid)]
        sockets = listening(pids)
        assert f"127.0.0.1:{ui_port}" in {address for _pid, address in sockets}, sockets
        assert not [(pid, address) for pid, address in sockets if not loopback(address)], sockets
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/server_info", timeout=30) as answer:
            assert answer.status == 200  # the UI on the port asked for

        status = run(commands[1])
        assert status.returncode == 0 and "worker-1" in status.stdout and "worker-2" in status.stdout, status.stdout + status.stderr
        instances = json.loads(run(commands[1] + " --json").stdout)["deployments"][0]["instances"]
        assert {i["status"] for i in instances} == {"running"} and {i["node"] for i in instances} == {"worker-1", "worker-2"}
        # The averages as they come, until Ctrl-C: the stack found on its non-default port through its record.
        averages = consume_until_interrupted(commands[2], clone, env, count=3)
        for average in averages:
            symbol, price, trades = average["data"]
            assert average["stream"] == "AveragePriceStream" and isinstance(symbol, str) and price > 0 and trades >= 1, average
        planned = run(commands[3])
        assert planned.returncode == 0 and "app StockAlerts: 3 execution groups" in planned.stdout, planned.stdout + planned.stderr
        (clone / "big.siddhi").write_text(app)
        deployed = run(commands[4])
        assert deployed.returncode == 0 and "Big: 2/2 instances running" in deployed.stdout, deployed.stdout + deployed.stderr
        produced = run(commands[5])
        assert produced.returncode == 0 and "sent 1 event" in produced.stderr, produced.stdout + produced.stderr
        logged = wait_until(lambda: (found := run(commands[6])).returncode == 0 and found.stdout, timeout=60, what="the log sink's line")
        assert "big :" in logged and "IBM" in logged and "120.0" in logged, logged
    finally:
        down = run(commands[7])
    assert down.returncode == 0 and "sp-dagster is down" in down.stdout, down.stdout + down.stderr
    assert not (sp_home / "up.json").exists()
    time.sleep(0.5)
    assert not [p.name for p in processes if alive(p)], down.stdout
    assert not [p.name for p in processes if group_members(p.pid)]  # nothing left in their groups (no Spark JVM)
    assert sorted(p.name for p in clone.iterdir()) == ["apps", "big.siddhi", "conf"]  # nothing written where the commands ran


def consume_until_interrupted(line: str, cwd: Path, env: dict, count: int, timeout: float = 180) -> list[dict]:
    """Run a `consume` that follows its stream, read `count` events, then press Ctrl-C: it must end cleanly."""
    process = subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events: list[dict] = []
    try:
        deadline = time.monotonic() + timeout
        assert process.stdout is not None
        while len(events) < count and time.monotonic() < deadline:
            ready, _w, _x = select.select([process.stdout], [], [], 1.0)
            if ready:
                text = process.stdout.readline()
                if not text:
                    break
                if text.strip():
                    events.append(json.loads(text))
        process.send_signal(signal.SIGINT)
        _out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert len(events) == count, f"{len(events)} events in {timeout} s: {err[-2000:]}"
    assert process.returncode in (0, 130) and "Traceback" not in err, (process.returncode, err[-2000:])
    return events
