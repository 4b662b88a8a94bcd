"""Hosts made of Linux network namespaces on one bridge, for tests that need several machines.

Every host is a namespace with its own loopback, one address on a /24 and its own directory
(its disk); the bridge lives in a namespace of its own, so nothing is added to the machine's
own network. A host can be cut off whole (its link on the bridge goes down) or from one other
host (a blackhole route to that host's address). Processes run inside a host through
`ip netns exec`. Needs root (CI runs as root); `Network.remove()` deletes every namespace and
process it made.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.fixtures.databases import PostgresServer


def available() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class Host:
    """One machine: a namespace, an address on the bridge, a directory, the processes started there."""

    name: str
    namespace: str
    address: str
    link: str  # its end of the cable, on the bridge's side
    home: Path
    processes: list[subprocess.Popen] = field(default_factory=list)

    def command(self, *args: str) -> list[str]:
        """`args` as run inside this host."""
        return ["ip", "netns", "exec", self.namespace, *args]

    def start(self, name: str, *args: str, env: dict | None = None) -> subprocess.Popen:
        """Start a process on this host, its output in `<home>/<name>.log`."""
        with open(self.home / f"{name}.log", "ab") as log:
            process = subprocess.Popen(self.command(*args), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.home, start_new_session=True)
        self.processes.append(process)
        return process

    def run(self, *args: str, env: dict | None = None, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a command on this host to its end."""
        return subprocess.run(self.command(*args), input=stdin, capture_output=True, text=True, env=env, cwd=self.home, timeout=timeout)


class Network:
    """Hosts on one bridge: `host(name)` makes one; `cut`/`heal` take a host off the bridge and back."""

    def __init__(self, root: Path):
        self.root = root
        self.tag = uuid.uuid4().hex[:5]
        self.switch = f"sp{self.tag}sw"
        self.subnet = f"10.{random.randint(100, 250)}.{random.randint(0, 250)}"
        self.hosts: dict[str, Host] = {}
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge", "forward_delay", "0")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def host(self, name: str) -> Host:
        """A new host called `name` on the bridge."""
        index = len(self.hosts) + 2
        namespace, outside, inside = f"sp{self.tag}{name}"[:15], f"v{self.tag}{index}s", f"v{self.tag}{index}h"
        _ip("netns", "add", namespace)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", outside, "netns", self.switch)
        _ip("link", "set", inside, "netns", namespace)
        _ip("-n", self.switch, "link", "set", outside, "master", "br0", "up")
        _ip("-n", namespace, "link", "set", inside, "name", "eth0")
        _ip("-n", namespace, "addr", "add", f"{self.subnet}.{index}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        home = self.root / name
        home.mkdir(parents=True, exist_ok=True)
        host = Host(name, namespace, f"{self.subnet}.{index}", outside, home)
        self.hosts[name] = host
        return host

    def cut(self, host: Host) -> None:
        """Take `host` off the bridge (its cable pulled): it reaches no one, no one reaches it."""
        _ip("-n", self.switch, "link", "set", host.link, "down")

    def heal(self, host: Host) -> None:
        """Plug `host` back in."""
        _ip("-n", self.switch, "link", "set", host.link, "up")

    def block(self, host: Host, other: Host) -> None:
        """`host` can no longer reach `other` (everything else still works)."""
        _ip("-n", host.namespace, "route", "add", "blackhole", f"{other.address}/32")

    def unblock(self, host: Host, other: Host) -> None:
        """Undo block()."""
        _ip("-n", host.namespace, "route", "del", "blackhole", f"{other.address}/32")

    def remove(self) -> None:
        """Stop every process started on a host and delete every namespace (their links go with them)."""
        for host in self.hosts.values():
            for process in host.processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(30)
        for namespace in [h.namespace for h in self.hosts.values()] + [self.switch]:
            pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
            for pid in pids:  # nothing may outlive its host
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


class HostedPostgres(PostgresServer):
    """PostgreSQL listening on a host's address; the test reaches it through its socket directory
    (`remove()` deletes its data)."""

    def __init__(self, host: Host):
        self.host, self.initialised = host, False
        super().__init__(Path(tempfile.mkdtemp(prefix="sp-dagster-hosted-pg-")))  # a directory the postgres user can reach  # initdb, as the postgres user
        self.port, self.initialised = 5432, True
        subnet = host.address.rsplit(".", 1)[0]
        with open(self.data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {subnet}.0/24 trust\n")  # every host on the bridge

    def credentials(self) -> dict:
        return {} if self.initialised else super().credentials()  # the server: runuser inside the host

    def command(self) -> list[str]:
        args = super().command()
        args[args.index("listen_addresses=127.0.0.1")] = f"listen_addresses={self.host.address}"
        return self.host.command("runuser", "-u", "postgres", "--", *args)

    def _connect(self, database: str = "postgres"):
        import psycopg

        return psycopg.connect(host=str(self.root), port=self.port, user="sp", dbname=database, connect_timeout=2, autocommit=True)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://sp@{self.host.address}:{self.port}/{database}"
