"""Each inter-group topic's wire format is recorded with the plan: an app planned before batches keeps
publishing one event per message, one planned with batches of encoded events keeps those, and a
format this version does not know is refused, never misread."""

from __future__ import annotations

import json
import re

import pytest

from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.schema import deployments
from sp_dagster.cluster.store.deployments import get_deployment
from sp_dagster.deploy import DeployError, load_app, plan_app
from sp_dagster.deploy.steps import record, state_changes
from sp_dagster.messaging import batches, codec_for
from sp_dagster.siddhi.transports import BATCH_WIRE, COLUMN_WIRE, WIRE_FORMATS
from sp_dagster.topology.output import to_dict
from sp_dagster.worker.instance.batching import batched_inputs, batched_outputs, expand, pack
from sp_dagster.worker.instance.plan import InstancePlanError, plan_instance, wire_of
from sp_dagster.worker.instance.runtime import InstanceRuntime, Message
from tests.fixtures.trades import APP, trades

WIRE = re.compile(r",\s*wire\s*=\s*'[^']*'")


def _partials(text: str = APP) -> tuple[str, str, str, str]:
    """(filter instance name, its SiddhiQL, average instance name, its SiddhiQL) as planned now."""
    topology = plan_app(load_app(text=text))
    first, second = topology.groups[0].instances[0], topology.groups[1].instances[0]
    return first.name, first.siddhi, second.name, second.siddhi


def _read_back(published: list[Message], topic: str) -> list[Message]:
    """What a reader of `topic` gets: each published message at the next offset of its partition, batches cut."""
    offsets: dict[int, int] = {}
    raws = []
    for m in published:
        if m.topic == topic:
            offsets[m.partition] = offsets.get(m.partition, -1) + 1
            raws.append((m.partition, offsets[m.partition], m.timestamp, m.key, m.value, m.origin))
    return expand(topic, sorted(raws, key=lambda r: r[:2]), batched_inputs(plan_instance(*_partials()[2:]))[topic])


def test_the_plan_records_the_wire_format_of_every_inter_group_topic_and_only_those():
    plan = to_dict(plan_app(load_app(text=APP)))
    filter_name, filter_siddhi, *_ = _partials()
    internal = plan_instance(filter_name, filter_siddhi).outputs[0].topic
    assert {t["name"]: t.get("wire") for t in plan["topics"]}[internal] == COLUMN_WIRE
    assert [t["name"] for t in plan["topics"] if "wire" in t] == [internal]  # the entry and sink topics carry the users' maps
    assert wire_of(plan_instance(filter_name, filter_siddhi).outputs[0].mapping) == COLUMN_WIRE  # and its partial apps' maps
    assert batches.VERSION == int(BATCH_WIRE.split("/")[1]) and batches.COLUMNS == int(COLUMN_WIRE.split("/")[1])
    assert {BATCH_WIRE, COLUMN_WIRE} <= set(WIRE_FORMATS)


def test_apps_planned_before_batches_or_by_column_publish_as_planned_and_the_next_group_reads_the_same():
    filter_name, filter_siddhi, average_name, average_siddhi = _partials()
    forms = {
        "columns": plan_instance(filter_name, filter_siddhi),
        "encoded": plan_instance(filter_name, filter_siddhi.replace(COLUMN_WIRE, BATCH_WIRE)),  # planned with batches of encoded events
        "single": plan_instance(filter_name, WIRE.sub("", filter_siddhi)),  # as recorded by a version without the wire option
    }
    topic = forms["columns"].outputs[0].topic
    assert {name: {t: c is not None for t, c in batched_outputs(p).items()} for name, p in forms.items()} == {
        "columns": {topic: True},
        "encoded": {topic: False},
        "single": {},
    }
    for siddhi in (average_siddhi, average_siddhi.replace(COLUMN_WIRE, BATCH_WIRE), WIRE.sub("", average_siddhi)):
        assert set(batched_inputs(plan_instance(average_name, siddhi))) == {topic}  # every form is read
    source = forms["columns"].inputs[0]
    codec = codec_for(source.codec, source.attributes)
    inputs = [Message(source.topic, n % 2, n // 2, 1_000 + n, None, codec.encode(row)) for n, row in enumerate(trades(400, seed=5)[0])]
    outs = {}
    for name, planned in forms.items():
        published = pack(InstanceRuntime(planned).process(inputs, 10_000), batched_outputs(planned))
        on_topic = [m for m in published if m.topic == topic]
        versions = {m.value[1] if batches.is_batch(m.value) else None for m in on_topic}
        assert on_topic and versions == {"columns": {batches.COLUMNS}, "encoded": {batches.VERSION}, "single": {None}}[name]
        outs[name] = [m.value for m in InstanceRuntime(plan_instance(average_name, average_siddhi)).process(_read_back(published, topic), 10_000)]
    assert len(outs["columns"]) > 100 and outs["columns"] == outs["encoded"] == outs["single"]


def test_a_wire_format_this_version_does_not_know_is_refused_with_its_place_and_what_to_do():
    filter_name, filter_siddhi, *_ = _partials()
    newer = filter_siddhi.replace(COLUMN_WIRE, "batch/9")
    assert newer != filter_siddhi
    with pytest.raises(InstancePlanError) as refused:
        plan_instance(filter_name, newer)
    message = str(refused.value)
    assert re.match(rf"{re.escape(filter_name)}:\d+:\d+: wire format 'batch/9' is not one this version", message)
    assert "upgrade sp-dagster" in message


def test_a_redeploy_over_topics_a_newer_version_wrote_is_refused_and_changes_nothing(tmp_path):
    plane = ControlPlane(f"sqlite:///{tmp_path / 'plane.db'}")
    plane.migrate()
    try:
        loaded = load_app(text=APP)
        topology = plan_app(loaded)
        assert state_changes(plane, topology) == []
        record(plane, loaded, topology)
        assert state_changes(plane, topology) == []  # its own format: fine
        recorded = get_deployment(plane, "Trades")
        assert recorded is not None
        newer = {**recorded.plan, "topics": [{**t, "wire": "batch/9"} if "wire" in t else t for t in recorded.plan["topics"]]}
        with plane.transaction() as conn:  # as a newer sp-dagster would have recorded it
            conn.execute(deployments.update().where(deployments.c.app == "Trades").values(plan=json.dumps(newer)))
        with pytest.raises(DeployError, match=r"Trades: topic Trades\.\S+ holds events in wire format 'batch/9'.*undeploy with --delete-topics"):
            state_changes(plane, topology)
        after = get_deployment(plane, "Trades")
        assert after is not None and after.generation == recorded.generation
    finally:
        plane.close()
