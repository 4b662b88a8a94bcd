"""The leader's pass: placement, waiting, dead and restarted nodes, failover adoption, fencing."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import event, select

from sp_dagster.cluster.allocation import BalancedAllocation
from sp_dagster.cluster.election import Elector, LeadershipLost
from sp_dagster.cluster.membership import heartbeat, list_nodes, register_node
from sp_dagster.cluster.reconcile import reconcile
from sp_dagster.cluster.schema import assignments
from sp_dagster.cluster.store.assignments import assignments_for
from sp_dagster.cluster.store.deployments import InstanceSpec, get_deployment, list_instances, record_deployment
from sp_dagster.cluster.store.events import recent_events


def record(plane, app, groups):
    """groups: {name: (parallel, receiver)}"""
    instances = [
        InstanceSpec(f"{app}-{g}-{i}", g, i, f"@App:name('{app}-{g}-{i}')", receiver=receiver)
        for g, (parallel, receiver) in groups.items()
        for i in range(1, parallel + 1)
    ]
    record_deployment(plane, app, content_hash="h", source="s", plan={}, instances=instances)


def run(plane, leader, min_count=1, max_age_ms=60_000, rebalance=False):
    return reconcile(plane, leader, algorithm=BalancedAllocation(), min_resource_count=min_count, node_max_age_ms=max_age_ms, rebalance=rebalance)


def placement(plane, app=None):
    return {i.instance_id: i.node_id for i in list_instances(plane, app)}


def test_places_instances_with_the_term_and_workers_see_them(plane):
    for w in ("w1", "w2"):
        register_node(plane, w)
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    record(plane, "app", {"g": (2, False)})
    result = run(plane, leader)
    assert result.term == 1 and result.seq is not None and len(result.assigned) == 2
    assert set(placement(plane).values()) == {"w1", "w2"}
    seen = assignments_for(plane, "w1", 1)
    assert seen.term == 1 and seen.leader == "m1" and seen.leader_alive
    assert len(seen.instances) == 1 and seen.instances[0].siddhi_app.startswith("@App:name(")
    assert assignments_for(plane, "w1", 2).instances == ()  # another incarnation sees nothing
    assert run(plane, leader).seq is None  # nothing changed: nothing written
    kinds = [e.kind for e in recent_events(plane)]
    assert kinds.count("assigned") == 2 and "elected" in kinds


def test_waits_below_min_resource_count_with_the_reason(plane):
    register_node(plane, "w1")
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    record(plane, "app", {"g": (2, False)})
    run(plane, leader, min_count=2)
    deployment = get_deployment(plane, "app")
    assert deployment.status == "waiting"
    assert deployment.waiting_reason == "2 of 2 instances not placed (app-g-1: waiting for workers: 1 alive, minResourceCount is 2)"
    register_node(plane, "w2")
    run(plane, leader, min_count=2)
    assert get_deployment(plane, "app").status == "placed" and get_deployment(plane, "app").waiting_reason is None


def test_one_unplaceable_instance_leaves_its_app_partial_not_undeployed(plane):
    register_node(plane, "w1")
    register_node(plane, "r1", receiver=True)
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    record(plane, "app", {"passthrough": (2, True), "g": (2, False)})
    run(plane, leader)
    deployment = get_deployment(plane, "app")
    assert deployment.status == "partial"
    assert deployment.waiting_reason.startswith("1 of 4 instances not placed (app-passthrough-2: needs a receiver node")
    assert placement(plane) == {"app-g-1": "w1", "app-g-2": "w1", "app-passthrough-1": "r1", "app-passthrough-2": None}


def test_a_dead_nodes_instances_are_replaced_after_the_new_leaders_grace(plane):
    for w in ("w1", "w2", "w3"):
        register_node(plane, w)
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    record(plane, "app", {"g": (3, False)})
    run(plane, leader, max_age_ms=1500)
    on_w3 = [i for i, n in placement(plane).items() if n == "w3"]
    assert len(on_w3) == 1
    time.sleep(2.0)  # w3 silent for 2 s; the others heard from just now, with 1.5 s to spare on a loaded machine
    for w in ("w1", "w2"):
        heartbeat(plane, w, 1)
    result = run(plane, leader, max_age_ms=1500)
    assert result.dead == ("w3",)
    assert placement(plane)[on_w3[0]] in ("w1", "w2")
    assert {n.node_id: n.state for n in list_nodes(plane)}["w3"] == "dead"


def test_a_new_leader_gives_nodes_a_full_max_age_before_declaring_them_dead(plane):
    register_node(plane, "w1")
    time.sleep(0.35)  # w1 looks silent, e.g. after a database outage
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    assert run(plane, leader, max_age_ms=300).dead == ()
    time.sleep(0.35)
    assert run(plane, leader, max_age_ms=300).dead == ("w1",)


def test_a_restarted_node_is_given_its_work_afresh(plane):
    register_node(plane, "w1")
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    record(plane, "app", {"g": (2, False)})
    run(plane, leader)
    assert register_node(plane, "w1") == 2  # restarted under the same id
    assert assignments_for(plane, "w1", 2).instances == ()
    result = run(plane, leader)
    assert sorted(i for i, _, _ in result.assigned) == ["app-g-1", "app-g-2"]
    assert len(assignments_for(plane, "w1", 2).instances) == 2
    assert assignments_for(plane, "w1", 1).instances == ()


def test_a_new_term_adopts_the_placement(plane):
    register_node(plane, "w1")
    first = Elector(plane, "sp", "m1", lease_ms=300)
    leader = first.tick()
    record(plane, "app", {"g": (2, False)})
    run(plane, leader)
    time.sleep(0.4)
    second = Elector(plane, "sp", "m2", lease_ms=30_000).tick()
    assert second.term == 2
    seen = assignments_for(plane, "w1", 1)
    assert seen.term == 2 and len(seen.instances) == 2 and {i.term for i in seen.instances} == {2}
    with pytest.raises(LeadershipLost):
        run(plane, leader)  # the old leader can write nothing any more
    assert run(plane, second).seq is None


def test_a_worker_reading_while_a_new_leader_adopts_sees_all_it_runs(plane):
    """Under READ COMMITTED every statement has its own snapshot: a term read apart from the rows
    would miss a new leader's adoption committed in between, and the worker would stop everything."""
    if plane.dialect == "sqlite":
        pytest.skip("SQLite transactions are serializable: a writer waits for the reader, nothing interleaves")
    register_node(plane, "w1")
    leader = Elector(plane, "sp", "m1", lease_ms=300).tick()
    record(plane, "app", {"g": (2, False)})
    run(plane, leader)
    time.sleep(0.4)
    elected: list = []

    def elect_before_the_rows_are_read(conn, cursor, statement, parameters, context, executemany):
        if not elected and "JOIN sp_assignments" in statement:
            elected.append(Elector(plane, "sp", "m2", lease_ms=30_000).tick())  # its own connection, committed

    event.listen(plane.engine, "before_cursor_execute", elect_before_the_rows_are_read)
    try:
        seen = assignments_for(plane, "w1", 1)
    finally:
        event.remove(plane.engine, "before_cursor_execute", elect_before_the_rows_are_read)
    assert elected and elected[0].term == 2
    assert len(seen.instances) == 2 and seen.term == 2 and {i.term for i in seen.instances} == {2}


def test_a_worker_reading_while_its_move_is_handed_on_never_sees_the_instance_as_its_own_again(plane):
    """The rows and the moves come from one statement: a move handed on between two statements would show the
    instance still assigned to its old owner and no longer releasing, and the owner would start it again."""
    if plane.dialect == "sqlite":
        pytest.skip("SQLite transactions are serializable: a writer waits for the reader, nothing interleaves")
    register_node(plane, "w1", metrics={"running": ["app-g-1", "app-g-2"]})
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    record(plane, "app", {"g": (2, False)})
    run(plane, leader)
    register_node(plane, "w2")
    (moving,) = [m[0] for m in run(plane, leader, rebalance=True).moving]
    heartbeat(plane, "w1", 1, metrics={"running": sorted({"app-g-1", "app-g-2"} - {moving})})  # w1 let go of it
    handed: list = []

    def hand_on_after_the_rows_are_read(conn, cursor, statement, parameters, context, executemany):
        if not handed and "JOIN sp_assignments" in statement:
            handed.append(run(plane, leader))  # its own connection, committed

    event.listen(plane.engine, "after_cursor_execute", hand_on_after_the_rows_are_read)
    try:
        seen = assignments_for(plane, "w1", 1)
    finally:
        event.remove(plane.engine, "after_cursor_execute", hand_on_after_the_rows_are_read)
    assert handed and handed[0].assigned == ((moving, "w2", "w1"),)
    assert {i.instance_id: i.releasing for i in seen.instances} == {"app-g-1": "app-g-1" == moving, "app-g-2": "app-g-2" == moving}
    assert [i.instance_id for i in assignments_for(plane, "w1", 1).instances] == sorted({"app-g-1", "app-g-2"} - {moving})


def test_a_stale_leader_writes_nothing(plane):
    register_node(plane, "w1")
    leader = Elector(plane, "sp", "m1", lease_ms=300).tick()
    time.sleep(0.4)
    Elector(plane, "sp", "m2", lease_ms=30_000).tick()
    record(plane, "app", {"g": (2, False)})
    with pytest.raises(LeadershipLost):
        run(plane, leader)
    with plane.transaction() as conn:
        assert conn.execute(select(assignments)).all() == []


def test_orphaned_assignments_are_removed(plane):
    register_node(plane, "w1")
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    with plane.transaction() as conn:
        conn.execute(assignments.insert().values(instance_id="gone-g-1", node_id="w1", node_incarnation=1, term=1, seq=1, assigned_at=0))
    result = run(plane, leader)
    assert result.unassigned == (("gone-g-1", "its deployment was removed"),)


def test_rebalance_when_asked_moves_the_fewest_each_after_its_owner_let_go(plane):
    register_node(plane, "w1", metrics={"running": ["app-a-1", "app-a-2", "app-b-1", "app-b-2"]})
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    record(plane, "app", {"a": (2, False), "b": (2, False)})
    run(plane, leader)
    register_node(plane, "w2")
    assert run(plane, leader).assigned == ()  # joining alone moves nothing
    result = run(plane, leader, rebalance=True)
    # Two moves planned, one per group: each stays with w1, which is asked to let go of it.
    assert result.assigned == () and len(result.moving) == 2 and {m[1:] for m in result.moving} == {("w1", "w2")}
    moving = sorted(m[0] for m in result.moving)
    assert [i.split("-")[1] for i in moving] == ["a", "b"]
    assert {i.instance_id for i in assignments_for(plane, "w1", 1).instances if i.releasing} == set(moving)
    # w2 sees them coming (it may launch their tasks ahead), but runs nothing yet; w1 sees none coming.
    coming = assignments_for(plane, "w2", 1)
    assert coming.instances == () and sorted(i.instance_id for i in coming.incoming) == moving
    assert assignments_for(plane, "w1", 1).incoming == ()
    waiting = run(plane, leader)
    assert waiting.assigned == () and waiting.awaiting_release == 2  # w1 still says it runs them: the leader looks again soon
    heartbeat(plane, "w1", 1, metrics={"running": sorted({"app-a-1", "app-a-2", "app-b-1", "app-b-2"} - set(moving))})
    result = run(plane, leader)
    assert sorted(result.assigned) == [(i, "w2", "w1") for i in moving] and result.awaiting_release == 0
    assert sorted(placement(plane).values()) == ["w1", "w1", "w2", "w2"]
    assert not any(i.releasing for i in assignments_for(plane, "w1", 1).instances)
    assert assignments_for(plane, "w2", 1).incoming == ()  # placed there now: no longer on their way
    kinds = [e.kind for e in recent_events(plane)]
    assert kinds.count("move-planned") == 2 and kinds.count("release-asked") == 2


def test_moves_of_one_group_go_one_at_a_time(plane):
    everything = ["app-g-1", "app-g-2", "app-g-3", "app-g-4"]
    register_node(plane, "w1", metrics={"running": everything})
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    record(plane, "app", {"g": (4, False)})
    run(plane, leader)
    register_node(plane, "w2")
    first = run(plane, leader, rebalance=True).moving
    assert len(first) == 1  # two of the group's instances move, but only one at a time
    heartbeat(plane, "w1", 1, metrics={"running": [i for i in everything if i != first[0][0]]})
    second = run(plane, leader)
    assert [a[0] for a in second.assigned] == [first[0][0]] and len(second.moving) == 1 and second.moving[0][0] != first[0][0]


def test_an_owner_is_asked_to_let_go_once_the_new_node_is_ready_for_the_instance(plane, monkeypatch):
    """A worker that launches tasks ahead says which incoming instances it is ready for: the owner lets go only then
    (or after READY_WAIT_MS), so that the instance starts the moment it is placed."""
    from sp_dagster.cluster.store import moves as moves_module

    everything = ["app-g-1", "app-g-2", "app-g-3"]
    register_node(plane, "w1", metrics={"running": everything})
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    record(plane, "app", {"g": (3, False)})
    run(plane, leader)
    register_node(plane, "w2", metrics={"ready": []})
    planned = run(plane, leader, rebalance=True)
    assert planned.moving == () and planned.awaiting_release == 0  # planned, not asked: w2 is not ready yet
    (coming,) = [i.instance_id for i in assignments_for(plane, "w2", 1).incoming]  # w2 sees it coming already
    assert not any(i.releasing for i in assignments_for(plane, "w1", 1).instances)
    heartbeat(plane, "w2", 1, metrics={"ready": ["app-other-1"]})
    assert run(plane, leader).moving == ()  # ready for something else only
    heartbeat(plane, "w2", 1, metrics={"ready": [coming]})
    assert [m[0] for m in run(plane, leader).moving] == [coming]
    assert {i.instance_id for i in assignments_for(plane, "w1", 1).instances if i.releasing} == {coming}
    # A new node that never says it is ready gets its instance after READY_WAIT_MS all the same.
    heartbeat(plane, "w1", 1, metrics={"running": [i for i in everything if i != coming]})
    assert [a[0] for a in run(plane, leader).assigned] == [coming]
    register_node(plane, "w3", metrics={"ready": []})
    assert run(plane, leader, rebalance=True).moving == ()
    monkeypatch.setattr(moves_module, "READY_WAIT_MS", 0)
    assert [m[1:] for m in run(plane, leader).moving] == [("w1", "w3")]


def test_a_move_whose_owner_stalls_goes_after_the_timeout_and_a_dead_owners_at_once(plane, monkeypatch):
    from sp_dagster.cluster import reconcile as reconcile_module
    from sp_dagster.cluster.store.moves import read_moves

    everything = ["app-g-1", "app-g-2", "app-g-3", "app-g-4"]
    register_node(plane, "w1", metrics={"running": everything})
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    record(plane, "app", {"g": (4, False)})
    run(plane, leader)
    register_node(plane, "w2")
    (first,) = run(plane, leader, rebalance=True).moving
    monkeypatch.setattr(reconcile_module, "MOVE_TIMEOUT_MS", 0)  # w1 never lets go: it goes anyway
    result = run(plane, leader)
    assert [a[:2] for a in result.assigned] == [(first[0], "w2")] and len(result.moving) == 1
    monkeypatch.setattr(reconcile_module, "MOVE_TIMEOUT_MS", 60_000)
    time.sleep(2.0)  # w1 silent for 2 s; w2 heard from just now, with 1.5 s to spare on a loaded machine
    heartbeat(plane, "w2", 1)
    result = run(plane, leader, max_age_ms=1500)  # w1 went silent: dead, its instances placed at once
    assert result.dead == ("w1",) and sorted(placement(plane).values()) == ["w2"] * 4
    with plane.transaction() as conn:
        assert read_moves(conn) == {}


def test_a_node_that_cannot_reach_the_broker_hands_its_instances_over_unless_none_can(plane):
    everything = ["app-g-1", "app-g-2", "app-g-3", "app-g-4"]
    register_node(plane, "w1", metrics={"running": everything, "broker": "reachable"})
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    record(plane, "app", {"g": (4, False)})
    run(plane, leader)
    register_node(plane, "w2", metrics={"broker": "unreachable"})
    run(plane, leader, rebalance=True)  # w2 cannot reach the broker: nothing goes there, not even by a move
    assert sorted(placement(plane).values()) == ["w1"] * 4
    # The broker is down for everyone (both say so): both count as usual, nothing is taken off.
    heartbeat(plane, "w1", 1, metrics={"running": everything, "broker": "unreachable"})
    result = run(plane, leader, rebalance=True)
    assert result.cut_off == () and result.alive == ("w1", "w2") and result.assigned == () and result.unassigned == ()
    assert sorted(placement(plane).values()) == ["w1"] * 4 and len(result.moving) == 1  # a graceful move, as any rebalance
    # Only w1 is cut off from it: its instances go to w2 at once, without waiting for w1 to let go.
    heartbeat(plane, "w2", 1, metrics={"broker": "reachable"})
    result = run(plane, leader)
    assert result.cut_off == ("w1",) and result.alive == ("w2",)
    assert sorted(a[:3] for a in result.assigned) == [(i, "w2", "w1") for i in everything] and result.moving == ()
    # Back in reach: w1 counts again (the manager then rebalances, by graceful moves).
    heartbeat(plane, "w1", 1, metrics={"running": [], "broker": "reachable"})
    result = run(plane, leader, rebalance=True)
    assert result.cut_off == () and result.alive == ("w1", "w2") and len(result.moving) == 1


LOCKED_APP = """@App:name('Locked')
@source(type='http', receiver.url='http://127.0.0.1:8290/readings', basic.auth.enabled='true', @map(type='json'))
define stream Readings (device string, watts double);
@sink(type='log')
define stream Heavy (device string, watts double);
@info(name='heavy') @dist(execGroup='g', parallel='2')
from Readings[watts > 100.0] select device, watts insert into Heavy;
"""


@pytest.mark.parametrize(
    "text, setting, metric",
    [
        (LOCKED_APP, "receiverUsers", "receiver_users"),
        (LOCKED_APP.replace("http://", "https://").replace(", basic.auth.enabled='true'", ""), "receiverTls", "receiver_tls"),
    ],
    ids=["basic-auth", "https"],
)
def test_a_receiver_waits_for_a_node_that_can_serve_it(plane, text, setting, metric):
    from sp_dagster.deploy import instance_specs, load_app

    register_node(plane, "w1")
    first = register_node(plane, "r1", receiver=True)  # no receiverUsers / receiverTls in its deployment.yaml
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    specs = instance_specs(load_app(text=text).topology)
    record_deployment(plane, "Locked", content_hash="h", source="s", plan={}, instances=specs)
    run(plane, leader)
    receiver = next(s.instance_id for s in specs if s.receiver)
    assert placement(plane)[receiver] is None
    assert f"none of the 2 nodes alive has deployment.config.{setting}:" in get_deployment(plane, "Locked").waiting_reason
    assert {n for i, n in placement(plane).items() if i != receiver} == {"w1"}  # the rest runs meanwhile
    heartbeat(plane, "r1", first, metrics={metric: True})  # its operator added the setting and restarted it
    run(plane, leader)
    assert placement(plane)[receiver] == "r1"
    assert get_deployment(plane, "Locked").status == "placed"


def test_instances_go_only_to_workers_that_read_their_wire_format(plane):
    from sp_dagster.deploy import instance_specs, load_app
    from tests.fixtures.trades import APP

    old = register_node(plane, "w-old")
    heartbeat(plane, "w-old", old, metrics={"wire_formats": ["event/1", "batch/1"]})  # a worker of a version before batches by column
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    specs = instance_specs(load_app(text=APP).topology)
    assert [s.extra.get("wire_formats") for s in specs] == [["batch/2"]] * len(specs)  # both groups meet at one inter-group topic
    record_deployment(plane, "Trades", content_hash="h", source="s", plan={}, instances=specs)
    run(plane, leader)
    assert set(placement(plane).values()) == {None}
    assert "which none of the 1 node alive reads: upgrade the workers" in get_deployment(plane, "Trades").waiting_reason
    new = register_node(plane, "w-new")
    heartbeat(plane, "w-new", new, metrics={"wire_formats": ["event/1", "batch/1", "batch/2"]})
    run(plane, leader)
    assert set(placement(plane).values()) == {"w-new"}
