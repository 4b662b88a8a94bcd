"""Checks every plan must pass, shared by the topology tests."""

from __future__ import annotations

from pathlib import Path

from sp_dagster.siddhi import parse, validate
from sp_dagster.topology import ALL, Topology, plan

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
TOPOLOGY_CASES = SHARED / "reference" / "wso2_topology_cases.jsonl"


def plan_text(text: str, name: str | None = None) -> Topology:
    """Parse and plan an app (WSO2's planner cases use sources and sinks workers do not run: tcp, inMemory)."""
    return plan(parse(text), name, transports=False)


def text_at(text: str, line: int, column: int, length: int) -> str:
    """`length` characters of `text` from the 1-based (line, column)."""
    return text.splitlines()[line - 1][column - 1 : column - 1 + length]


def check_partial_apps(topology: Topology) -> None:
    """Every instance re-parses to its own AST, validates, is named `<group>-<i>`, and the
    instances of a group read each partition of a split topic exactly once."""
    for group in topology.groups:
        assert [i.name for i in group.instances] == [f"{group.name}-{n}" for n in range(1, group.parallelism + 1)]
        for instance in group.instances:
            reparsed = parse(instance.siddhi)
            assert reparsed == instance.app, instance.name
            assert validate(reparsed) == [], instance.name
            assert reparsed.name == instance.name
        for subscription in group.inputs:
            if subscription.topic is None:
                continue
            partitions = topology.topic(subscription.topic).partitions
            reads = [instance.partitions_of(subscription.topic) for instance in group.instances]
            if subscription.strategy == ALL:
                assert all(r == tuple(range(partitions)) for r in reads), (group.name, subscription)
            else:
                flat = [p for r in reads for p in r]
                assert sorted(flat) == list(range(partitions)) and all(reads), (group.name, subscription, reads)
                assert all(list(r) == list(range(r[0], r[-1] + 1)) for r in reads), "contiguous ranges"
