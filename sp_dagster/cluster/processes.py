"""Manager nodes as separate OS processes: a deployment.yaml for them, and start/stop/kill.
Used wherever managers are run from Python (tests, benchmarks, a local cluster): each is
`python -m sp_dagster.cli manager --conf FILE --id ID`, dying with its parent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sp_dagster.subprocesses import die_with_parent


def manager_config(
    url: str,
    *,
    group_id: str = "sp",
    heartbeat_interval_ms: int = 1000,
    heartbeat_max_retry: int = 3,
    event_polling_interval_ms: int = 1000,
    worker_heartbeat_interval_ms: int = 2000,
    worker_heartbeat_max_retry: int = 4,
    min_resource_count: int = 1,
    allocation_algorithm: str | None = None,
) -> str:
    """A manager deployment.yaml for a control plane at `url` with the given timing."""
    algorithm = f"\n  allocationAlgorithm: {json.dumps(allocation_algorithm)}" if allocation_algorithm else ""
    return f"""\
wso2.carbon:
  id: manager-1
cluster.config:
  enabled: true
  groupId: {json.dumps(group_id)}
  strategyConfig:
    datasource: SP_MGT_DB
    heartbeatInterval: {heartbeat_interval_ms}
    heartbeatMaxRetry: {heartbeat_max_retry}
    eventPollingInterval: {event_polling_interval_ms}
deployment.config:
  type: distributed
  heartbeatInterval: {worker_heartbeat_interval_ms}
  heartbeatMaxRetry: {worker_heartbeat_max_retry}
  minResourceCount: {min_resource_count}
  datasource: SP_MGT_DB{algorithm}
datasources:
  SP_MGT_DB: {json.dumps(url)}
"""


class ManagerProcess:
    """One `sp-dagster manager` process; restartable under the same id."""

    def __init__(
        self,
        conf: str | Path,
        node_id: str,
        *,
        journal: str | Path | None = None,
        log_path: str | Path | None = None,
        cwd: str | Path | None = None,
        env: dict[str, str] | None = None,
        module: str = "sp_dagster.cli",
    ):
        self.conf = str(conf)
        self.node_id = node_id
        self.journal = journal
        self.log_path = log_path
        self.cwd = str(cwd) if cwd else None
        self.env = env
        self.module = module  # runs `python -m MODULE manager --conf ... --id ...`
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self._log_offset = 0

    def command(self) -> list[str]:
        """The command line of the process."""
        args = [sys.executable, "-m", self.module, "manager", "--conf", self.conf, "--id", self.node_id]
        if self.journal:
            args += ["--journal", str(self.journal)]
        return args

    def start(self) -> ManagerProcess:
        """Start the process (its output is appended to log_path, if given)."""
        log = open(self.log_path, "ab") if self.log_path else None
        out = log if log is not None else subprocess.DEVNULL
        self._log_offset = log.tell() if log is not None else 0
        try:
            self.process = subprocess.Popen(
                self.command(),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                env={**os.environ, **(self.env or {})},
                preexec_fn=die_with_parent,
            )
        finally:
            if log is not None:
                log.close()
        self.starts += 1
        return self

    @property
    def ready(self) -> bool:
        """True once the current start has logged its first line (signal handlers are set by then); needs log_path."""
        if not self.alive or not self.log_path:
            return False
        try:
            with open(self.log_path, "rb") as log_file:
                log_file.seek(self._log_offset)
                return f"manager {self.node_id} (group ".encode() in log_file.read()
        except OSError:
            return False

    @property
    def alive(self) -> bool:
        """True while the process runs (a paused one counts as running)."""
        return self._running() is not None

    def _running(self) -> subprocess.Popen | None:
        """The process while it runs, else None."""
        return self.process if self.process is not None and self.process.poll() is None else None

    def signal(self, signum: int) -> None:
        """Send a signal if the process runs."""
        if (process := self._running()) is not None:
            process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL: no clean-up at all, as in a crash."""
        if (process := self._running()) is not None:
            process.send_signal(signal.SIGCONT)  # a paused process must also die now
            process.kill()
            process.wait(10)

    def stop(self, timeout: float = 15) -> int | None:
        """SIGTERM and wait (SIGKILL after `timeout`, its threads' stacks logged first); returns the exit code."""
        if self.process is None:
            return None
        if self.alive:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.send_signal(signal.SIGUSR1)  # where it hangs, into its log
                time.sleep(0.5)
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode
