"""The local cluster used by tests and benchmarks: a deploy on a cluster whose processes died says so at once."""

from __future__ import annotations

import time

import pytest

from sp_dagster.deploy import DeployError
from sp_dagster.embedded.local_cluster import LocalCluster

APP = """@App:name('Doomed')
define stream In (id int);
define stream Out (id int);

@info(name = 'pass') @dist(execGroup = 'g', parallel = '1')
from In select id insert into Out;
"""


def test_a_deploy_on_a_cluster_whose_workers_all_exited_fails_at_once_naming_them(broker, tmp_path):
    cluster = LocalCluster(tmp_path / "cluster", broker.bootstrap_servers, workers=2)
    cluster.worker_conf.write_text("deployment.config: [not a mapping\n")  # every worker refuses its conf and exits
    app = tmp_path / "doomed.siddhi"
    app.write_text(APP)
    cluster.start()
    try:
        for name in cluster.worker_ids:
            cluster.processes[name].wait(timeout=60)
        started = time.monotonic()
        with pytest.raises(DeployError) as caught:
            cluster.deploy(app, timeout=120)
        assert time.monotonic() - started < 30  # not the 120 s deadline
        message = str(caught.value)
        assert "every worker process has exited (worker-1 exited" in message
        assert "--- worker-1" in message  # the workers' logs follow, saying why
    finally:
        cluster.stop()
