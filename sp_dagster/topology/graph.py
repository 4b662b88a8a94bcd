"""Topological order of execution groups over the streams that flow between them."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class CycleError(Exception):
    """The groups depend on each other in a circle; `cycle` lists it, first node repeated last."""

    def __init__(self, cycle: list[str]) -> None:
        super().__init__(" -> ".join(cycle))
        self.cycle = cycle


def topological_order(nodes: Sequence[str], rank: Mapping[str, Any], edges: Mapping[str, Iterable[str]]) -> list[str]:
    """Every node after all its predecessors; among free nodes the lowest rank first (Kahn)."""
    successors = {node: sorted(set(edges.get(node, ())), key=rank.__getitem__) for node in nodes}
    indegree = dict.fromkeys(nodes, 0)
    for targets in successors.values():
        for target in targets:
            indegree[target] += 1
    ready = [(rank[node], node) for node in nodes if indegree[node] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, node = heapq.heappop(ready)
        order.append(node)
        for target in successors[node]:
            indegree[target] -= 1
            if indegree[target] == 0:
                heapq.heappush(ready, (rank[target], target))
    if len(order) < len(nodes):
        raise CycleError(_cycle({n for n in nodes if indegree[n] > 0}, successors, rank))
    return order


def _cycle(remaining: set[str], successors: Mapping[str, list[str]], rank: Mapping[str, Any]) -> list[str]:
    # Every node left has a predecessor that is also left, so walking predecessors must repeat.
    predecessors = {node: sorted((s for s in remaining if node in successors[s]), key=rank.__getitem__) for node in remaining}
    node = min(remaining, key=rank.__getitem__)
    path, seen = [node], {node: 0}
    while True:
        node = predecessors[node][0]
        if node in seen:
            cycle = path[seen[node] :][::-1]
            start = cycle.index(min(cycle, key=rank.__getitem__))
            cycle = cycle[start:] + cycle[:start]
            return cycle + cycle[:1]
        seen[node] = len(path)
        path.append(node)
