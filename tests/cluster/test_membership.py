"""Resource nodes: registration, incarnations, heartbeats, death and leaving."""

from __future__ import annotations

import time

from sp_dagster.cluster.election import Elector, fenced
from sp_dagster.cluster.membership import (
    ALIVE,
    DEAD,
    LEFT,
    declare_dead_nodes,
    deregister_node,
    heartbeat,
    list_nodes,
    register_node,
)


def node(plane, node_id):
    return {n.node_id: n for n in list_nodes(plane)}[node_id]


def test_registration_counts_incarnations_and_refuses_the_old_one(plane):
    assert register_node(plane, "w1", address="h:1", metrics={"cpu": 0.5}) == 1
    first = node(plane, "w1")
    assert (first.role, first.state, first.address, first.metrics) == ("worker", ALIVE, "h:1", {"cpu": 0.5})
    assert register_node(plane, "w1", receiver=True) == 2
    assert node(plane, "w1").receiver
    stale = heartbeat(plane, "w1", 1)
    assert not stale.accepted
    assert stale.reason == "node 'w1' incarnation 1 was superseded by incarnation 2"
    assert heartbeat(plane, "w1", 2).accepted


def test_heartbeat_moves_the_database_timestamp_and_reports_the_leader(plane):
    register_node(plane, "w1")
    before = node(plane, "w1").last_heartbeat
    reply = heartbeat(plane, "w1", 1, metrics={"load": 2})
    assert reply.accepted and reply.leader is None and not reply.leader_alive
    time.sleep(0.02)
    Elector(plane, "sp", "m1", lease_ms=5000, node_heartbeat_ms=700, node_max_retry=3).tick()
    reply = heartbeat(plane, "w1", 1)
    assert reply.leader_alive and reply.leader.holder == "m1"
    assert (reply.leader.node_heartbeat_ms, reply.leader.node_max_retry) == (700, 3)
    after = node(plane, "w1")
    assert after.last_heartbeat > before and after.metrics == {"load": 2}


def test_silent_nodes_are_declared_dead_and_must_register_again(plane):
    register_node(plane, "w1")
    register_node(plane, "w2")
    lead = Elector(plane, "sp", "m1", lease_ms=5000).tick()
    time.sleep(0.3)
    assert heartbeat(plane, "w2", 1).accepted
    with fenced(plane, lead) as fence:
        assert declare_dead_nodes(fence, max_age_ms=200) == ["w1"]
    assert node(plane, "w1").state == DEAD and node(plane, "w2").state == ALIVE
    refused = heartbeat(plane, "w1", 1)
    assert not refused.accepted and "declared dead by the leader" in refused.reason
    assert register_node(plane, "w1") == 2 and node(plane, "w1").state == ALIVE


def test_a_node_that_leaves_is_no_longer_alive(plane):
    register_node(plane, "w1")
    assert deregister_node(plane, "w1", 1)
    assert node(plane, "w1").state == LEFT
    assert not deregister_node(plane, "w1", 1)
    assert heartbeat(plane, "w1", 1).reason == "node 'w1' is left"
    assert heartbeat(plane, "nobody", 1).reason == "node 'nobody' is not registered"


def test_a_node_registers_the_address_of_its_https_interface_and_status_shows_it(plane):
    from pathlib import Path

    from sp_dagster.cluster.fencing import NodeSession
    from sp_dagster.cluster.status import cluster_status, render_status
    from sp_dagster.config.loader import parse_config

    template = (Path(__file__).parents[2] / "conf" / "worker" / "deployment.yaml").read_text()
    assert "host: localhost\n    port: 9090" in template  # what the two nodes below change
    for node_id, host, port in (("w1", "worker-1.lan", 9443), ("w2", "10.0.0.12", 9544)):
        config = parse_config(template.replace("host: localhost", f"host: {host}").replace("port: 9090", f"port: {port}"), "deployment.yaml", node_id=node_id)
        NodeSession.from_config(config, plane).beat()
    assert {n["node"]: n["address"] for n in cluster_status(plane)["nodes"]} == {"w1": "worker-1.lan:9443", "w2": "10.0.0.12:9544"}
    table = render_status(cluster_status(plane))
    assert "worker-1.lan:9443" in table and "10.0.0.12:9544" in table and "localhost:9090" not in table


def test_status_tells_a_silent_node_from_a_live_one_by_its_own_fence_window(plane):
    from sp_dagster.cluster.status import cluster_status, render_status

    register_node(plane, "quiet", metrics={"fence_after_s": 0.2})
    register_node(plane, "busy", metrics={"fence_after_s": 30})
    register_node(plane, "old", metrics={})  # a worker that does not report its window: never called silent
    time.sleep(0.4)  # past quiet's window only; nobody declares it dead (no manager runs here)
    nodes = {n["node"]: n for n in cluster_status(plane)["nodes"]}
    assert {name: (n["state"], n["silent"]) for name, n in nodes.items()} == {"quiet": (ALIVE, True), "busy": (ALIVE, False), "old": (ALIVE, False)}
    quiet = next(line for line in render_status(cluster_status(plane)).splitlines() if line.startswith("quiet"))
    assert "silent (no heartbeat within its fence window; no manager has declared it dead)" in quiet
