"""Processes around the cluster: manager, workers and the Dagster webserver, attached or detached.
`run_attached` runs a node inside a Dagster run, `start_detached` / `stop_detached` a process
that outlives the command that started it (`sp-dagster up`), and `reload_code_location` makes a
webserver show a new or removed deployment.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from sp_dagster.subprocesses import die_with_parent

# `sp-dagster` log lines: "<date> <time> LEVEL logger: message".
_LEVEL = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
# Runs of manager and worker nodes never end on their own: exempt them from max-runtime monitoring.
LONG_RUNNING_TAGS = {"dagster/max_runtime": "0", "sp-dagster/long-running": "true"}


def cli_command(*args: str) -> list[str]:
    """The command line of an `sp-dagster` subcommand, run by this Python."""
    return [sys.executable, "-m", "sp_dagster.cli", *args]


def _pump(stream, lines: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line.rstrip("\n"))
    stream.close()


def _log_lines(lines: queue.Queue, log) -> None:
    while True:
        try:
            line = lines.get_nowait()
        except queue.Empty:
            return
        match = _LEVEL.match(line)
        level = match.group(1) if match else "INFO"
        {"DEBUG": log.debug, "INFO": log.info, "WARNING": log.warning}.get(level, log.error)(line)


def stop_process(process: subprocess.Popen, timeout: float) -> int | None:
    """SIGTERM, wait up to `timeout`, then SIGKILL; returns the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    return process.returncode


def run_attached(log, command: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None, stop_timeout: float = 30.0) -> int:
    """Run `command` until it exits, its output going to `log`; any interruption stops it with SIGTERM first."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        preexec_fn=die_with_parent,
    )
    lines: queue.Queue = queue.Queue()
    pump = threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True)
    pump.start()
    log.info(f"started pid {process.pid}: {' '.join(command)}")
    try:
        while process.poll() is None or pump.is_alive():
            _log_lines(lines, log)
            time.sleep(0.2)
    except BaseException:  # the run is being terminated (or failed): take the child down with it
        log.info(f"stopping pid {process.pid} (SIGTERM, {stop_timeout:.0f} s before SIGKILL)")
        code = stop_process(process, stop_timeout)
        pump.join(5)
        _log_lines(lines, log)
        log.info(f"pid {process.pid} exited with code {code}")
        raise
    _log_lines(lines, log)
    return process.returncode


@dataclass(frozen=True)
class Detached:
    """A process started by `sp-dagster up`: enough to find it again and stop only it."""

    name: str
    pid: int
    started: str  # the kernel's start time of the process, so a reused pid is never signalled
    log: str
    command: tuple[str, ...]

    def to_dict(self) -> dict:
        """Plain data for the state file."""
        return {**asdict(self), "command": list(self.command)}

    @classmethod
    def from_dict(cls, data: dict) -> Detached:
        """Read back from the state file."""
        return cls(data["name"], int(data["pid"]), data["started"], data["log"], tuple(data["command"]))


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot); None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def start_detached(name: str, command: list[str], log_path: Path, *, env: dict[str, str] | None = None, cwd: str | None = None) -> Detached:
    """Start `command` in its own session (it survives this process), output appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    return Detached(name, process.pid, _start_time(process.pid) or "", str(log_path), tuple(command))


def alive(process: Detached) -> bool:
    """True while the recorded process (same pid, same start time) runs and is not a zombie."""
    started = _start_time(process.pid)
    if started is None or started != process.started:
        return False
    try:
        state = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def group_members(pgid: int) -> list[int]:
    """The pids of the live processes in process group `pgid`."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def stop_detached(process: Detached, timeout: float = 30.0, *, own_group: bool = True) -> str:
    """SIGTERM the process, then whatever it left in its process group; SIGKILL after `timeout`; says what happened.

    `own_group=False`: a process `up` did not start (it may share a terminal's process group): only it is signalled."""
    if not alive(process):
        return "not running"
    os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(process.pid)
        if not alive(process):
            break
        time.sleep(0.1)
    else:
        # Started by `up` with a new session, its group holds only it and its children.
        (os.killpg if own_group else os.kill)(process.pid, signal.SIGKILL)
        _reap(process.pid)
        return "killed"
    if own_group and group_members(process.pid):  # children it left behind
        os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while group_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if group_members(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
    return "stopped"


def this_process(name: str) -> Detached | None:
    """This process, as `down` finds it again (None where there is no /proc to tell its start time)."""
    started = _start_time(os.getpid())
    return None if started is None else Detached(name, os.getpid(), started, "", tuple(sys.argv))


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our own child (no zombie left behind)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


LOCATION_NAME = "sp-dagster"


def workspace_yaml(working_directory: str) -> str:
    """A workspace.yaml loading the sp-dagster code location from the installed package."""
    return (
        "load_from:\n  - python_module:\n      module_name: sp_dagster.orchestration.definitions\n"
        f"      location_name: {LOCATION_NAME}\n      working_directory: {working_directory}\n"
    )


def webserver_command(workspace: str | Path, host: str, port: int) -> list[str]:
    """`dagster dev` (webserver and daemon) on a workspace file."""
    return [sys.executable, "-m", "dagster", "dev", "-w", str(workspace), "--host", host, "--port", str(port)]


def webserver_answers(url: str, timeout: float = 2) -> bool:
    """True when a Dagster webserver answers at `url` (http://host:port)."""
    try:
        with urllib.request.urlopen(f"{url}/server_info", timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


def refresh_ui(host: str, port: int) -> str | None:
    """Reload the code location of a Dagster webserver at host:port so it shows a deploy or undeploy; None when none answers there."""
    if not webserver_answers(f"http://{host}:{port}"):
        return None
    return reload_code_location(host, port)


def reload_code_location(host: str, port: int, location: str = LOCATION_NAME, timeout: int = 30) -> str:
    """Ask the webserver at host:port to reload `location`; returns what happened, in words."""
    from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError, ReloadRepositoryLocationStatus

    try:
        info = DagsterGraphQLClient(host, port_number=port, timeout=timeout).reload_repository_location(location)
    except (DagsterGraphQLClientError, OSError) as exc:
        return f"the Dagster webserver at {host}:{port} did not answer ({type(exc).__name__}); reload the code location in the UI to see the change"
    if info.status == ReloadRepositoryLocationStatus.SUCCESS:
        return f"reloaded code location '{location}' at {host}:{port}"
    return f"reloading code location '{location}' at {host}:{port} failed: {info.message}"
