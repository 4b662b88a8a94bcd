"""The worker-side fencing helper: when a worker must stop everything, and how it rejoins."""

from __future__ import annotations

import time

from sp_dagster.cluster.allocation import BalancedAllocation
from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.election import Elector, fenced
from sp_dagster.cluster.fencing import NodeSession
from sp_dagster.cluster.membership import declare_dead_nodes, register_node
from sp_dagster.cluster.reconcile import reconcile
from sp_dagster.cluster.store.deployments import InstanceSpec, record_deployment
from sp_dagster.embedded.broker import free_port


class FakeClock:
    """This process's monotonic clock, advanced by the test (the database keeps its own)."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def session(plane, clock=None, **timing):
    timing = {"heartbeat_interval_ms": 1000, "heartbeat_max_retry": 3, "leader_retry_interval_ms": 5000, **timing}
    return NodeSession(plane, "w1", address="h:9090", clock=clock or time.monotonic, **timing)


def test_registers_then_heartbeats_and_follows_the_leaders_pace(plane):
    Elector(plane, "sp", "m1", lease_ms=30_000, node_heartbeat_ms=250, node_max_retry=4).tick()
    s = session(plane)
    first = s.beat()
    assert (first.incarnation, first.fenced) == (1, False)
    second = s.beat()
    assert second.leader == "m1" and second.leader_alive and second.term == 1
    assert s.heartbeat_interval_s == 0.25 and s.fence_after_s == 0.875


def test_declared_dead_fences_and_rejoin_is_a_new_incarnation(plane):
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    s = session(plane)
    s.beat()
    time.sleep(0.3)
    with fenced(plane, leader) as fence:
        declare_dead_nodes(fence, 200)
    status = s.beat()
    assert status.fenced and "declared dead" in status.reason
    assert s.assignments().instances == ()
    assert s.beat().incarnation == 1  # stays fenced until the worker says it stopped everything
    s.acknowledge_fence()
    rejoined = s.beat()
    assert (rejoined.incarnation, rejoined.fenced) == (2, False)


def test_superseded_incarnation_is_fenced(plane):
    s = session(plane)
    s.beat()
    register_node(plane, "w1")  # the same id started elsewhere
    status = s.beat()
    assert status.fenced and "superseded by incarnation 2" in status.reason


def test_unreachable_control_plane_fences_before_the_leader_would_declare_death(plane):
    clock = FakeClock()
    s = session(plane, clock)
    s.beat()
    s.plane = ControlPlane(f"postgresql+psycopg://sp@127.0.0.1:{free_port()}/gone")  # the database goes away
    clock.now += 1.0
    assert not s.beat().fenced  # one missed heartbeat is fine
    clock.now += 1.6
    status = s.beat()
    # 3 x 1 s would let the leader declare it dead; it stops at 2.5 s, before that can happen.
    assert status.fenced and "could not renew its heartbeat for 2.6 s (limit 2.5 s)" in status.reason


def test_no_live_leader_for_leader_retry_interval_fences(plane):
    clock = FakeClock()
    s = session(plane, clock, leader_retry_interval_ms=2000)
    s.beat()
    clock.now += 1.0
    assert not s.beat().fenced
    clock.now += 1.1
    status = s.beat()
    assert status.fenced and "saw no live manager for 2.1 s" in status.reason


def test_a_fenced_worker_sees_no_assignments_and_reports_nothing(plane):
    s = session(plane)
    s.beat()
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    record_deployment(plane, "app", content_hash="h", source="s", plan={}, instances=[InstanceSpec("app-g-1", "g", 1, "x")])
    reconcile(plane, leader, algorithm=BalancedAllocation(), min_resource_count=1, node_max_age_ms=60_000)
    assert [i.instance_id for i in s.assignments().instances] == ["app-g-1"]
    assert s.report("app-g-1", "running")
    register_node(plane, "w1")
    s.beat()
    assert s.fenced and s.assignments().instances == ()
    assert not s.report("app-g-1", "failed")


def test_leave_lets_the_leader_replace_the_work_at_once(plane):
    s = session(plane)
    s.beat()
    s.leave()
    status = s.beat()
    assert status.fenced and "is left" in status.reason
