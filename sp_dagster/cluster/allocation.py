"""Placement of partial-app instances on resource nodes: a pluggable, pure algorithm.
An algorithm gets the alive nodes, the instances, where each runs now and `minResourceCount`, and
returns a node or a reason for each instance; it never touches the database (the leader applies and
checks its answer). The default's rules: `BalancedAllocation`, and "Allocation" in
docs/concepts/control-plane.md.
"""

from __future__ import annotations

import importlib
import math
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sp_dagster.errors import ConfigError
from sp_dagster.wording import counted

#: Instance extra of a receiver whose http source asks for basic auth, and the heartbeat metric of a
#: node that has deployment.config.receiverUsers: the one runs only where the other is true.
RECEIVER_USERS = "receiver_users"
#: Likewise for a receiver whose http source listens on https:// and a node with deployment.config.receiverTls.
RECEIVER_TLS = "receiver_tls"
#: Instance extra naming the wire formats of its inter-group topics, and the heartbeat metric naming those a
#: node reads: a node that names its formats runs only instances whose formats are among them (a rolling upgrade).
WIRE_FORMATS = "wire_formats"

WSO2_ALGORITHMS = (
    "org.wso2.carbon.sp.jobmanager.core.allocation.RoundRobinAllocationAlgorithm",
    "org.wso2.carbon.sp.jobmanager.core.allocation.CPUBasedAllocationAlgorithm",
)


@dataclass(frozen=True)
class NodeInfo:
    """An alive resource node, as an algorithm sees it."""

    node_id: str
    receiver: bool = False
    metrics: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InstanceInfo:
    """A partial-app instance that should run somewhere."""

    instance_id: str
    app: str
    group: str
    parallel_index: int = 1
    receiver: bool = False
    needs_receiver_users: bool = False  # its http source asks for basic auth
    needs_receiver_tls: bool = False  # its http source listens on https://
    wire_formats: tuple[str, ...] = ()  # of its inter-group topics

    @property
    def group_key(self) -> tuple[str, str]:
        """Identifies the instance's group across apps."""
        return (self.app, self.group)


@dataclass(frozen=True)
class AllocationRequest:
    """Everything an algorithm may base a placement on."""

    nodes: tuple[NodeInfo, ...]
    instances: tuple[InstanceInfo, ...]
    current: Mapping[str, str] = field(default_factory=dict)  # instance id -> node it runs on now
    min_resource_count: int = 1
    rebalance: bool = False


@dataclass(frozen=True)
class Allocation:
    """An algorithm's answer: a node per placed instance, a reason per unplaced one."""

    placement: dict[str, str]
    unplaced: dict[str, str]


class AllocationAlgorithm(ABC):
    """Decides where instances run; subclass it and name it in deployment.config.allocationAlgorithm."""

    name = "custom"

    @abstractmethod
    def allocate(self, request: AllocationRequest) -> Allocation:
        """Place the request's instances on its nodes."""


def eligible_nodes(instance: InstanceInfo, nodes: tuple[NodeInfo, ...]) -> list[NodeInfo]:
    """The nodes an instance may run on: receiver nodes for receiver instances when any exist, else workers;
    for a basic-auth receiver, only those with receiverUsers; for an https one, only those with receiverTls; only
    nodes that read the wire formats of its topics."""
    receivers = [n for n in nodes if n.receiver]
    eligible = receivers if instance.receiver and receivers else [n for n in nodes if not n.receiver]
    if instance.needs_receiver_users:
        eligible = [n for n in eligible if n.metrics.get(RECEIVER_USERS) is True]
    if instance.needs_receiver_tls:
        eligible = [n for n in eligible if n.metrics.get(RECEIVER_TLS) is True]
    if instance.wire_formats:
        eligible = [n for n in eligible if _reads(n, instance.wire_formats)]
    return eligible


def _reads(node: NodeInfo, formats: tuple[str, ...]) -> bool:
    """True unless the node names the wire formats it reads and `formats` are not all among them (a node that
    names none predates them: it gets the instance and refuses what it cannot read)."""
    named = node.metrics.get(WIRE_FORMATS)
    return not isinstance(named, list) or set(formats) <= set(named)


def waiting_reason(workers_alive: int, min_resource_count: int) -> str:
    """The reason given while too few workers are alive."""
    return f"waiting for workers: {workers_alive} alive, minResourceCount is {min_resource_count}"


class BalancedAllocation(AllocationAlgorithm):
    """The default: stable, spread per group, balanced by instance count.

    - keeps every instance where it is while that node is alive and eligible (no churn);
    - receiver (passthrough) instances go only to receiver nodes when any are alive, otherwise
      to workers; other instances never go to receiver nodes; a receiver whose http source asks
      for basic auth goes only to a node that has users to accept (`receiver_users` in its metrics);
    - instances of one group are spread over different nodes, then load (instance count) is
      balanced; two instances of one *receiver* group never share a node (they would bind the
      same user source), so such an instance may stay unplaced, with the reason;
    - while fewer than `minResourceCount` workers are alive, nothing new is placed (what runs
      keeps running) and every unplaced instance carries the reason;
    - with `rebalance=True` (a node joined, or someone asked), it moves the fewest instances
      needed to spread each group and even out the load;
    - a node that says how many instances it can run (`slots` in its heartbeat metrics: a worker
      in continuous mode, where every instance holds a Spark task slot) gets no more than that;
    - one instance that cannot be placed never affects the others.
    """

    name = "balanced"

    def allocate(self, request: AllocationRequest) -> Allocation:
        """Place the request's instances on its nodes."""
        nodes = tuple(sorted(request.nodes, key=lambda n: n.node_id))
        instances = sorted(request.instances, key=lambda i: (i.app, i.group, i.parallel_index, i.instance_id))
        placement: dict[str, str] = {}
        unplaced: dict[str, str] = {}
        workers = [n for n in nodes if not n.receiver]
        if len(workers) < request.min_resource_count:
            reason = waiting_reason(len(workers), request.min_resource_count)
            for instance in instances:
                node = request.current.get(instance.instance_id)
                if node in {n.node_id for n in eligible_nodes(instance, nodes)}:
                    placement[instance.instance_id] = node  # keep what runs; place nothing new
                else:
                    unplaced[instance.instance_id] = reason
            return Allocation(placement, unplaced)
        pools: dict[tuple[str, ...], list[InstanceInfo]] = defaultdict(list)
        for instance in instances:
            pools[tuple(n.node_id for n in eligible_nodes(instance, nodes))].append(instance)
        receivers_alive = any(n.receiver for n in nodes)
        capacity = {n.node_id: node_slots(n) for n in nodes}
        for pool_nodes, pool_instances in pools.items():
            if not pool_nodes:
                unplaced.update({i.instance_id: _no_node_reason(i, nodes) for i in pool_instances})
                continue
            pool = _Pool(pool_nodes, pool_instances, request.current, receivers_alive, capacity)
            pool.place(request.rebalance, placement, unplaced)
        return Allocation(placement, unplaced)


def _no_node_reason(instance: InstanceInfo, nodes: tuple[NodeInfo, ...]) -> str:
    alive = f"{counted(len(nodes), 'node')} alive"
    needs = []  # (why, the setting, what to add)
    if instance.needs_receiver_users:
        needs.append(("has basic.auth.enabled='true'", "deployment.config.receiverUsers", "the users it accepts"))
    if instance.needs_receiver_tls:
        needs.append(("listens on https://", "deployment.config.receiverTls", "a certificate and key"))
    if needs:
        why, settings, what = (" and ".join(part) for part in zip(*needs))
        return f"its http source {why} and none of the {alive} has {settings}: add {what} to a receiver node's deployment.yaml (or a worker's, without receiver nodes)"
    if instance.wire_formats and not any(_reads(n, instance.wire_formats) for n in nodes):
        return (
            f"its topics carry wire format {', '.join(instance.wire_formats)}, which none of the {alive} reads: "
            "upgrade the workers to this version of sp-dagster (or redeploy the app with the workers' version)"
        )
    return f"no eligible node: {alive}"


def node_slots(node: NodeInfo) -> int | None:
    """How many instances a node can run at once, when it says (None: no limit)."""
    slots = node.metrics.get("slots")
    return slots if isinstance(slots, int) and not isinstance(slots, bool) and slots >= 0 else None


class _Pool:
    """One set of interchangeable nodes and the instances that may run on them."""

    def __init__(
        self,
        nodes: tuple[str, ...],
        instances: list[InstanceInfo],
        current: Mapping[str, str],
        receivers_alive: bool,
        capacity: Mapping[str, int | None] | None = None,
    ):
        self.nodes = nodes
        self.capacity = dict(capacity or {})
        self.instances = instances
        self.current = current
        self.receivers_alive = receivers_alive
        self.load = {n: 0 for n in nodes}
        self.group_count: dict[tuple[str, tuple[str, str]], int] = defaultdict(int)
        self.on: dict[str, str] = {}

    def _put(self, instance: InstanceInfo, node: str) -> None:
        self.on[instance.instance_id] = node
        self.load[node] += 1
        self.group_count[(node, instance.group_key)] += 1

    def _take(self, instance: InstanceInfo) -> None:
        node = self.on.pop(instance.instance_id)
        self.load[node] -= 1
        self.group_count[(node, instance.group_key)] -= 1

    def _allowed(self, instance: InstanceInfo, node: str) -> bool:
        # Two instances of one receiver group on one node would bind the same user source.
        return not (instance.receiver and self.group_count[(node, instance.group_key)] > 0)

    def _has_room(self, node: str) -> bool:
        slots = self.capacity.get(node)
        return slots is None or self.load[node] < slots

    def place(self, rebalance: bool, placement: dict[str, str], unplaced: dict[str, str]) -> None:
        """Keep, (re)balance when asked, place the rest; fill `placement` and `unplaced`."""
        for instance in self.instances:
            node = self.current.get(instance.instance_id)
            if node in self.load and self._allowed(instance, node) and self._has_room(node):
                self._put(instance, node)
        targets = self._rebalance() if rebalance else None
        for instance in self.instances:
            if instance.instance_id in self.on:
                continue
            candidates = [n for n in self.nodes if self._allowed(instance, n) and self._has_room(n)]
            if not candidates and any(self._allowed(instance, n) for n in self.nodes):
                total = sum(self.capacity.get(n) or 0 for n in self.nodes)
                unplaced[instance.instance_id] = (
                    f"every eligible node is full: {len(self.nodes)} alive with {counted(total, 'task slot')} in all; add workers or raise spark.taskSlots"
                )
                continue
            if not candidates:
                kind = "receiver node" if instance.receiver and self.receivers_alive else "worker"
                unplaced[instance.instance_id] = (
                    f"needs a {kind} not already running another instance of receiver group {instance.app}/{instance.group}: {len(self.nodes)} alive"
                )
                continue

            def cost(n: str, group_key=instance.group_key) -> tuple:
                over = targets is not None and self.load[n] >= targets[n]
                return (over, self.group_count[(n, group_key)], self.load[n], n)

            self._put(instance, min(candidates, key=cost))
        placement.update(self.on)

    def _rebalance(self) -> dict[str, int]:
        """Unplace the fewest kept instances that spread groups and even the load; returns load targets."""
        by_id = {i.instance_id: i for i in self.instances}
        groups: dict[tuple[str, str], list[InstanceInfo]] = defaultdict(list)
        for instance in self.instances:
            groups[instance.group_key].append(instance)
        for _key, members in groups.items():
            cap = math.ceil(len(members) / len(self.nodes))
            for node in self.nodes:
                here = [i for i in members if self.on.get(i.instance_id) == node]
                for instance in sorted(here, key=lambda i: i.parallel_index)[cap:]:
                    self._take(instance)
        share, extra = divmod(len(self.instances), len(self.nodes))
        # The most loaded nodes keep the extra instance each: that moves the fewest.
        ranked = sorted(self.nodes, key=lambda n: (-self.load[n], n))
        targets = {n: share + (1 if rank < extra else 0) for rank, n in enumerate(ranked)}
        for node in self.nodes:
            while self.load[node] > targets[node]:
                here = [by_id[i] for i, n in self.on.items() if n == node]
                # Move the instance whose group is most crowded here (helps the spread too).
                victim = max(here, key=lambda i: (self.group_count[(node, i.group_key)], i.parallel_index, i.instance_id))
                self._take(victim)
        return targets


def check_allocation(request: AllocationRequest, allocation: Allocation, algorithm_name: str) -> Allocation:
    """Refuse placements on nodes that are not alive or not eligible; give every instance an answer."""
    placement: dict[str, str] = {}
    unplaced: dict[str, str] = {}
    for instance in request.instances:
        node = allocation.placement.get(instance.instance_id)
        if node is None:
            unplaced[instance.instance_id] = allocation.unplaced.get(instance.instance_id, f"allocation algorithm '{algorithm_name}' did not place it")
        elif node not in {n.node_id for n in eligible_nodes(instance, request.nodes)}:
            unplaced[instance.instance_id] = f"allocation algorithm '{algorithm_name}' chose node '{node}', which is not an alive eligible node"
        else:
            placement[instance.instance_id] = node
    return Allocation(placement, unplaced)


def load_algorithm(name: str | None) -> AllocationAlgorithm:
    """The algorithm named in deployment.config.allocationAlgorithm: 'balanced' (default) or 'module:Class'."""
    if not name or name in ("balanced", "default") or name in WSO2_ALGORITHMS:
        return BalancedAllocation()
    module_name, _, attribute = name.partition(":") if ":" in name else name.rpartition(".")
    hint = "expected 'balanced' or 'package.module:ClassName' naming an AllocationAlgorithm"
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"deployment.config.allocationAlgorithm: cannot load {name!r} ({exc}); {hint}") from None
    algorithm = target() if isinstance(target, type) else target
    if not callable(getattr(algorithm, "allocate", None)):
        raise ConfigError(f"deployment.config.allocationAlgorithm: {name!r} has no allocate(request) method; {hint}")
    return algorithm
