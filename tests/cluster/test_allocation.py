"""The default allocation algorithm, as a pure function, and loading a custom one."""

from __future__ import annotations

from collections import Counter

import pytest

from sp_dagster.cluster.allocation import (
    Allocation,
    AllocationAlgorithm,
    AllocationRequest,
    BalancedAllocation,
    InstanceInfo,
    NodeInfo,
    check_allocation,
    load_algorithm,
)
from sp_dagster.errors import ConfigError


def group(app, name, parallel, receiver=False):
    return [InstanceInfo(f"{app}-{name}-{i}", app, name, i, receiver) for i in range(1, parallel + 1)]


def workers(*ids):
    return tuple(NodeInfo(i) for i in ids)


def allocate(nodes, instances, current=None, min_count=1, rebalance=False):
    request = AllocationRequest(tuple(nodes), tuple(instances), dict(current or {}), min_count, rebalance)
    return BalancedAllocation().allocate(request)


def loads(placement):
    return Counter(placement.values())


def test_spreads_a_group_over_different_nodes_and_balances():
    instances = group("a", "g1", 3) + group("a", "g2", 3)
    result = allocate(workers("w1", "w2", "w3"), instances)
    assert not result.unplaced
    for name in ("g1", "g2"):
        assert len({result.placement[f"a-{name}-{i}"] for i in (1, 2, 3)}) == 3
    assert set(loads(result.placement).values()) == {2}


def test_more_instances_than_nodes_are_spread_evenly():
    result = allocate(workers("w1", "w2"), group("a", "g", 5))
    assert sorted(loads(result.placement).values()) == [2, 3]


def test_keeps_running_instances_where_they_are():
    instances = group("a", "g", 2)
    current = {"a-g-1": "w2", "a-g-2": "w1"}
    assert allocate(workers("w1", "w2"), instances, current).placement == current


def test_waits_below_min_resource_count_with_the_reason_and_keeps_what_runs():
    instances = group("a", "g", 3)
    result = allocate(workers("w1"), instances, {"a-g-1": "w1"}, min_count=2)
    assert result.placement == {"a-g-1": "w1"}
    assert result.unplaced == {
        "a-g-2": "waiting for workers: 1 alive, minResourceCount is 2",
        "a-g-3": "waiting for workers: 1 alive, minResourceCount is 2",
    }


def test_receiver_instances_only_on_receiver_nodes_when_any_exist():
    nodes = (NodeInfo("w1"), NodeInfo("w2"), NodeInfo("r1", receiver=True), NodeInfo("r2", receiver=True))
    instances = group("a", "passthrough", 2, receiver=True) + group("a", "g", 4)
    result = allocate(nodes, instances)
    assert not result.unplaced
    assert {result.placement[f"a-passthrough-{i}"] for i in (1, 2)} == {"r1", "r2"}
    assert {result.placement[f"a-g-{i}"] for i in range(1, 5)} == {"w1", "w2"}


def test_receiver_instances_go_to_workers_when_no_receiver_node_exists():
    result = allocate(workers("w1", "w2"), group("a", "passthrough", 2, receiver=True))
    assert set(result.placement.values()) == {"w1", "w2"}


def basic_auth_receiver(app, name, index=1):
    return InstanceInfo(f"{app}-{name}-{index}", app, name, index, receiver=True, needs_receiver_users=True)


def test_a_basic_auth_receiver_runs_only_where_users_are_configured():
    users = {"receiver_users": True}
    nodes = (NodeInfo("w1"), NodeInfo("w2", metrics=users), NodeInfo("w3", metrics={"receiver_users": False}))
    result = allocate(nodes, [basic_auth_receiver("a", "in")], current={"a-in-1": "w1"})
    assert result.placement == {"a-in-1": "w2"}  # moved off the node that would answer 401 to everyone
    with_receivers = (*nodes, NodeInfo("r1", receiver=True), NodeInfo("r2", receiver=True, metrics=users))
    assert allocate(with_receivers, [basic_auth_receiver("a", "in")]).placement == {"a-in-1": "r2"}


def test_a_basic_auth_receiver_waits_for_a_node_with_users_and_says_what_to_add():
    nodes = (NodeInfo("w1"), NodeInfo("r1", receiver=True))
    result = allocate(nodes, [basic_auth_receiver("a", "in"), *group("a", "g", 2)], rebalance=True)
    assert set(result.placement) == {"a-g-1", "a-g-2"}
    assert "basic.auth.enabled='true'" in result.unplaced["a-in-1"]
    assert "none of the 2 nodes alive has deployment.config.receiverUsers" in result.unplaced["a-in-1"]
    checked = check_allocation(AllocationRequest(nodes, (basic_auth_receiver("a", "in"),)), Allocation({"a-in-1": "r1"}, {}), "custom")
    assert "not an alive eligible node" in checked.unplaced["a-in-1"]


def test_an_https_receiver_runs_only_where_a_certificate_is_configured_and_says_what_to_add():
    secure = InstanceInfo("a-in-1", "a", "in", 1, receiver=True, needs_receiver_tls=True)
    both = InstanceInfo("a-in-1", "a", "in", 1, receiver=True, needs_receiver_users=True, needs_receiver_tls=True)
    nodes = (NodeInfo("w1", metrics={"receiver_users": True}), NodeInfo("w2", metrics={"receiver_tls": True}), NodeInfo("w3", metrics={"receiver_tls": False}))
    assert allocate(nodes, [secure], current={"a-in-1": "w3"}).placement == {"a-in-1": "w2"}
    waiting = allocate(nodes, [both])
    assert waiting.placement == {}
    assert waiting.unplaced["a-in-1"] == (
        "its http source has basic.auth.enabled='true' and listens on https:// and none of the 3 nodes alive has "
        "deployment.config.receiverUsers and deployment.config.receiverTls: add the users it accepts and a certificate and key "
        "to a receiver node's deployment.yaml (or a worker's, without receiver nodes)"
    )
    ready = (*nodes, NodeInfo("w4", metrics={"receiver_users": True, "receiver_tls": True}))
    assert allocate(ready, [both]).placement == {"a-in-1": "w4"}


def test_an_instance_runs_only_on_nodes_that_read_its_wire_formats_and_says_to_upgrade_the_rest():
    batched = InstanceInfo("a-g-1", "a", "g", 1, wire_formats=("batch/1",))
    old = NodeInfo("w1", metrics={"wire_formats": ["event/1"]})
    assert allocate((old, NodeInfo("w2", metrics={"wire_formats": ["event/1", "batch/1"]})), [batched], current={"a-g-1": "w1"}).placement == {"a-g-1": "w2"}
    # A node that does not say which formats it reads predates the setting: it gets the instance, and refuses it itself.
    assert allocate((old, NodeInfo("w3")), [batched]).placement == {"a-g-1": "w3"}
    waiting = allocate((old,), [batched, InstanceInfo("a-g-2", "a", "g", 2)])
    assert waiting.placement == {"a-g-2": "w1"}
    assert waiting.unplaced["a-g-1"] == (
        "its topics carry wire format batch/1, which none of the 1 node alive reads: "
        "upgrade the workers to this version of sp-dagster (or redeploy the app with the workers' version)"
    )


def test_one_unplaceable_instance_leaves_the_rest_of_its_app_placed():
    nodes = (NodeInfo("w1"), NodeInfo("r1", receiver=True))
    instances = group("a", "passthrough", 2, receiver=True) + group("a", "g", 2)
    result = allocate(nodes, instances)
    assert list(result.unplaced) == ["a-passthrough-2"]
    assert "needs a receiver node not already running another instance of receiver group a/passthrough" in result.unplaced["a-passthrough-2"]
    assert result.placement == {"a-passthrough-1": "r1", "a-g-1": "w1", "a-g-2": "w1"}


def test_dead_nodes_instances_are_replaced_on_the_least_loaded():
    instances = group("a", "g", 3) + group("b", "h", 3)
    first = allocate(workers("w1", "w2", "w3"), instances).placement
    survivors = {i: n for i, n in first.items() if n != "w3"}
    second = allocate(workers("w1", "w2"), instances, survivors).placement
    assert all(second[i] == n for i, n in survivors.items())  # nothing else moved
    assert set(loads(second).values()) == {3}


@pytest.mark.parametrize(
    "before, nodes, expected_moves",
    [
        ({"w1": 6}, ("w1", "w2"), 3),
        ({"w1": 3, "w2": 3}, ("w1", "w2", "w3"), 2),
        ({"w1": 4, "w2": 4}, ("w1", "w2", "w3", "w4"), 4),
        ({"w1": 5, "w2": 4}, ("w1", "w2", "w3"), 3),
    ],
)
def test_rebalance_after_a_join_moves_the_fewest(before, nodes, expected_moves):
    instances, current, n = [], {}, 0
    for node, count in before.items():
        for _ in range(count):
            n += 1
            instance = InstanceInfo(f"app-g{n}-1", "app", f"g{n}", 1)
            instances.append(instance)
            current[instance.instance_id] = node
    result = allocate(workers(*nodes), instances, current, rebalance=True)
    moved = [i for i, node in result.placement.items() if current[i] != node]
    assert len(moved) == expected_moves
    assert max(loads(result.placement).values()) - min(loads(result.placement).values()) <= 1
    assert set(loads(result.placement)) == set(nodes)


def test_rebalance_spreads_a_crowded_group():
    instances = group("a", "g1", 2) + group("a", "g2", 2) + group("a", "g3", 2)
    current = {i.instance_id: "w1" for i in instances}
    result = allocate(workers("w1", "w2"), instances, current, rebalance=True)
    for name in ("g1", "g2", "g3"):
        assert {result.placement[f"a-{name}-1"], result.placement[f"a-{name}-2"]} == {"w1", "w2"}
    assert sum(current[i] != n for i, n in result.placement.items()) == 3


def test_without_rebalance_a_join_moves_nothing():
    instances = group("a", "g", 4)
    current = {i.instance_id: "w1" for i in instances}
    assert allocate(workers("w1", "w2"), instances, current).placement == current


def test_balanced_rebalance_is_stable():
    instances = group("a", "g", 4) + group("b", "h", 2)
    first = allocate(workers("w1", "w2", "w3"), instances).placement
    assert allocate(workers("w1", "w2", "w3"), instances, first, rebalance=True).placement == first


class EverythingOnOneNode(AllocationAlgorithm):
    name = "one-node"

    def allocate(self, request):
        return Allocation({i.instance_id: "w9" for i in request.instances}, {})


def test_a_custom_algorithm_is_loaded_and_checked():
    algorithm = load_algorithm(f"{__name__}:EverythingOnOneNode")
    request = AllocationRequest(workers("w1"), tuple(group("a", "g", 1)))
    checked = check_allocation(request, algorithm.allocate(request), algorithm.name)
    assert checked.placement == {}
    assert checked.unplaced == {"a-g-1": "allocation algorithm 'one-node' chose node 'w9', which is not an alive eligible node"}


def test_default_and_wso2_names_load_the_balanced_algorithm():
    for name in (None, "balanced", "org.wso2.carbon.sp.jobmanager.core.allocation.RoundRobinAllocationAlgorithm"):
        assert isinstance(load_algorithm(name), BalancedAllocation)


def test_an_unknown_algorithm_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match=r"allocationAlgorithm: cannot load 'nowhere:Thing' \(No module named 'nowhere'\)"):
        load_algorithm("nowhere:Thing")
