"""The worker's database store: checkpoints saved as revisions of the one revision store, per the
seeds' `state.persistence` block, restored by the worker that takes an instance over."""

from __future__ import annotations

import gzip
import io
import tarfile
import time
from pathlib import Path

import pytest
from sqlalchemy import inspect
from sqlalchemy.engine import make_url

from sp_dagster.cluster.allocation import BalancedAllocation
from sp_dagster.cluster.db import ControlPlane, Database
from sp_dagster.cluster.election import Elector
from sp_dagster.cluster.membership import heartbeat, register_node
from sp_dagster.cluster.reconcile import reconcile
from sp_dagster.cluster.store.deployments import InstanceSpec, record_deployment
from sp_dagster.config import parse_config
from sp_dagster.errors import NotOwnerError
from sp_dagster.worker.persistence import DatabaseStore, store_for
from tests.cluster.helpers import all_at_once, first_revision_layout

INSTANCE = "Trades-avg-1"

WORKER_CONF = """
deployment.config:
  type: distributed
  datasource: SP_MGT_DB
datasources:
  SP_MGT_DB: {control}
  WSO2_PERSISTENCE_DB: {persistence}
state.persistence:
  enabled: true
  intervalInMin: 1
  revisionsToKeep: 2
  persistenceStore: org.wso2.carbon.stream.processor.core.persistence.DBPersistenceStore
  config:
    datasource: WSO2_PERSISTENCE_DB
    table: {table}
"""


@pytest.fixture
def another_database(database_url, request, tmp_path):
    """Makes fresh empty databases on the backend of `database_url`."""
    backend = make_url(database_url).get_backend_name()

    def make() -> str:
        if backend == "sqlite":
            return f"sqlite:///{tmp_path / f'persistence-{time.monotonic_ns()}.db'}"
        return request.getfixturevalue("postgres_server" if backend == "postgresql" else "mariadb_server").create_database()

    return make


def worker_config(node_id: str, control: str, persistence: str, table: str = "PERSISTENCE_TABLE"):
    return parse_config(WORKER_CONF.format(control=control, persistence=persistence, table=table), node_id=node_id)


def write_checkpoint(directory: Path, batch: int) -> dict[str, bytes]:
    """A checkpoint-shaped directory as of `batch`; returns its files' contents by relative path."""
    files = {
        "metadata": b'{"id":"q"}',
        f"commits/{batch}": f'v1\n{{"batch":{batch}}}'.encode(),
        f"offsets/{batch}": f'v1\n{{"p0":{batch * 100}}}'.encode(),
        f"state/0/0/{batch}.changelog": bytes(range(256)) * (batch + 1),
    }
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    return files


def read_tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where", ["control-plane", "own-database"])
def test_a_takeover_restores_the_newest_revision_and_the_old_owner_is_refused(where, database_url, another_database, tmp_path):
    persistence_url = database_url if where == "control-plane" else another_database()
    plane = ControlPlane(database_url)
    plane.migrate()
    w1 = store_for(worker_config("w1", database_url, persistence_url, table="SP_STATE"), tmp_path / "w1", plane)
    w2 = store_for(worker_config("w2", database_url, persistence_url, table="SP_STATE"), tmp_path / "w2", plane)
    try:
        assert isinstance(w1, DatabaseStore) and w1.revisions.shares_control_plane == (where == "control-plane")
        # The table named in state.persistence.config.table, in that datasource only.
        with Database(persistence_url) as persistence, persistence.transaction() as conn:
            assert inspect(conn).has_table("SP_STATE")
        if where == "own-database":
            with plane.transaction() as conn:
                assert not inspect(conn).has_table("SP_STATE")

        elector = Elector(plane, "sp", "m1", lease_ms=30_000)
        leadership = elector.tick()
        record_deployment(plane, "Trades", content_hash="h", source="s", plan={}, instances=[InstanceSpec(INSTANCE, "avg", 1, "x")])
        register_node(plane, "w1")
        reconcile(plane, leadership, algorithm=BalancedAllocation(), min_resource_count=1, node_max_age_ms=60_000)

        checkpoint = w1.checkpoint_root("w1") / INSTANCE
        for batch in (1, 2, 3):
            write_checkpoint(checkpoint, batch)
            w1.save(INSTANCE, checkpoint, owner=("w1", 1))
        last_saved = read_tree(checkpoint)
        assert [r.revision for r in w1.revisions.revisions(INSTANCE)] == [2, 3]  # revisionsToKeep: 2

        register_node(plane, "w2")
        time.sleep(0.3)
        heartbeat(plane, "w2", 1)  # w1 has gone silent; w2 has not
        moved = reconcile(plane, leadership, algorithm=BalancedAllocation(), min_resource_count=1, node_max_age_ms=250)
        assert moved.dead == ("w1",) and moved.assigned == ((INSTANCE, "w2", "w1"),)

        write_checkpoint(checkpoint, 4)  # w1 has not noticed yet: its save must not land
        with pytest.raises(NotOwnerError, match=f"{INSTANCE} is not assigned to node w1 incarnation 1"):
            w1.save(INSTANCE, checkpoint, owner=("w1", 1))

        taken_over = w2.checkpoint_root("w2") / INSTANCE
        write_checkpoint(taken_over, 0)  # a stale local copy from long ago goes
        assert w2.restore(INSTANCE, taken_over)
        assert read_tree(taken_over) == last_saved
        assert [(r.revision, r.saved_by) for r in w2.revisions.revisions(INSTANCE)] == [(2, "w1/1"), (3, "w1/1")]
        assert not w2.restore("Trades-other-1", w2.checkpoint_root("w2") / "Trades-other-1")
    finally:
        w1.close()
        w2.close()
        plane.close()


def test_checkpoints_of_the_first_database_store_are_restored(database_url, another_database, tmp_path):
    """A persistence table written before revisions were numbered (gzip'd tar snapshots) is upgraded
    in place by the first stores that open it, all at once, and its checkpoints restore."""
    persistence_url = another_database()
    source = tmp_path / "old"
    files = write_checkpoint(source, 7)
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as archive:
        for name in sorted(p.name for p in source.iterdir()):
            archive.add(source / name, arcname=name)
    old = first_revision_layout()
    with Database(persistence_url) as persistence, persistence.transaction() as conn:
        old.create(conn)
        conn.execute(
            old.insert(),
            [
                dict(siddhiAppName=INSTANCE, revision=f"{at}__{INSTANCE}", snapshot=blob, savedAt=at)
                for at, blob in ((1000, gzip.compress(b"not a tar: never restored")), (2000, packed.getvalue()))
            ],
        )

    plane = ControlPlane(database_url)
    plane.migrate()
    stores = all_at_once(lambda i: store_for(worker_config(f"w{i}", database_url, persistence_url), tmp_path / f"w{i}", plane), range(4))
    try:
        listed = stores[0].revisions.revisions(INSTANCE)
        assert [(r.revision, r.created_at, r.saved_by) for r in listed] == [(1, 1000, None), (2, 2000, None)]
        assert listed[1].raw_size == len(gzip.decompress(packed.getvalue()))
        target = tmp_path / "restored"
        assert stores[1].restore(INSTANCE, target)
        assert read_tree(target) == files
        assert stores[2].revisions.save(INSTANCE, b"next") == 3
    finally:
        for store in stores:
            store.close()
        plane.close()


def test_one_sqlite_file_spelled_two_ways_is_one_database(tmp_path, monkeypatch):
    """Ownership is then checked in the save's own transaction (a second transaction on the same
    file would wait for the first)."""
    monkeypatch.chdir(tmp_path)
    plane = ControlPlane(f"sqlite:///{tmp_path / 'cluster.db'}")
    plane.migrate()
    store = store_for(worker_config("w1", plane.url, "sqlite:///./cluster.db"), tmp_path, plane)
    try:
        assert store.revisions.database is plane and store.revisions.shares_control_plane
    finally:
        store.close()
        plane.close()


def test_a_worker_saves_under_its_current_incarnation_and_not_after_a_restart(database_url, tmp_path, caplog):
    from sp_dagster.worker.node import RunningInstance, Worker

    plane = ControlPlane(database_url)
    plane.migrate()
    worker = Worker(worker_config("w1", database_url, database_url), spark=object(), plane=plane)
    try:
        worker.beat()  # registers: incarnation 1
        elector = Elector(plane, "sp", "m1", lease_ms=30_000)
        record_deployment(plane, "Trades", content_hash="h", source="s", plan={}, instances=[InstanceSpec(INSTANCE, "avg", 1, "x")])
        reconcile(plane, elector.tick(), algorithm=BalancedAllocation(), min_resource_count=1, node_max_age_ms=60_000)
        checkpoint = worker.checkpoints / INSTANCE
        write_checkpoint(checkpoint, 1)
        worker.running[INSTANCE] = RunningInstance(INSTANCE, "h", handle=None, checkpoint=checkpoint)
        worker.save_all()
        assert [(r.revision, r.saved_by) for r in worker.store.revisions.revisions(INSTANCE)] == [(1, "w1/1")]

        register_node(plane, "w1")  # the same id started elsewhere: this process is superseded
        with caplog.at_level("INFO", logger="sp_dagster.worker.node"):
            worker.save_all()
        assert f"instance {INSTANCE} is not assigned to node w1 incarnation 1; its state was not saved" in caplog.text
        assert [r.revision for r in worker.store.revisions.revisions(INSTANCE)] == [1]
    finally:
        worker.store.close()
        plane.close()


@pytest.mark.parametrize("kind", ["database", "file"])
def test_a_rescaled_start_reads_the_old_instances_state_not_what_a_new_instance_of_the_same_name_saved_since(kind, sqlite_url, tmp_path):
    from sp_dagster.worker.instance.checkpoints import Checkpoint
    from sp_dagster.worker.persistence import FileStore
    from sp_dagster.worker.spark.continuous import CHECKPOINT_FILE

    def checkpoint(snapshot: bytes) -> bytes:
        return Checkpoint({("t", 0): len(snapshot)}, snapshot, int(time.time() * 1000)).encode()

    if kind == "database":
        plane = ControlPlane(sqlite_url)
        plane.migrate()
        record_deployment(plane, "Trades", content_hash="h", source="s", plan={}, instances=[InstanceSpec(INSTANCE, "avg", 1, "x")])
        register_node(plane, "w1")
        reconcile(plane, Elector(plane, "sp", "m1", lease_ms=30_000).tick(), algorithm=BalancedAllocation(), min_resource_count=1, node_max_age_ms=60_000)
        store = store_for(worker_config("w1", sqlite_url, f"sqlite:///{tmp_path / 'persistence.db'}"), tmp_path / "w1", plane)
    else:
        plane, store = None, FileStore(str(tmp_path / "shared"))
    try:
        old, new = store.checkpoint_root("w1") / INSTANCE / "old-version", store.checkpoint_root("w1") / INSTANCE / "new-version"
        for directory, snapshot in ((old, b"old layout: every key it had"), (new, b"new layout: the keys it owns now")):
            directory.mkdir(parents=True)
            (directory / CHECKPOINT_FILE).write_bytes(checkpoint(snapshot))
            store.save(INSTANCE, directory, owner=("w1", 1))
            if directory == old:
                time.sleep(0.02)
                since = int(time.time() * 1000)  # the rescale is recorded between the two
                time.sleep(0.02)
        assert Checkpoint.decode(store.newest_checkpoint(INSTANCE) or b"").snapshot == b"new layout: the keys it owns now"
        assert Checkpoint.decode(store.newest_checkpoint(INSTANCE, before_ms=since) or b"").snapshot == b"old layout: every key it had"
        assert store.newest_checkpoint(INSTANCE, before_ms=since - 1000) is None
    finally:
        store.close()
        if plane is not None:
            plane.close()
