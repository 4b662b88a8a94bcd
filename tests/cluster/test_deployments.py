"""Recording deployments and instances, removing them, and workers' status reports."""

from __future__ import annotations

import pytest

from sp_dagster.cluster.allocation import BalancedAllocation
from sp_dagster.cluster.election import Elector
from sp_dagster.cluster.membership import register_node
from sp_dagster.cluster.reconcile import reconcile
from sp_dagster.cluster.store.assignments import assignments_for
from sp_dagster.cluster.store.deployments import (
    InstanceSpec,
    get_deployment,
    instance_id_for,
    list_deployments,
    list_instances,
    record_deployment,
    remove_deployment,
    report_instance_status,
)
from sp_dagster.errors import ControlPlaneError


def specs(app, group="g", parallel=2, text="from S select * insert into T;", extra=None):
    return [
        InstanceSpec(instance_id_for(app, group, i), group, i, f"@App:name('{app}-{group}-{i}')\n{text}", extra=extra or {"topics": ["t"]})
        for i in range(1, parallel + 1)
    ]


def record(plane, app, instances, content_hash="h1"):
    return record_deployment(plane, app, content_hash=content_hash, source="-- source", plan={"groups": 1}, instances=instances)


def place(plane, leader):
    return reconcile(plane, leader, algorithm=BalancedAllocation(), min_resource_count=1, node_max_age_ms=60_000)


def test_record_then_read_back(plane):
    result = record(plane, "orders", specs("orders"))
    assert result.changed and result.generation == 1 and result.added == ("orders-g-1", "orders-g-2")
    deployment = get_deployment(plane, "orders")
    assert (deployment.status, deployment.plan, deployment.source) == ("waiting", {"groups": 1}, "-- source")
    assert deployment.waiting_reason == "recorded; waiting for the leader manager to place it"
    rows = list_instances(plane, "orders")
    assert [(r.instance_id, r.group, r.parallel_index, r.status, r.node_id) for r in rows] == [
        ("orders-g-1", "g", 1, "pending", None),
        ("orders-g-2", "g", 2, "pending", None),
    ]
    assert rows[0].extra == {"topics": ["t"]}
    assert [d.app for d in list_deployments(plane)] == ["orders"]


def test_recording_the_same_app_twice_changes_nothing(plane):
    record(plane, "orders", specs("orders"))
    again = record(plane, "orders", specs("orders"))
    assert not again.changed and again.generation == 1 and again.unchanged == ("orders-g-1", "orders-g-2")


def test_a_changed_app_keeps_the_placement_of_unchanged_instances(plane):
    register_node(plane, "w1")
    register_node(plane, "w2")
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    record(plane, "orders", specs("orders", parallel=2) + specs("orders", group="h", parallel=1))
    place(plane, leader)
    before = {r.instance_id: r.node_id for r in list_instances(plane, "orders")}
    changed = specs("orders", parallel=3) + specs("orders", group="h", parallel=1, text="from S[x > 1] select * insert into T;")
    result = record(plane, "orders", changed, content_hash="h2")
    assert result.generation == 2
    assert (result.added, result.updated, result.removed) == (("orders-g-3",), ("orders-h-1",), ())
    assert result.unchanged == ("orders-g-1", "orders-g-2")
    place(plane, leader)
    after = {r.instance_id: r.node_id for r in list_instances(plane, "orders")}
    for kept in ("orders-g-1", "orders-g-2", "orders-h-1"):
        assert after[kept] == before[kept]
    assert after["orders-g-3"] is not None
    shrunk = record(plane, "orders", specs("orders", parallel=1), content_hash="h3")
    assert shrunk.removed == ("orders-g-2", "orders-g-3", "orders-h-1")
    assert {r.instance_id for r in list_instances(plane, "orders")} == {"orders-g-1"}


def test_remove_deployment_takes_its_assignments_away(plane):
    register_node(plane, "w1")
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    record(plane, "orders", specs("orders"))
    record(plane, "other", specs("other", parallel=1))
    place(plane, leader)
    assert len(assignments_for(plane, "w1", 1).instances) == 3
    assert remove_deployment(plane, "orders")
    assert [i.instance_id for i in assignments_for(plane, "w1", 1).instances] == ["other-g-1"]
    assert not remove_deployment(plane, "orders")
    assert [d.app for d in list_deployments(plane)] == ["other"]


def test_only_the_assignee_incarnation_may_report(plane):
    register_node(plane, "w1")
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    record(plane, "orders", specs("orders", parallel=1))
    place(plane, leader)
    assert report_instance_status(plane, "w1", 1, "orders-g-1", "running", detail="ok", metrics={"rows_in": 10})
    assert not report_instance_status(plane, "w1", 2, "orders-g-1", "failed")
    assert not report_instance_status(plane, "w2", 1, "orders-g-1", "failed")
    row = list_instances(plane, "orders")[0]
    assert (row.status, row.status_detail, row.metrics) == ("running", "ok", {"rows_in": 10})
    with pytest.raises(ControlPlaneError, match="instance status must be one of"):
        report_instance_status(plane, "w1", 1, "orders-g-1", "great")


@pytest.mark.parametrize(
    "bad, message",
    [
        ([InstanceSpec("a-g-1", "g", 1, "x"), InstanceSpec("a-g-1", "g", 2, "x")], "instance id 'a-g-1' appears twice"),
        ([InstanceSpec("a-g-0", "g", 0, "x")], "has parallel index 0; indexes start at 1"),
        ([InstanceSpec("a-g-1", "g", 1, "x", extra={"when": object()})], "is not JSON-serialisable"),
    ],
)
def test_bad_instances_are_refused_with_one_line(plane, bad, message):
    with pytest.raises(ControlPlaneError, match=message):
        record(plane, "a", bad)


def test_an_instance_id_belongs_to_one_app(plane):
    record(plane, "a", [InstanceSpec("shared-1", "g", 1, "x")])
    with pytest.raises(ControlPlaneError, match="instance id 'shared-1' already belongs to app 'a'"):
        record(plane, "b", [InstanceSpec("shared-1", "g", 1, "x")])
