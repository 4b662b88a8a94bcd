"""A Topology as the JSON contract other tools read, as text for people, and as a Mermaid flowchart."""

from __future__ import annotations

import json

from sp_dagster.siddhi import SiddhiQLError
from sp_dagster.siddhi.secrets import mask_secrets
from sp_dagster.siddhi.transports import COLUMN_WIRE
from sp_dagster.topology.model import FIELD_GROUPING, INTERNAL, ExecutionGroup, Topology
from sp_dagster.wording import counted


def to_dict(topology: Topology) -> dict:
    """The plan in the JSON contract of `sp-dagster plan --format json`."""
    return {
        "app": topology.app,
        "groups": [_group(group) for group in topology.groups],
        "topics": [
            {"name": topic.name, "partitions": topic.partitions, **({"wire": COLUMN_WIRE} if topic.role == INTERNAL else {})} for topic in topology.topics
        ],
    }


def _group(group: ExecutionGroup) -> dict:
    outputs: dict[str, list] = {}
    for publication in group.outputs:
        outputs.setdefault(publication.stream, []).append(
            {
                "strategy": publication.strategy,
                "partition_key": publication.partition_key,
                "topic": publication.topic,
                "partitions": publication.partitions,
            }
        )
    return {
        "name": group.name,
        "parallelism": group.parallelism,
        **({"max_parallelism": group.max_parallelism} if group.max_parallelism is not None else {}),
        "receiver": group.receiver,
        "inputs": {s.stream: {"strategy": s.strategy, "partition_key": s.partition_key, "topic": s.topic} for s in group.inputs},
        "outputs": outputs,
        "instances": [
            {"name": instance.name, "siddhi": instance.siddhi, **({"shard_id": instance.shard_id} if instance.shard_id else {})} for instance in group.instances
        ],
    }


def masked(plan: dict) -> dict:
    """A copy of a plan in the JSON contract with every instance's SiddhiQL secrets masked (as it may be shown)."""
    groups = [{**group, "instances": [{**i, "siddhi": mask_secrets(i["siddhi"])} for i in group.get("instances", [])]} for group in plan.get("groups", [])]
    return {**plan, "groups": groups}


def render_json(topology: Topology) -> str:
    """The JSON contract as text, secrets masked (stable: the same plan always gives the same bytes)."""
    return json.dumps(masked(to_dict(topology)), indent=2, ensure_ascii=False)


def error_dict(error: SiddhiQLError) -> dict:
    """`{"error": {"line", "column", "message"}}` for an app that cannot be planned (its first error)."""
    return {"error": {"line": error.line, "column": error.column, "message": error.message}}


def _partitions(count: int) -> str:
    return f"{count} partition" + ("s" if count != 1 else "")


def _strategy(strategy: str, key: str | None) -> str:
    return f"{strategy}({key})" if strategy == FIELD_GROUPING else strategy


def render_text(topology: Topology) -> str:
    """A readable summary: each group with its inputs, outputs and instances (each with its SiddhiQL), then the topics."""
    lines = [f"app {topology.app}: {counted(len(topology.groups), 'execution group')}, {counted(len(topology.topics), 'topic')}"]
    if not topology.create_topics:
        lines.append("topic creation disabled (@App:transportChannelCreationEnabled('false')): the topics must exist")
    for group in topology.groups:
        most = f", at most {group.max_parallelism}" if group.max_parallelism is not None else ""
        flags = f"{group.kind}, parallel {group.parallelism}{most}" + (", receiver" if group.receiver else "")
        lines += ["", f"{group.name} ({flags})"]
        for s in group.inputs:
            origin = f"<- {s.topic}" if s.topic else "(no topic: a user @source or a trigger in the app)"
            lines.append(f"  in   {s.stream}  {_strategy(s.strategy, s.partition_key)}  {origin}")
        for p in group.outputs:
            lines.append(f"  out  {p.stream}  {_strategy(p.strategy, p.partition_key)}  -> {p.topic} ({_partitions(p.partitions)})")
        for instance in group.instances:
            reads = "; ".join(f"{topic} [{','.join(map(str, parts))}]" for topic, parts in instance.assignments)
            lines.append(f"  app  {instance.name}" + (f"  reads {reads}" if reads else ""))
            lines += [f"       | {line}" if line else "       |" for line in mask_secrets(instance.siddhi).rstrip().splitlines()]
    if topology.topics:
        lines += ["", "topics"]
        width = max(len(topic.name) for topic in topology.topics)
        for topic in topology.topics:
            lines.append(f"  {topic.name:<{width}}  {_partitions(topic.partitions)}  {topic.role}")
    return "\n".join(lines) + "\n"


def render_mermaid(topology: Topology) -> str:
    """A Mermaid flowchart: groups as boxes, topics as cylinders, strategies on the arrows."""
    lines = ["flowchart LR"]
    group_ids = {group.name: f"g{number}" for number, group in enumerate(topology.groups, start=1)}
    topic_ids = {topic.name: f"t{number}" for number, topic in enumerate(topology.topics, start=1)}
    for group in topology.groups:
        label = f"{group.name}<br/>x{group.parallelism}"
        shape = f'[/"{label}"/]' if group.receiver else f'["{label}"]'
        lines.append(f"    {group_ids[group.name]}{shape}")
    for topic in topology.topics:
        lines.append(f'    {topic_ids[topic.name]}[("{topic.name}<br/>{_partitions(topic.partitions)}")]')
    for group in topology.groups:
        for p in group.outputs:
            lines.append(_edge(group_ids[group.name], _strategy(p.strategy, p.partition_key), topic_ids[p.topic]))
        for s in group.inputs:
            if s.topic in topic_ids:
                lines.append(_edge(topic_ids[s.topic], _strategy(s.strategy, s.partition_key), group_ids[group.name]))
    return "\n".join(lines) + "\n"


def _edge(source: str, label: str, target: str) -> str:
    return f'    {source} -->|"{label}"| {target}'
