"""What a distributed app may not do, with the original job manager's messages where it has them."""

from __future__ import annotations

from collections.abc import Iterator

from sp_dagster.siddhi import ast
from sp_dagster.topology.analysis import AGGREGATION, TABLE, WINDOW, Catalog, ElementInfo, is_aggregate_call, is_persisted
from sp_dagster.topology.errors import TopologyError, error_at
from sp_dagster.topology.grouping import GroupSpec
from sp_dagster.topology.model import FIELD_GROUPING
from sp_dagster.topology.strategies import Choice

_SAME_GROUP_PARTITION = (
    "Partial Siddhi App {group} has a partition which consumes from another query inside the same query group "
    "with parallelism greater than one. Partitions can only have parallelism greater than one if and only if they "
    "are consuming from user given stream or stream from another group. Hence failing the deployment of Siddhi App."
)
# Messages of the original (the group name is glued to the text as it did, spaces included).
_PARALLEL_STATE = {
    TABLE: "Unsupported: {group} with In-Memory Table  having parallel > 1 ",
    WINDOW: "Unsupported: {group} with (Defined) Window  having parallel >1",
}
_SHARED_STATE = {
    TABLE: "Unsupported:Event Table {name} In-Memory Table referenced from more than one execGroup: execGroup {group} && {first}",
    WINDOW: "Unsupported:(Defined) Window {name} In-Memory window referenced from more than one execGroup: execGroup {group} && {first}",
}


def validate(groups: list[GroupSpec], catalog: Catalog, choices: dict[str, dict[str, Choice]], producers: dict[str, list[str]]) -> None:
    """Raise one TopologyError standing for every rule the grouped app breaks."""
    errors = list(_in_memory_state(groups, catalog))
    for group in groups:
        if group.room == 1:  # a group that may grow must hold the rules of parallel groups already
            continue
        for info in group.elements:
            if isinstance(info.element, ast.Query):
                errors.extend(_parallel_query(group, info.element, catalog, choices[group.name]))
            elif info.is_partition:
                errors.extend(_partition_inputs(group, info, catalog, producers))
    if errors:
        raise TopologyError.combine(errors)


def _in_memory_state(groups: list[GroupSpec], catalog: Catalog) -> Iterator[TopologyError]:
    """In-memory tables and defined windows live in one instance: one group, parallel 1."""
    owner: dict[str, str] = {}
    for group in groups:
        reported: set[tuple[str, str]] = set()
        for info in group.elements:
            for item in (*info.reads, *info.writes, *info.tables):
                kind = catalog.kind(item.name)
                if kind not in (TABLE, WINDOW) or (kind == TABLE and is_persisted(catalog.definitions[item.name])):
                    continue
                if group.room > 1 and ("parallel", item.name) not in reported:
                    reported.add(("parallel", item.name))
                    yield error_at(item.node, _PARALLEL_STATE[kind].format(group=group.name))
                first = owner.setdefault(item.name, group.name)
                if first != group.name and ("shared", item.name) not in reported:
                    reported.add(("shared", item.name))
                    yield error_at(item.node, _SHARED_STATE[kind].format(name=item.name, group=group.name, first=first))


# WSO2's sentence, then what to do about it.
_PARALLEL_FIX = "; put the query inside a partition (partition with (key of Stream) begin ... end;) or set parallel='1'"


def _parallel_query(group: GroupSpec, query: ast.Query, catalog: Catalog, choices: dict[str, Choice]) -> Iterator[TopologyError]:
    """A plain query with parallel > 1 sees only its instance's share of the events: stateless only."""
    name = group.name
    source = query.input
    if isinstance(source, ast.JoinInput):
        sides = (source.left.stream.stream, source.right.stream.stream)
        if not any(catalog.kind(side) == AGGREGATION for side in sides):
            yield error_at(source, f"{name}Join queries used with parallel greater than 1 outside partitioned stream{_PARALLEL_FIX}")
            return
    if isinstance(source, ast.StateInput):
        yield error_at(source, f"{name}{source.kind.upper()} queries used with parallel greater than 1 outside partitioned stream{_PARALLEL_FIX}")
        return
    for stream_input in query.input_streams():
        if stream_input.window is not None:
            yield error_at(stream_input.window, f"{name} Window queries used with parallel greater than 1 outside partitioned stream{_PARALLEL_FIX}")
            return
    # The original let these through: each instance then keeps its own partial sums and counts.
    stateful = _stateful_node(query.selector)
    if stateful is not None and not _exact_by_key(query, choices):
        yield error_at(
            stateful,
            f"{name} Aggregate or group by queries used with parallel greater than 1 outside partitioned stream (each instance would compute a partial result){_PARALLEL_FIX}",
        )


def _stateful_node(selector: ast.Selector) -> ast.Node | None:
    """The first aggregate call or `group by` attribute of a selector, or None when stateless."""
    for part in (*selector.attributes, selector.having):
        if part is not None:
            call = next((node for node in ast.walk(part) if is_aggregate_call(node)), None)
            if call is not None:
                return call
    return selector.group_by[0] if selector.group_by else None


def _exact_by_key(query: ast.Query, choices: dict[str, Choice]) -> bool:
    """True when every input is field-grouped on a key the query groups by: each key's state is whole."""
    grouped = {variable.name for variable in query.selector.group_by}
    inputs = query.input_streams()
    return all(
        (choice := choices.get(stream_input.stream)) is not None and choice.strategy == FIELD_GROUPING and choice.key in grouped for stream_input in inputs
    )


def _partition_inputs(group: GroupSpec, info: ElementInfo, catalog: Catalog, producers: dict[str, list[str]]) -> Iterator[TopologyError]:
    """A parallel partition must get its streams from topics: a local one is not routed by key."""
    for read in info.reads:
        if catalog.is_stream(read.name) and group.name in producers.get(read.name, ()):
            yield error_at(read.node, _SAME_GROUP_PARTITION.format(group=group.name))
            return
