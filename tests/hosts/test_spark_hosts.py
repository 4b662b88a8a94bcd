"""Workers on a Spark standalone cluster across machines: a master on one host, a Spark worker
offering its cores on another, and `sp-dagster worker` (the driver) on a third, each a network
namespace (tests/hosts/netns.py). Spark's RPC is authenticated with one secret on all three
(`spark.authenticateSecret` from the environment). The instances run as tasks on the executor host,
talking to the driver and the broker over the bridge; outputs are exact and the worker reports the
granted cores."""

from __future__ import annotations

import json
import os
import re
import sys
import time

import pytest

from tests.fixtures.spark import AUTHENTICATED, SECRET, spark_class
from tests.fixtures.waiting import wait_until
from tests.hosts.cluster import Cluster, running, stream_with_fault
from tests.hosts.netns import available

pytestmark = [pytest.mark.slow, pytest.mark.hosts, pytest.mark.skipif(available() is not None, reason=str(available()))]

CORES = 4  # the executor host's offer: all four instances of the app at once


class SparkCluster(Cluster):
    """One manager and one worker whose Spark application runs on a standalone master's executor host."""

    MANAGERS, WORKERS, OTHERS = ("m1",), ("w1",), ("spark", "exec")

    def start(self) -> None:
        master, executors = self.hosts["spark"], self.hosts["exec"]
        self.master_url = f"spark://{master.address}:7077"
        master.start(
            "master",
            spark_class(),
            "org.apache.spark.deploy.master.Master",
            "--host",
            master.address,
            "--port",
            "7077",
            "--webui-port",
            "8080",
            env=self.spark_env(master),
        )
        wait_until(lambda: "Starting Spark master" in (master.home / "master.log").read_text(errors="replace"), timeout=120, what="the Spark master")
        args = ("--host", executors.address, "--cores", str(CORES), "--memory", "2g", "--webui-port", "8081", self.master_url)
        executors.start("spark-worker", spark_class(), "org.apache.spark.deploy.worker.Worker", *args, env=self.spark_env(executors))
        super().start()

    @staticmethod
    def spark_env(host) -> dict:
        """Spark's processes on `host` know it by its address on the bridge, and run our Python."""
        return {
            **os.environ,
            "SPARK_LOCAL_IP": host.address,
            "SPARK_LOCAL_HOSTNAME": host.address,
            "SPARK_WORKER_DIR": str(host.home / "work"),
            "PYSPARK_PYTHON": sys.executable,
            **AUTHENTICATED,
            "SPARK_AUTH_SECRET": SECRET,  # what the sp-dagster worker's conf names
        }

    def worker_conf_for(self, host) -> str:
        conf = self.worker_conf.replace("master: local[4]", f"master: {self.master_url}\n  authenticateSecret: ${{SPARK_AUTH_SECRET}}")
        extra = f"spark.executor.memory: 768m, spark.driver.host: {host.address}, spark.driver.bindAddress: {host.address}"
        assert "spark.driver.memory: 768m}" in conf
        return conf.replace("spark.driver.memory: 768m}", f"spark.driver.memory: 768m, {extra}}}")

    def env(self, host) -> dict:
        return {**super().env(host), **(self.spark_env(host) if host.name in self.WORKERS else {})}


@pytest.fixture
def spark_cluster(tmp_path):
    with running(SparkCluster(tmp_path)) as made:
        yield made


def test_instances_run_on_the_executor_host_with_exact_outputs(spark_cluster):
    cluster = spark_cluster

    def slots() -> int | None:
        shown = cluster.operator("status", "--json")
        nodes = json.loads(shown.stdout)["nodes"] if shown.returncode == 0 else []
        return next(((n.get("metrics") or {}).get("slots") for n in nodes if n["node"] == "worker-1"), None)

    started = time.monotonic()
    counts, _, _ = stream_with_fault(cluster, lambda: None, events=3_000)  # no fault: 10 s of trades through every instance
    # Only executors run tasks on a standalone master, and the one Spark worker is on the executor host.
    assert slots() == CORES, f"worker-1 reports {slots()} task slot(s); the executor host granted {CORES}\n{cluster.logs()}"
    executor_logs = "".join(p.read_text(errors="replace") for p in (cluster.hosts["exec"].home / "work").glob("app-*/*/stderr"))
    print(json.dumps({"figure": "hosts-spark-standalone", "outputs": sum(counts.values()), "seconds": round(time.monotonic() - started, 1)}))
    # One long-running Python task per instance (two filters, two averages), on the executor host.
    for daemon in (cluster.hosts["spark"].home / "master.log", cluster.hosts["exec"].home / "spark-worker.log"):
        assert "authentication enabled" in daemon.read_text(errors="replace"), f"{daemon.name}: Spark's RPC runs without authentication"
    tasks = set(re.findall(r"Starting Python task execution - task \S+ in stage \S+ \(TID (\d+)\)", executor_logs))
    assert len(tasks) >= 4, f"{len(tasks)} Python task(s) ran on the executor host; the app has 4 instances\n{cluster.logs()}"
