"""The subscription strategy of every (group, input stream): all, round robin or field grouping."""

from __future__ import annotations

from dataclasses import dataclass

from sp_dagster.siddhi import ast
from sp_dagster.topology.analysis import INFERRED, STREAM, TRIGGER, Catalog, ElementInfo, Read
from sp_dagster.topology.errors import error_at
from sp_dagster.topology.grouping import GroupSpec
from sp_dagster.topology.model import ALL, FIELD_GROUPING, ROUND_ROBIN


@dataclass(frozen=True)
class Choice:
    """How a group must receive one stream, and the read that decided it."""

    strategy: str
    key: str | None
    read: Read
    in_partition: bool  # some partition of the group reads the stream


def choose_strategies(groups: list[GroupSpec], catalog: Catalog) -> dict[str, dict[str, Choice]]:
    """For each group, the strategy of each stream or trigger it reads: {group: {stream: Choice}}."""
    return {group.name: _group_strategies(group, catalog) for group in groups}


def _group_strategies(group: GroupSpec, catalog: Catalog) -> dict[str, Choice]:
    choices: dict[str, Choice] = {}
    partitioned: set[tuple[str, str]] = set()
    for info in group.elements:
        keyed_here: set[tuple[str, str]] = set()
        for read in info.reads:
            kind = catalog.kind(read.name)
            if kind not in (STREAM, INFERRED, TRIGGER):
                continue
            if read.key is not None and (read.name, read.key) not in keyed_here:
                keyed_here.add((read.name, read.key))
                if (read.name, read.key) in partitioned:
                    assert read.key_node is not None  # a keyed read carries its partition key
                    raise error_at(
                        read.key_node,
                        f"Unsupported in distributed setup :More than 1 partition residing on the same execGroup {group.name} for {read.name} {read.key}",
                    )
            candidate = _candidate(group, info, read, kind)
            previous = choices.get(read.name)
            choices[read.name] = candidate if previous is None else _merge(previous, candidate, group, read)
        partitioned |= keyed_here
    return choices


def _candidate(group: GroupSpec, info: ElementInfo, read: Read, kind: str) -> Choice:
    if kind == TRIGGER or group.room == 1:  # room, not parallelism: growing later must not change how a stream is read
        return Choice(ALL, None, read, info.is_partition)
    if not info.is_partition:
        return Choice(ROUND_ROBIN, None, read, False)
    if read.key is not None:
        return Choice(FIELD_GROUPING, read.key, read, True)
    if isinstance(read.key_node, ast.ValuePartition):
        raise error_at(
            read.key_node,
            f"Unsupported: {group.name} partitions {read.name} by an expression; with parallel > 1 the partition key must be an attribute of the stream",
        )
    return Choice(ALL, None, read, True)  # a stream the partition does not key: every instance needs it


def _merge(previous: Choice, candidate: Choice, group: GroupSpec, read: Read) -> Choice:
    in_partition = previous.in_partition or candidate.in_partition
    if (previous.strategy, previous.key) == (candidate.strategy, candidate.key):
        return Choice(previous.strategy, previous.key, previous.read, in_partition)
    # A plain query reads its share of the events whether they are spread round robin or by key,
    # so field grouping serves both, whichever is declared first (the original only accepted
    # the query first).
    if {previous.strategy, candidate.strategy} == {ROUND_ROBIN, FIELD_GROUPING}:
        keyed = previous if previous.strategy == FIELD_GROUPING else candidate
        return Choice(FIELD_GROUPING, keyed.key, keyed.read, in_partition)
    raise error_at(read.node, f"Unsupported: {read.name} in execGroup {group.name} having conflicting strategies.")
