"""A worker on a Spark standalone master (started from pip pyspark's `spark-class`) tells the managers
as many task slots as the cores its application has been granted, following executors as they register."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from sp_dagster.embedded.broker import free_port, port_open
from tests.fixtures.spark import AUTHENTICATED, SECRET, spark_class
from tests.fixtures.waiting import wait_until

pytestmark = [pytest.mark.slow]

CORES = 3  # not Spark's floor of 2 for a default parallelism, nor local[4]'s


def _start(log: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(log.parent / "work"), **AUTHENTICATED}
    with open(log, "ab") as out:
        return subprocess.Popen([spark_class(), *args], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


@pytest.fixture
def standalone(tmp_path):
    """A standalone master on loopback, and a way to add a worker offering CORES cores; all stopped after."""
    port = free_port()
    master = _start(
        tmp_path / "master.log", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())
    )
    processes = [master]
    url = f"spark://127.0.0.1:{port}"

    def add_worker() -> None:
        processes.append(
            _start(
                tmp_path / "worker.log",
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                str(CORES),
                "--memory",
                "1g",
                "--webui-port",
                str(free_port()),
                url,
            )  # fmt: skip
        )

    try:
        wait_until(lambda: port_open("127.0.0.1", port), timeout=60, interval=0.3, what=f"the Spark master listening on port {port}")
        yield url, add_worker
    finally:
        for process in reversed(processes):
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def test_a_worker_reports_the_cores_its_application_was_granted_as_task_slots(standalone, tmp_path, monkeypatch):
    from sp_dagster.cluster.membership import read_nodes
    from sp_dagster.embedded.local_cluster import LocalCluster

    url, add_worker = standalone
    monkeypatch.setenv("SPARK_AUTH_SECRET", SECRET)  # in the worker process's environment
    cluster = LocalCluster(tmp_path / "cluster", "127.0.0.1:9", workers=1)  # its worker only: no manager, no broker
    # Loopback only, for the driver too; executors small enough for the worker's 1g.
    extra = "spark.executor.memory: 512m, spark.driver.host: 127.0.0.1, spark.driver.bindAddress: 127.0.0.1"
    conf = cluster.worker_conf.read_text().replace("master: local[6]", f"master: {url}\n  authenticateSecret: ${{SPARK_AUTH_SECRET}}")
    cluster.worker_conf.write_text(conf.replace("spark.driver.memory: 768m}", f"spark.driver.memory: 768m, {extra}}}"))
    plane = cluster.plane()  # the schema made first, so the reads below never race the worker's start
    # A process of its own, as `sp-dagster worker` runs: a Spark session of this test process (other
    # tests make them) would be reused by getOrCreate() and never ask the master for anything.
    cluster.restart("worker-1")
    worker = cluster.processes["worker-1"]

    def reported() -> int | None:
        with plane.transaction() as conn:
            return next(((n.metrics or {}).get("slots") for n in read_nodes(conn) if n.node_id == "worker-1"), None)

    def gone() -> bool:
        assert worker.poll() is None, f"worker-1 exited ({worker.poll()})\n{cluster.logs()}"
        return False

    try:
        wait_until(lambda: gone() or reported() is not None, 180, 0.5, what="worker-1's first slot count")  # up, with no executor yet: Spark's floor
        before = reported()
        assert before is not None and before < CORES, f"the worker reported {before} slot(s) before any executor registered"
        add_worker()  # an executor registers later, as on a cluster manager that grants cores as it can
        wait_until(lambda: gone() or reported() == CORES, 120, 0.5, what=f"worker-1 to report the {CORES} cores its application was granted")
    finally:
        cluster.stop()
        plane.close()
