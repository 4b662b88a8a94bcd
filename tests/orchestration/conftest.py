"""Fixtures of the Dagster tests: a cluster's confs on the session broker and a SQLite control plane,
a leader manager in a thread, and stand-in workers speaking the workers' control-plane protocol."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest

from sp_dagster.embedded.broker import free_port
from sp_dagster.orchestration.processes import stop_process, webserver_command, workspace_yaml
from sp_dagster.subprocesses import die_with_parent
from tests.fixtures.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
SAMPLE_APP = REPO / "apps" / "stock-alerts.siddhi"

MANAGER_CONF = """\
wso2.carbon:
  id: manager-1
cluster.config:
  enabled: true
  groupId: sp
  strategyConfig:
    datasource: SP_MGT_DB
    heartbeatInterval: 300
    heartbeatMaxRetry: 3
    eventPollingInterval: 200
deployment.config:
  type: distributed
  heartbeatInterval: 300
  heartbeatMaxRetry: 4
  datasource: SP_MGT_DB
  minResourceCount: 1
  bootstrapURLs: {bootstrap}
datasources:
  SP_MGT_DB: sqlite:///{db}
dagster:
  appRepository: {apps}
  placementTimeout: 15
  runningTimeout: 15
  lagGrowthSamples: 3
  port: {port}
"""

WORKER_CONF = """\
wso2.carbon:
  id: worker-1
deployment.config:
  type: distributed
  heartbeatInterval: 300
  heartbeatMaxRetry: 4
  datasource: SP_MGT_DB
  bootstrapURLs: {bootstrap}
datasources:
  SP_MGT_DB: sqlite:///{db}
spark:
  master: local[1]
  conf:
    spark.ui.enabled: "false"
"""


def command_lines() -> list[str]:
    """The command line of every process on this machine."""
    lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(cmdline.read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            pass
    return lines


class Cluster:
    """Paths of one test cluster: the two confs, the control-plane database and the app repository."""

    def __init__(self, root: Path, bootstrap: str, port: int = 3000):
        self.root = root
        self.bootstrap = bootstrap
        self.db = root / "sp_mgt.db"
        self.apps = root / "apps"
        self.apps.mkdir(parents=True, exist_ok=True)
        self.manager_conf = root / "manager.yaml"
        self.worker_conf = root / "worker.yaml"
        values = dict(bootstrap=bootstrap, db=self.db, apps=self.apps, port=port)
        self.manager_conf.write_text(MANAGER_CONF.format(**values))
        self.worker_conf.write_text(WORKER_CONF.format(**values))

    def resources(self) -> dict:
        """The Dagster resources of this cluster."""
        from sp_dagster.orchestration.resources import ControlPlaneResource, MessagingResource, spark_resource

        return {
            "control_plane": ControlPlaneResource(conf=str(self.manager_conf)),
            "messaging": MessagingResource(conf=str(self.manager_conf)),
            "spark": spark_resource(str(self.worker_conf)),
        }

    def plane(self):
        """A ControlPlane on the cluster's database (schema created); close it after use."""
        from sp_dagster.cluster.db import ControlPlane
        from sp_dagster.config.loader import load_config

        return ControlPlane.from_config(load_config(self.manager_conf, role="manager"))

    def add_app(self, name: str = "stock-alerts.siddhi", text: str | None = None) -> Path:
        """Put an app file into the repository (the sample app unless `text`)."""
        path = self.apps / name
        if text is None:
            shutil.copy(SAMPLE_APP, path)
        else:
            path.write_text(text)
        return path


@pytest.fixture
def cluster(tmp_path, broker):
    """A cluster's confs on the session broker, with an empty SQLite control plane and app repository."""
    return Cluster(tmp_path / "cluster", broker.bootstrap_servers)


@pytest.fixture
def manager(cluster):
    """A leader manager of the cluster, running in a thread (the same code as `sp-dagster manager`)."""
    from sp_dagster.cluster.manager import Manager
    from sp_dagster.config.loader import load_config

    stop = threading.Event()
    node = Manager(load_config(cluster.manager_conf, role="manager"))
    thread = threading.Thread(target=node.run, args=(stop,), daemon=True)
    thread.start()
    yield node
    stop.set()
    thread.join(10)


@pytest.fixture
def plane(cluster):
    """A ControlPlane on the cluster's database."""
    plane = cluster.plane()
    yield plane
    plane.close()


@pytest.fixture
def live(tmp_path, cluster):
    """The cluster, its manager conf naming a `dagster dev` on a free port, and that dagster dev running."""
    port = free_port()
    cluster.manager_conf.write_text(cluster.manager_conf.read_text().replace("port: 3000", f"port: {port}") + "  sensorInterval: 2\n")
    home = tmp_path / "dagster-home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    (home / "workspace.yaml").write_text(workspace_yaml(str(tmp_path)))
    env = {**os.environ, "DAGSTER_HOME": str(home), "SP_DAGSTER_CONF": str(cluster.manager_conf), "SP_DAGSTER_WORKER_CONF": str(cluster.worker_conf)}
    log = open(tmp_path / "dagster.log", "wb")
    server = subprocess.Popen(
        webserver_command(home / "workspace.yaml", "127.0.0.1", port), env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
    )
    url = f"http://127.0.0.1:{port}"

    def ready():
        assert server.poll() is None, (tmp_path / "dagster.log").read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=2):
                return True
        except OSError:
            return False

    wait_until(ready, timeout=180, interval=0.5, what="dagster dev to answer")
    yield cluster, url
    stop_process(server, 60)
    log.close()
