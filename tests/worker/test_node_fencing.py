"""A fenced worker stops its instances on time even while a heartbeat is stuck in a database call."""

from __future__ import annotations

import threading
import time


def test_a_fenced_worker_steps_while_a_heartbeat_holds_the_session(tmp_path):
    from sp_dagster.config.loader import load_config
    from sp_dagster.embedded.local_cluster import LocalCluster
    from sp_dagster.worker.node import Worker

    cluster = LocalCluster(tmp_path / "cluster", "127.0.0.1:9", workers=1)  # its configuration only: nothing started
    worker = Worker(load_config(cluster.worker_conf, role="worker", node_id="worker-1"))
    worker.beat()
    assert worker.session.incarnation is not None and not worker.session.fenced
    later = time.monotonic() + 60  # a minute without a renewed heartbeat: past any fence window
    worker.session.clock = lambda: later
    # Stand-in for a heartbeat whose database call a network partition stalls: it holds the
    # session lock (a real partition needs hosts of their own: the multi-host suite's part).
    holding, release = threading.Event(), threading.Event()

    def stuck_heartbeat() -> None:
        with worker.session_lock:
            holding.set()
            release.wait(60)

    stuck = threading.Thread(target=stuck_heartbeat, daemon=True)
    stuck.start()
    holding.wait(10)
    step = threading.Thread(target=worker.step, daemon=True)
    try:
        step.start()
        step.join(5)
        assert not step.is_alive(), "the worker's loop waited for the stuck heartbeat instead of fencing"
        assert worker.session.fenced and worker.session.status().reason.startswith("could not renew its heartbeat")
    finally:
        release.set()
        stuck.join(10)
        step.join(10)
        worker.plane.close()
