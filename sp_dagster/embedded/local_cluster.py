"""A local cluster of real processes (one manager, N workers) on a given broker or NATS server, for tests and benchmarks.
The processes share a control plane and a persistence table, SQLite files under `home` or one given
database, and run with short timings so failover takes seconds (`LocalCluster`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

_NOTABLE = re.compile(
    r" (WARNING|ERROR|CRITICAL) |Traceback|transactions as | sp_dagster\.worker\.node: | sp_dagster\.cluster\.manager: "
)  # log lines a failure message keeps from before the tail

MANAGER_CONF = """
wso2.carbon: {{id: manager-1}}
cluster.config:
  enabled: true
  groupId: e2e
  strategyConfig: {{datasource: SP_MGT_DB, heartbeatInterval: 500, heartbeatMaxRetry: 3, eventPollingInterval: 300}}
deployment.config:
  type: distributed
  heartbeatInterval: 2000
  heartbeatMaxRetry: 4
  minResourceCount: 1
  datasource: SP_MGT_DB
  {messaging}
datasources:
  SP_MGT_DB: {control_db}
"""

WORKER_CONF = """
deployment.config:
  type: distributed
  heartbeatInterval: 2000
  heartbeatMaxRetry: 4
  leaderRetryInterval: 20000
  datasource: SP_MGT_DB
  {messaging}{receiver}
datasources:
  SP_MGT_DB: {control_db}
  WSO2_PERSISTENCE_DB: {persistence_db}
state.persistence:
  enabled: true
  intervalInMin: {interval}
  revisionsToKeep: 2
  persistenceStore: database
  config: {{datasource: WSO2_PERSISTENCE_DB, table: PERSISTENCE_TABLE}}
spark:
  master: local[{slots}]
  executionMode: {mode}
  exactlyOnce: {exactly_once}
  checkpointInterval: 1000
  conf: {{spark.sql.shuffle.partitions: "1", spark.driver.memory: 768m}}
"""


def messaging_conf(kind: str, servers: str, cluster_id: str = "sp-dagster", broker_profile: str = "auto") -> str:
    """The deployment.config lines naming a messaging layer: Kafka's bootstrapURLs (and brokerProfile), or NATS's natsServerUrl and clusterId."""
    if kind == "nats":
        from sp_dagster.config.model import NATS_APP_CREATOR

        return f"natsServerUrl: {servers}\n  clusterId: {cluster_id}\n  appCreatorClass: {NATS_APP_CREATOR}"
    return f"bootstrapURLs: {servers}\n  brokerProfile: {broker_profile}"


def log_excerpt(lines: list[str], tail: int = 40) -> list[str]:
    """A log for a failure message: its notable lines from before the last `tail` (warnings, errors, the
    nodes' and managers' own lines, the writers started), then those last lines."""
    earlier = [line for line in lines[:-tail] if _NOTABLE.search(line)]
    return [*earlier[-200:], *(["..."] if earlier else []), *lines[-tail:]]


class LocalCluster:
    """Managers and N worker processes sharing a control plane (SQLite under `home`, or `database`), on Kafka or NATS.

    `mode` is the workers' spark.executionMode (continuous: `slots` task slots each, transactions
    unless `exactly_once` is False). `receivers` adds receiver nodes (`isReceiverNode: true`,
    `receiver-1`, ...) that host the HTTP receivers, accepting `receiver_users` (name -> password).
    The control plane and the persistence table are SQLite files under `home`, or both in the database
    at `database` (a SQLAlchemy URL, e.g. PostgreSQL).
    """

    def __init__(
        self,
        home: Path,
        bootstrap: str,
        workers: int = 2,
        persist_every_min: float = 0.05,
        trigger: str = "300 milliseconds",
        mode: str = "continuous",
        slots: int = 6,
        exactly_once: bool = True,
        messaging: str = "kafka",
        cluster_id: str = "sp-dagster",
        managers: int = 1,
        receivers: int = 0,
        receiver_users: dict[str, str] | None = None,
        database: str | None = None,
        broker_profile: str = "auto",
    ):
        self.home = home
        self.bootstrap = bootstrap  # Kafka's bootstrap servers, or the NATS server URL(s)
        home.mkdir(parents=True, exist_ok=True)
        self.manager_conf = home / "manager.yaml"
        self.worker_conf = home / "worker.yaml"
        layer = messaging_conf(messaging, bootstrap, cluster_id, broker_profile)
        databases = dict(control_db=database or f"sqlite:///{home}/sp_mgt.db", persistence_db=database or f"sqlite:///{home}/persistence.db")
        self.manager_conf.write_text(MANAGER_CONF.format(messaging=layer, **databases))
        # Continuous instances hold a task slot each; micro-batch queries share one (as before).
        worker_slots = slots if mode == "continuous" else 1
        settings = dict(messaging=layer, **databases, interval=persist_every_min, mode=mode, slots=worker_slots, exactly_once=str(exactly_once).lower())
        self.worker_conf.write_text(WORKER_CONF.format(**settings, receiver=""))
        self.receiver_conf = home / "receiver.yaml"
        users = "".join(f"\n    - {{username: {json.dumps(u)}, password: {json.dumps(p)}}}" for u, p in (receiver_users or {}).items())
        receiver = "\n  isReceiverNode: true" + (f"\n  receiverUsers:{users}" if users else "")
        self.receiver_conf.write_text(WORKER_CONF.format(**settings, receiver=receiver))
        self.env = {**os.environ, "SP_DAGSTER_HOME": str(home), "SP_TRIGGER_INTERVAL": trigger, "PYTHONUNBUFFERED": "1"}
        self.processes: dict[str, subprocess.Popen] = {}
        self.worker_ids = [f"worker-{i + 1}" for i in range(workers)]
        self.manager_ids = ["manager"] + [f"manager-{i + 1}" for i in range(1, managers)]  # the first keeps its old name
        self.receiver_ids = [f"receiver-{i + 1}" for i in range(receivers)]

    def _start(self, name: str, *args: str) -> None:
        log = open(self.home / f"{name}.log", "ab")
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", "sp_dagster.cli", *args], stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.home
        )

    def start(self) -> LocalCluster:
        """Start the managers, the workers and the receiver nodes."""
        for name in self.manager_ids + self.worker_ids + self.receiver_ids:
            self.restart(name)
        return self

    def restart(self, name: str) -> None:
        """Start (again) the manager, worker or receiver node called `name`."""
        if name in self.worker_ids:
            self._start(name, "worker", "--conf", str(self.worker_conf), "--id", name)
        elif name in self.receiver_ids:
            self._start(name, "worker", "--conf", str(self.receiver_conf), "--id", name)
        else:
            self._start(name, "manager", "--conf", str(self.manager_conf), *(["--id", name] if name != "manager" else []))

    def signal(self, name: str, signum: int) -> None:
        """Send a signal to one process (SIGSTOP / SIGCONT to pause and resume it)."""
        self.processes[name].send_signal(signum)

    def kill(self, name: str) -> None:
        """SIGKILL one process (no clean shutdown, no last state save)."""
        process = self.processes[name]
        process.send_signal(signal.SIGKILL)
        process.wait()

    def config(self):
        """The cluster's manager Config."""
        from sp_dagster.config.loader import load_config

        return load_config(self.manager_conf, role="manager")

    def plane(self):
        """A handle on the cluster's control plane."""
        from sp_dagster.cluster.db import ControlPlane

        return ControlPlane.from_config(self.config())

    def deploy(self, path: str | Path, timeout: float = 240.0):
        """Deploy an app file on this cluster as `sp-dagster deploy` does; its DeployResult once every instance runs
        (DeployError with the processes' logs when it fails)."""
        from sp_dagster.deploy import DeployError, deploy

        try:
            return deploy(path, self.config(), timeout=timeout, check=self._check_alive)
        except DeployError as error:
            raise DeployError(f"{error}\n{self.logs()}") from error

    def _check_alive(self) -> None:
        """DeployError at once when every manager or every worker has exited: nothing could run the app."""
        from sp_dagster.deploy import DeployError

        for role, names in (("manager", self.manager_ids), ("worker", self.worker_ids)):
            started = [self.processes[n] for n in names if n in self.processes]
            if started and all(p.poll() is not None for p in started):
                codes = ", ".join(f"{n} exited {self.processes[n].returncode}" for n in names if n in self.processes)
                raise DeployError(f"every {role} process has exited ({codes}): see their logs below")

    def cli(self, *args: str, timeout: float = 300.0) -> str:
        """Run one `sp-dagster` command against this cluster (its manager configuration) as a user would; its output.
        RuntimeError with that output when it fails."""
        done = subprocess.run(
            [sys.executable, "-m", "sp_dagster.cli", *args, "--conf", str(self.manager_conf)],
            capture_output=True, text=True, timeout=timeout, env=self.env, cwd=self.home,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"sp-dagster {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return done.stdout

    def logs(self, lines: int = 40) -> str:
        """The tail of every process's log, for failure messages, after its earlier warnings and errors
        and the writers it started (which transactional id a writer token in a message header is)."""
        return "\n".join(f"--- {name}\n" + "\n".join(log_excerpt(self._log_lines(name), lines)) for name in self.processes)

    def grep(self, pattern: str) -> list[str]:
        """Every line of every process's log that matches `pattern`."""
        compiled = re.compile(pattern)
        return [line for name in self.processes for line in self._log_lines(name) if compiled.search(line)]

    def _log_lines(self, name: str) -> list[str]:
        return (self.home / f"{name}.log").read_text(errors="replace").splitlines()

    def stop(self) -> None:
        """SIGTERM everything (workers stop their queries and deregister), then make sure."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        for process in self.processes.values():
            try:
                process.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
