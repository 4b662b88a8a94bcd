"""State revisions: compressed, numbered, pruned to revisionsToKeep, refused from a node that does
not own the instance, with the revision table in the control plane or in a database of its own."""

from __future__ import annotations

import os
import threading
import time

import pytest
from sqlalchemy import event

from sp_dagster.cluster.allocation import BalancedAllocation
from sp_dagster.cluster.db import Database
from sp_dagster.cluster.election import Elector
from sp_dagster.cluster.membership import deregister_node, heartbeat, register_node
from sp_dagster.cluster.reconcile import reconcile
from sp_dagster.cluster.store.assignments import read_placements
from sp_dagster.cluster.store.deployments import InstanceSpec, record_deployment
from sp_dagster.cluster.store.revisions import DEFAULT_TABLE, RevisionStore
from sp_dagster.errors import ControlPlaneError, NotOwnerError, PersistenceError

INSTANCE = "app-g-1"


@pytest.fixture(params=["control-plane", "own-database"])
def store(request, plane):
    """A RevisionStore (revisionsToKeep 2) in the control-plane database, then in a database of its own."""
    if request.param == "control-plane":
        revisions = RevisionStore(plane, plane)
        revisions.delete([INSTANCE, "app-g-2", "big-g-1"])  # the shared plane keeps this table between tests
    else:
        database = Database(request.getfixturevalue("other_database_url"), role="persistence database")
        revisions = RevisionStore(database, plane, table="SP_REVISIONS")
    yield revisions
    revisions.close()


class Cluster:
    """A leader and the placement of one instance, moved by hand."""

    def __init__(self, plane):
        self.plane = plane
        self.elector = Elector(plane, "sp", "m1", lease_ms=30_000)
        self.leadership = self.elector.tick()
        record_deployment(plane, "app", content_hash="h", source="s", plan={}, instances=[InstanceSpec(INSTANCE, "g", 1, "x")])

    def settle(self, node_max_age_ms: int = 60_000) -> tuple[str, int]:
        """One leader pass; returns the (node, incarnation) the instance is assigned to."""
        reconcile(self.plane, self.leadership, algorithm=BalancedAllocation(), min_resource_count=1, node_max_age_ms=node_max_age_ms)
        with self.plane.transaction() as conn:
            placed = read_placements(conn)[INSTANCE]
        return placed.node_id, placed.node_incarnation


def test_saves_compress_number_and_prune(store):
    assert store.latest(INSTANCE) is None
    state = b"window state " * 10_000
    for expected in (1, 2, 3):
        assert store.save(INSTANCE, state + bytes([expected])) == expected
    listed = store.revisions(INSTANCE)
    assert [x.revision for x in listed] == [2, 3]
    assert listed[0].raw_size == len(state) + 1 and listed[0].stored_size < listed[0].raw_size // 20
    newest = store.latest(INSTANCE)
    assert newest.revision == 3 and newest.data == state + b"\x03" and newest.saved_by is None
    store.save("app-g-2", b"other")
    assert store.prune(INSTANCE, keep=1) == 1
    assert [x.revision for x in store.revisions(INSTANCE)] == [3]
    assert store.delete([INSTANCE, "app-g-2"]) == 2
    assert store.save(INSTANCE, b"again") == 1  # numbering starts over once every revision is gone


def test_a_rescaled_instances_saves_keep_the_last_revision_from_before_the_rescale(store):
    """A new instance of a rescaled group shares its name with an old one, whose last revision the group's other new
    instances still take their state from: its saves prune everything else, never that one."""
    store.save(INSTANCE, b"old layout")
    since = store.revisions(INSTANCE)[-1].created_at + 1
    time.sleep(0.01)  # the new layout's saves come later, as they do after a rescale is recorded
    for n in range(3):
        store.save(INSTANCE, b"new layout %d" % n, keep_before=since)
    assert [x.revision for x in store.revisions(INSTANCE)] == [1, 3, 4]
    assert store.latest(INSTANCE, before_ms=since).data == b"old layout"
    store.save(INSTANCE, b"new layout 3")  # a later deploy: nothing to keep
    assert [x.revision for x in store.revisions(INSTANCE)] == [4, 5]


def test_a_large_incompressible_revision_round_trips(store):
    blob = os.urandom(3 * 1024 * 1024)
    store.save("big-g-1", blob)
    assert store.latest("big-g-1").data == blob


def test_only_the_live_owner_may_save(plane, store):
    cluster = Cluster(plane)
    register_node(plane, "w1")
    assert cluster.settle() == ("w1", 1)
    assert store.save(INSTANCE, b"s1", owner=("w1", 1)) == 1
    with pytest.raises(NotOwnerError, match="not assigned to node w2 incarnation 1; its state was not saved"):
        store.save(INSTANCE, b"not mine", owner=("w2", 1))

    register_node(plane, "w1")  # restarted: incarnation 1 is superseded
    with pytest.raises(ControlPlaneError, match="not assigned to node w1 incarnation 1"):
        store.save(INSTANCE, b"stale", owner=("w1", 1))
    assert cluster.settle() == ("w1", 2)
    assert store.save(INSTANCE, b"s2", owner=("w1", 2)) == 2

    register_node(plane, "w2")
    time.sleep(0.3)
    heartbeat(plane, "w2", 1)
    assert cluster.settle(node_max_age_ms=250) == ("w2", 1)  # w1 was silent: declared dead, its work moved
    with pytest.raises(NotOwnerError):
        store.save(INSTANCE, b"fenced", owner=("w1", 2))
    taken_over = store.latest(INSTANCE)  # what the new owner restores
    assert taken_over.data == b"s2" and taken_over.saved_by == "w1/2"
    assert store.save(INSTANCE, b"s3", owner=("w2", 1)) == 3
    assert [(r.revision, r.saved_by) for r in store.revisions(INSTANCE)] == [(2, "w1/2"), (3, "w2/1")]


def _stall_inserts(store: RevisionStore, seconds: float) -> tuple[threading.Event, callable]:
    """Make the store's next INSERT sleep; returns (an event set when it starts, a remover)."""
    started, engine, table = threading.Event(), store.database.engine, store.table.name

    def stall(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("INSERT") and table in statement and not started.is_set():
            started.set()
            time.sleep(seconds)

    event.listen(engine, "before_cursor_execute", stall)
    return started, lambda: event.remove(engine, "before_cursor_execute", stall)


def _move_during_save(plane, store, cluster) -> tuple[dict, object]:
    """Start w1's save, stalled in its INSERT; meanwhile w1 leaves and the leader gives the instance
    to w2. Returns (the save's outcome, the newest revision the moment the move committed)."""
    register_node(plane, "w1")
    assert cluster.settle() == ("w1", 1)
    register_node(plane, "w2")
    outcome: dict = {}
    started, remove = _stall_inserts(store, 1.5)

    def save():
        try:
            outcome["number"] = store.save(INSTANCE, b"w1 state", owner=("w1", 1))
        except Exception as exc:
            outcome["error"] = exc

    saver = threading.Thread(target=save)
    try:
        saver.start()
        assert started.wait(20), "the save never reached its INSERT"
        deregister_node(plane, "w1", 1)
        assert cluster.settle() == ("w2", 1)
        seen_by_new_owner = store.latest(INSTANCE)
    finally:
        saver.join(30)
        remove()
    return outcome, seen_by_new_owner


def test_in_the_control_plane_a_move_waits_for_the_save_in_flight(plane):
    store = RevisionStore(plane, plane)
    store.delete([INSTANCE])
    outcome, seen = _move_during_save(plane, store, Cluster(plane))
    # The ownership check held the assignment row: the move committed after the save, so the
    # new owner restores it, and nothing w1 writes later can land.
    assert outcome == {"number": 1}
    assert seen is not None and seen.data == b"w1 state" and seen.saved_by == "w1/1"
    with pytest.raises(NotOwnerError):
        store.save(INSTANCE, b"late", owner=("w1", 1))


def test_in_its_own_database_a_save_overtaken_by_a_move_is_refused(plane, other_database_url):
    store = RevisionStore(Database(other_database_url), plane)
    try:
        outcome, seen = _move_during_save(plane, store, Cluster(plane))
        # Ownership is read just before the commit: the move happened during the write, so it is refused.
        assert isinstance(outcome.get("error"), NotOwnerError), outcome
        assert seen is None and store.latest(INSTANCE) is None
    finally:
        store.close()


def test_a_table_that_is_not_a_revision_table_is_refused(plane):
    with plane.transaction() as conn:
        conn.exec_driver_sql("CREATE TABLE not_revisions (id INTEGER PRIMARY KEY, name VARCHAR(20))")
    try:
        with pytest.raises(
            PersistenceError, match="table not_revisions has no column siddhiAppName, revision, snapshot, savedAt: it is not a state-revision table"
        ):
            RevisionStore(plane, plane, table="not_revisions")
    finally:
        with plane.transaction() as conn:
            conn.exec_driver_sql("DROP TABLE not_revisions")


def test_keep_must_be_positive(plane):
    with pytest.raises(PersistenceError, match="revisionsToKeep must be at least 1, not 0"):
        RevisionStore(plane, plane, table=DEFAULT_TABLE, keep=0)
