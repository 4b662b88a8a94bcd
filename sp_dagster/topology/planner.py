"""plan(): a parsed distributed app becomes a Topology (the job manager's brain)."""

from __future__ import annotations

from sp_dagster.siddhi import SiddhiQLError, ast
from sp_dagster.siddhi.validate import check
from sp_dagster.topology.analysis import Catalog, describe
from sp_dagster.topology.errors import TopologyError, error_at
from sp_dagster.topology.flows import Flows, plan_flows, producers_of
from sp_dagster.topology.graph import CycleError, topological_order
from sp_dagster.topology.grouping import GroupSpec, build_groups
from sp_dagster.topology.model import USER, ExecutionGroup, Publication, Topology
from sp_dagster.topology.partial_apps import Context, partial_apps
from sp_dagster.topology.strategies import choose_strategies
from sp_dagster.topology.topics import valid_topic_name
from sp_dagster.topology.validation import validate

#: The app name when neither `@App:name` nor the caller gives one.
DEFAULT_APP_NAME = "SiddhiApp"


def plan(app: ast.App, name: str | None = None, *, transports: bool = True, max_parallelism: int | None = None) -> Topology:
    """Split a distributed app into execution groups, topics and partial apps.

    `name` is used when the app has no `@App:name` (the CLI passes the file's stem). Raises
    SiddhiQLError for a mistake in the app, TopologyError (a SiddhiQLError: line, column,
    message) when the app cannot be distributed. With `transports` (the default) the app's
    sources, sinks and maps must be ones workers run (`siddhi.transports`); the planner's own
    tests of WSO2's cases turn that off. `max_parallelism` is the cluster's default room for groups
    running in parallel that name no `@dist(maxParallel)` (`deployment.config.maxParallelism`).

    >>> from sp_dagster import parse, plan
    >>> topology = plan(parse('''@App:name('Shop')
    ... define stream Orders (id int, total double);
    ... @dist(execGroup='big', parallel='2') from Orders[total > 100] select id insert into Big;'''))
    >>> [group.name for group in topology.groups], len(topology.partial_apps)
    (['Shop-big'], 2)
    """
    analysis, errors = check(app, transports=transports)
    if errors:
        raise SiddhiQLError.combine(errors)
    app_name = app.name or name or DEFAULT_APP_NAME
    _check_app_name(app, app_name)
    catalog = Catalog.of(app, analysis)
    groups = build_groups(app_name, describe(app), catalog, max_parallelism)
    choices = choose_strategies(groups, catalog)
    producers = producers_of(groups, catalog)
    validate(groups, catalog, choices, producers)
    flows = plan_flows(app_name, groups, choices, producers, catalog)
    every_group = groups + flows.passthroughs
    _check_unique(every_group)
    _check_topic_names(flows, catalog, every_group)
    ordered = _data_flow_order(every_group, flows)
    topics = dict(sorted(flows.topics.items()))
    context = Context(app, app_name, catalog, flows, topics, producers)
    return Topology(
        app=app_name,
        groups=tuple(_execution_group(group, flows, context) for group in ordered),
        topics=tuple(topics.values()),
        create_topics=_creates_topics(app),
    )


def _execution_group(group: GroupSpec, flows: Flows, context: Context) -> ExecutionGroup:
    inputs = flows.subscriptions.get(group.name, {})
    outputs: list[Publication] = flows.publications.get(group.name, [])
    return ExecutionGroup(
        name=group.name,
        exec_group=group.exec_group,
        kind=group.kind,
        parallelism=group.parallelism,
        receiver=group.receiver,
        inputs=tuple(inputs[stream] for stream in sorted(inputs)),
        outputs=tuple(sorted(outputs, key=lambda p: (p.stream, p.topic))),
        instances=partial_apps(group, context),
        max_parallelism=group.max_parallelism,
    )


def _data_flow_order(groups: list[GroupSpec], flows: Flows) -> list[GroupSpec]:
    by_name = {group.name: group for group in groups}
    rank = {group.name: group.rank for group in groups}
    edges = {source: list(targets) for source, targets in flows.edges.items()}
    try:
        order = topological_order(list(by_name), rank, edges)
    except CycleError as cycle:
        raise _cycle_error(cycle.cycle, flows) from None
    return [by_name[name] for name in order]


def _cycle_error(cycle: list[str], flows: Flows) -> TopologyError:
    steps = [cycle[0]]
    for source, target in zip(cycle, cycle[1:]):
        stream, _ = flows.edges[source][target]
        steps += [stream, target]
    _, closing_read = flows.edges[cycle[-2]][cycle[-1]]
    return error_at(
        closing_read,
        f"Unsupported: execGroups {' -> '.join(steps)} form a cycle; a group cannot consume a stream "
        "that its own output feeds, directly or through other groups",
    )


def _check_app_name(app: ast.App, app_name: str) -> None:
    if not valid_topic_name(app_name):
        where = app.annotation("app:name") or app
        raise error_at(where, f"app name '{app_name}' cannot name Kafka topics: use only letters, digits, '.', '_' and '-'")


def _check_unique(groups: list[GroupSpec]) -> None:
    seen: dict[str, GroupSpec] = {}
    for group in groups:
        other = seen.setdefault(group.name, group)
        if other is not group:
            user = group if group.kind == USER else other
            raise error_at(
                user.declared_at or user.elements[0].element,
                f"execGroup '{user.exec_group}' has the name of a generated group ({group.name}); rename the execGroup",
            )


def _check_topic_names(flows: Flows, catalog: Catalog, groups: list[GroupSpec]) -> None:
    for topic in flows.topics.values():
        if not valid_topic_name(topic.name):
            definition = catalog.definitions.get(topic.stream)
            where = definition or next(
                (item.node for g in groups for info in g.elements for item in (*info.reads, *info.writes) if item.name == topic.stream),
                None,
            )
            raise TopologyError(
                f"stream {topic.stream} cannot name a Kafka topic ('{topic.name}'): use only letters, digits, '.', '_' and '-'",
                getattr(where, "line", 0),
                getattr(where, "column", 0),
            )


def _creates_topics(app: ast.App) -> bool:
    annotation = app.annotation("app:transportChannelCreationEnabled")
    if annotation is None:
        return True
    value = annotation.values[0] if annotation.values else annotation.get("enabled", "true")
    return value.strip().lower() != "false"
