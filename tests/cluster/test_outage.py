"""The database goes away under a running cluster and comes back: everyone survives it.

A real server (our own, not the session's) is crashed (immediate shutdown) while two manager
processes and two workers run, then started again on the same port and data directory.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.membership import list_nodes
from sp_dagster.cluster.processes import ManagerProcess, manager_config
from sp_dagster.cluster.store.deployments import InstanceSpec, get_deployment, list_instances, record_deployment
from tests.cluster.helpers import Workers, settled
from tests.cluster.history import Observer, check_history
from tests.fixtures.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
TIMING = dict(heartbeat_interval_ms=200, heartbeat_max_retry=3, event_polling_interval_ms=200, worker_heartbeat_interval_ms=150, worker_heartbeat_max_retry=4)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["postgresql", "mariadb"])
def test_cluster_survives_the_database_going_away(tmp_path, database_server_factory, kind):
    server = database_server_factory(kind)
    url = server.create_database()
    plane = ControlPlane(url)
    plane.migrate()
    conf = tmp_path / "manager.yaml"
    conf.write_text(manager_config(url, **TIMING))
    procs = [ManagerProcess(conf, f"m{i}", journal=tmp_path / f"m{i}.jsonl", log_path=tmp_path / f"m{i}.log", cwd=ROOT).start() for i in (1, 2)]
    observer = Observer(ControlPlane(url))
    workers = Workers(ControlPlane(url), ["w1", "w2"], interval_ms=150, max_retry=4)
    try:
        with workers:
            record_deployment(plane, "app", content_hash="h", source="s", plan={}, instances=[InstanceSpec(f"app-g-{i}", "g", i, "x") for i in (1, 2, 3)])
            before = wait_until(lambda: settled(plane), timeout=30, what="placement before the outage")
            observer.start()
            wait_until(lambda: all(p.ready for p in procs), what="managers to start")

            server.stop(immediate=True)
            time.sleep(3)
            assert all(p.alive for p in procs), "a manager died with the database"
            assert all(s.fenced for s in workers.sessions.values()), "workers must fence themselves"
            assert all("could not renew its heartbeat" in s.fence_reason for s in workers.sessions.values())
            server.start()

            # The fenced workers rejoin afresh (a new incarnation each; a worker whose first heartbeats
            # are too slow while the server recovers fences itself again and rejoins once more) and
            # get their work again: placed on their current incarnations, in the new leader's term.
            def recovered():
                rejoined = all(n.incarnation >= 2 for n in list_nodes(plane)) and len(list_nodes(plane)) == 2
                return rejoined and settled(plane)

            after = wait_until(recovered, timeout=40, what="recovery after the outage")
            assert after.term > before.term  # the old lease expired meanwhile: a new term took over
            assert {i.node_id for i in list_instances(plane)} <= {"w1", "w2"}
            assert get_deployment(plane, "app").status == "placed"
            for proc in procs:  # the standby reconnects too, on its own backoff
                wait_until(lambda: "is reachable again after" in Path(proc.log_path).read_text(), what=f"{proc.node_id} to reconnect")
    finally:
        observer.stop.set()
        for proc in procs:
            wait_until(lambda: proc.ready or not proc.alive, timeout=30, what=f"{proc.node_id} to start")
        codes = [p.stop() for p in procs]
        observer.join(5)
    assert codes == [0, 0]
    for proc in procs:
        log = Path(proc.log_path).read_text()
        assert log.count("is unreachable:") == 1, log  # one line when it goes ...
        assert log.count("is reachable again after") == 1, log  # ... and one when it is back
        assert "Traceback" not in log
    check_history(plane, [Path(p.journal) for p in procs], observer)
    plane.close()
