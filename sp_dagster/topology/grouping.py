"""Execution groups from `@dist(execGroup=..., parallel=...)`, and one group per aggregation.
An aggregation's group has the parallelism of its `@dist(parallel='N')` (1 by default): N > 1
plans N active-active instances (shards) fed round robin, which needs a shared `@store`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sp_dagster.siddhi import ast
from sp_dagster.topology.analysis import AGGREGATION, Catalog, ElementInfo, element_label, is_persisted
from sp_dagster.topology.errors import error_at
from sp_dagster.topology.model import AGGREGATION as AGGREGATION_GROUP
from sp_dagster.topology.model import PASSTHROUGH, USER

#: The execGroup of elements that name none.
DEFAULT_GROUP = "default"
# Ties in the data-flow order: passthroughs first, then execGroups, then aggregations (as the
# original lists them), each by where it first appears in the app.
TIERS = {PASSTHROUGH: 0, USER: 1, AGGREGATION_GROUP: 2}


@dataclass
class GroupSpec:
    """An execution group while it is being planned."""

    name: str
    exec_group: str
    kind: str
    parallelism: int
    first_index: int  # position in the app of the element that opened the group
    max_parallelism: int | None = None  # @dist(maxParallel): what the group may grow to without changing a topic
    elements: list[ElementInfo] = field(default_factory=list)
    declared_at: ast.Node | None = None  # where the parallelism was set (for messages)
    receiver: bool = False
    stream: str | None = None  # passthrough: the stream it carries
    source: ast.Annotation | None = None  # passthrough: the user @source it hosts (None: an entry topic)

    @property
    def room(self) -> int:
        """The most instances the group's topics are laid out for: its maximum parallelism, else its parallelism."""
        return max(self.parallelism, self.max_parallelism or 1)

    @property
    def carried(self) -> str:
        """The stream a passthrough group carries."""
        assert self.stream is not None, self.name  # every passthrough is made with its stream
        return self.stream

    @property
    def rank(self) -> tuple[int, int, str]:
        """The sort key among groups that the data flow leaves unordered."""
        return (TIERS[self.kind], self.first_index, self.name)


def build_groups(app_name: str, infos: list[ElementInfo], catalog: Catalog, default_room: int | None = None) -> list[GroupSpec]:
    """The execGroups (in order of first appearance), then one group per aggregation.

    Queries that join an in-memory aggregation move into that aggregation's group; an element
    joining several in-memory aggregations merges their groups. A group running in parallel that
    names no maxParallel may grow to `default_room`; one at parallel 1 keeps its own rules, since
    room would hold it to the parallel ones.
    """
    groups: dict[str, GroupSpec] = {}
    group_of: dict[int, GroupSpec] = {}
    for info in infos:
        if isinstance(info.element, ast.AggregationDefinition):
            continue
        exec_group, parallelism, declared_at = _dist(info)
        most = _max_parallel(info)
        name = f"{app_name}-{exec_group}"
        _check_range_partitions(info, name)
        group = groups.get(name)
        if group is None:
            group = groups[name] = GroupSpec(name, exec_group, USER, parallelism, info.index, most, declared_at=declared_at)
        elif group.parallelism != parallelism:
            raise error_at(declared_at, f"execGroup = {name} not assigned constant @dist(parallel)")
        elif most is not None and group.max_parallelism not in (None, most):
            raise error_at(declared_at, f"execGroup = {name} not assigned constant @dist(maxParallel): {group.max_parallelism} and {most}")
        else:
            group.max_parallelism = group.max_parallelism or most
        group.elements.append(info)
        group_of[info.index] = group
    for group in groups.values():
        if default_room is not None and group.parallelism > 1 and group.max_parallelism is None and default_room > group.parallelism:
            group.max_parallelism = default_room
    aggregation_groups = _aggregation_groups(app_name, infos, catalog, group_of)
    return [group for group in groups.values() if group.elements] + aggregation_groups


def _dist(info: ElementInfo) -> tuple[str, int, ast.Node]:
    # The language's validation (sp_dagster.siddhi) has checked @dist: its place, a whole
    # parallel of at least 1, a non-empty execGroup.
    dist = info.dist
    if dist is None:
        return DEFAULT_GROUP, 1, info.element
    return dist.get("execGroup") or DEFAULT_GROUP, int(dist.get("parallel", "1").strip()), dist


def _max_parallel(info: ElementInfo) -> int | None:
    """The element's @dist(maxParallel), or None (the language's validation checked it is a whole number)."""
    text = info.dist.get("maxParallel") if info.dist is not None else None
    return None if text is None else int(text.strip())


def aggregation_shards(info: ElementInfo) -> tuple[int, ast.Node]:
    """How many active-active instances an aggregation asks for (`@dist(parallel='N')`, else 1)."""
    dist = info.dist
    if dist is None:
        return 1, info.element
    return int(dist.get("parallel", "1").strip()), dist


def _check_range_partitions(info: ElementInfo, group: str) -> None:
    if not isinstance(info.element, ast.Partition):
        return
    for key in info.element.keys:
        if isinstance(key, ast.RangePartition):
            raise error_at(key, f"Unsupported: {group} Range PartitionType not Supported in Distributed SetUp")


def _aggregation_groups(app_name: str, infos: list[ElementInfo], catalog: Catalog, group_of: dict[int, GroupSpec]) -> list[GroupSpec]:
    aggregations = [(info, info.element) for info in infos if isinstance(info.element, ast.AggregationDefinition)]
    root = {aggregation.name: aggregation.name for _, aggregation in aggregations}
    position = {aggregation.name: info.index for info, aggregation in aggregations}

    def find(name: str) -> str:
        while root[name] != name:
            name = root[name]
        return name

    joining: list[tuple[ElementInfo, str]] = []
    for info in infos:
        in_memory = [
            read for read in info.reads
            if catalog.kind(read.name) == AGGREGATION and not is_persisted(catalog.definitions[read.name])
        ]  # fmt: skip
        if not in_memory or info.index not in group_of:
            continue
        if group_of[info.index].room > 1:
            read = in_memory[0]
            raise error_at(
                read.node,
                f"Query element : {element_label(info, read.query)} has parallelism > 1 while joining with an in-memory aggregation : {read.name}",
            )
        for read in in_memory[1:]:
            first, other = find(in_memory[0].name), find(read.name)
            if first != other:
                keep, drop = sorted((first, other), key=position.__getitem__)
                root[drop] = keep
        joining.append((info, in_memory[0].name))

    groups: dict[str, GroupSpec] = {}
    for info, definition in aggregations:
        top = find(definition.name)
        group = groups.get(top)
        if group is None:
            exec_group = f"aggregation-{top}"
            group = groups[top] = GroupSpec(f"{app_name}-{exec_group}", exec_group, AGGREGATION_GROUP, 1, position[top])
            group.declared_at = definition
        group.elements.append(info)
        shards, declared_at = aggregation_shards(info)
        if _max_parallel(info) is not None:
            raise error_at(
                (info.dist and info.dist.element("maxParallel")) or declared_at,
                f"Aggregation {definition.name}: @dist(maxParallel) is for execution groups; an aggregation's shards are set by parallel alone",
            )
        if shards > 1:
            if not is_persisted(definition):
                raise error_at(
                    declared_at,
                    f"Aggregation {definition.name} has @dist(parallel='{shards}') but no @store: its {shards} "
                    "active-active instances must write to one shared store (add @store(type='rdbms', ...))",
                )
            group.parallelism, group.declared_at = shards, declared_at
    for info, aggregation in joining:
        group_of[info.index].elements.remove(info)
        groups[find(aggregation)].elements.append(info)
    for group in groups.values():
        group.elements.sort(key=lambda item: item.index)
    return sorted(groups.values(), key=lambda group: group.first_index)
