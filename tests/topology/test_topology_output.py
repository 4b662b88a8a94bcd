"""The plan's outputs: the JSON contract, text, Mermaid, `sp-dagster plan`, the partial apps'
transport annotations, and byte-identical output for the same input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_topology_cases import CASES as WSO2_CASES
from test_topology_cases import ERRORS as WSO2_ERRORS
from test_topology_rules import CASES as RULES
from test_topology_rules import PARALLEL_FIX
from topology_support import ROOT, plan_text

from sp_dagster.messaging.kafka import KafkaTransport
from sp_dagster.siddhi import SiddhiQLError
from sp_dagster.topology import TopologyError, partition_numbers, topic_name
from sp_dagster.topology.output import error_dict, render_json, render_mermaid, render_text, to_dict

SAMPLE = ROOT / "apps" / "stock-alerts.siddhi"


def run_cli(*args: str, seed: str = "0") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    return subprocess.run([sys.executable, "-m", "sp_dagster.cli", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


def _valid_apps() -> dict[str, str]:
    apps = {f"rule: {name}": case.app for name, case in RULES.items() if case.error is None}
    apps.update({f"wso2: {name}": case["app"] for name, case in WSO2_CASES.items() if name not in WSO2_ERRORS})
    return apps


def test_json_follows_the_contract():
    data = to_dict(plan_text(SAMPLE.read_text()))
    assert set(data) == {"app", "groups", "topics"} and data["app"] == "StockAlerts"
    for group in data["groups"]:
        assert set(group) == {"name", "parallelism", "receiver", "inputs", "outputs", "instances"}
        assert isinstance(group["parallelism"], int) and isinstance(group["receiver"], bool)
        for subscription in group["inputs"].values():
            assert set(subscription) == {"strategy", "partition_key", "topic"}
            assert subscription["strategy"] in ("all", "round_robin", "field_grouping")
        for publications in group["outputs"].values():
            for publication in publications:
                assert set(publication) == {"strategy", "partition_key", "topic", "partitions"}
        for instance in group["instances"]:
            assert set(instance) == {"name", "siddhi"}
    assert data["groups"][1]["inputs"] == {
        "LargeTradeStream": {"strategy": "field_grouping", "partition_key": "symbol", "topic": "StockAlerts.LargeTradeStream.symbol"}
    }
    assert data["groups"][0]["outputs"] == {
        "LargeTradeStream": [{"strategy": "field_grouping", "partition_key": "symbol", "topic": "StockAlerts.LargeTradeStream.symbol", "partitions": 2}]
    }
    assert data["topics"] == [
        {"name": "StockAlerts.AveragePriceStream", "partitions": 1, "wire": "batch/2"},
        {"name": "StockAlerts.LargeTradeStream.symbol", "partitions": 2, "wire": "batch/2"},
        {"name": "StockAlerts.PriceAlerts", "partitions": 1},
        {"name": "StockAlerts.TradeStream", "partitions": 2},
    ]


@pytest.mark.parametrize("name", sorted(_valid_apps()))
def test_the_same_app_gives_the_same_bytes(name):
    text = _valid_apps()[name]
    first, second = plan_text(text), plan_text(text)
    assert render_json(first) == render_json(second)
    assert render_text(first) == render_text(second) and render_mermaid(first) == render_mermaid(second)


def test_the_text_shows_every_partial_apps_siddhiql_under_its_name():
    topology = plan_text(SAMPLE.read_text(encoding="utf-8"))
    text = render_text(topology)
    for instance in topology.partial_apps:
        block = "\n".join(f"       | {line}".rstrip() for line in instance.siddhi.rstrip().splitlines())
        assert f"  app  {instance.name}" in text and block in text, instance.name
        assert text.index(block) > text.index(f"  app  {instance.name}")
    assert len(topology.partial_apps) == 5


def test_the_text_counts_in_the_right_number():
    one = plan_text("@App:name('One')\ndefine stream In (a int);\n@sink(type='log')\ndefine stream Out (a int);\nfrom In select a insert into Out;\n")
    assert render_text(one).splitlines()[0] == "app One: 1 execution group, 1 topic"
    assert render_text(plan_text(SAMPLE.read_text(encoding="utf-8"))).splitlines()[0] == "app StockAlerts: 3 execution groups, 4 topics"


def test_the_cli_output_does_not_depend_on_hash_seeds():
    outputs = {run_cli("plan", str(SAMPLE), "--format", "json", seed=seed).stdout for seed in ("1", "2", "3")}
    assert len(outputs) == 1
    data = json.loads(outputs.pop())
    assert [g["name"] for g in data["groups"]] == ["StockAlerts-filter", "StockAlerts-average", "StockAlerts-alert"]


def test_cli_text_and_mermaid():
    text = run_cli("plan", str(SAMPLE))
    assert text.returncode == 0
    assert "StockAlerts-average (user, parallel 2)" in text.stdout
    assert "  in   LargeTradeStream  field_grouping(symbol)  <- StockAlerts.LargeTradeStream.symbol" in text.stdout
    assert "  app  StockAlerts-average-2  reads StockAlerts.LargeTradeStream.symbol [1]" in text.stdout
    mermaid = run_cli("plan", str(SAMPLE), "--format", "mermaid")
    assert mermaid.returncode == 0 and mermaid.stdout.startswith("flowchart LR\n")
    assert '    g1 -->|"field_grouping(symbol)"| t2' in mermaid.stdout


def test_cli_plan_gives_parallel_groups_the_room_its_conf_names(tmp_path):
    conf = tmp_path / "deployment.yaml"
    manager = (ROOT / "conf" / "manager" / "deployment.yaml").read_text()
    conf.write_text(manager.replace("  type: distributed\n", "  type: distributed\n  maxParallelism: 6\n", 1))
    text = run_cli("plan", str(SAMPLE), "--conf", str(conf))
    assert text.returncode == 0, text.stderr
    assert "StockAlerts-average (user, parallel 2, at most 6)" in text.stdout
    data = json.loads(run_cli("plan", str(SAMPLE), "--format", "json", "--conf", str(conf)).stdout)
    assert {t["name"]: t["partitions"] for t in data["topics"]}["StockAlerts.LargeTradeStream.symbol"] == 6


def test_cli_invalid_app_as_json_and_as_text(tmp_path):
    app = tmp_path / "bad.siddhi"
    app.write_text("define stream S (k string, v int);\n@dist(execGroup='w', parallel='2')\nfrom S#window.length(5) select k, v insert into O;\n")
    result = run_cli("plan", str(app), "--format", "json")
    assert result.returncode == 1
    assert json.loads(result.stdout) == {
        "error": {"line": 3, "column": 15, "message": "bad-w Window queries used with parallel greater than 1 outside partitioned stream" + PARALLEL_FIX}
    }
    result = run_cli("plan", str(app))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith(f"error: {app}:3:15: bad-w Window queries") and "Traceback" not in result.stderr


def test_cli_reports_language_errors_the_same_way(tmp_path):
    app = tmp_path / "typo.siddhi"
    app.write_text("define stream S (a int);\nfrom Nope select a insert into T;\n")
    result = run_cli("plan", str(app), "--format", "json")
    error = json.loads(result.stdout)["error"]
    assert result.returncode == 1 and (error["line"], error["column"]) == (2, 6) and "Nope" in error["message"]
    missing = run_cli("plan", str(tmp_path / "absent.siddhi"), "--format", "json")
    assert missing.returncode == 1 and json.loads(missing.stdout)["error"]["message"].startswith(f"{tmp_path / 'absent.siddhi'}: cannot be read")


def test_a_language_error_is_not_a_topology_error():
    with pytest.raises(SiddhiQLError) as raised:
        plan_text("define stream S (a int);\n@dist(execGroup='g', parallel='2') from Nope select a insert into T;\n")
    assert not isinstance(raised.value, TopologyError)
    assert error_dict(raised.value)["error"]["line"] == 2


def test_an_app_without_a_name_is_named_by_the_caller():
    topology = plan_text("define stream S (a int);\nfrom S select a insert into T;\n", name="orders")
    assert [g.name for g in topology.groups] == ["orders-default"] and topology.topics[0].name == "orders.S"
    assert plan_text("define stream S (a int);\nfrom S select a insert into T;\n").app == "SiddhiApp"


def _source(instance, stream):
    (annotation,) = [a for a in instance.app.definition(stream).annotations_named("source") if a.get("type") == "kafka"]
    return {e.key: e.value for e in annotation.elements}


def test_partial_apps_carry_topic_partitions_consumer_group_and_mapping():
    topology = plan_text(SAMPLE.read_text())
    average = topology.group("average")
    assert _source(average.instances[1], "LargeTradeStream") == {
        "type": "kafka",
        "topic.list": "StockAlerts.LargeTradeStream.symbol",
        "group.id": "StockAlerts-average",
        "partition.no.list": "1",
        "threading.option": "partition.wise",
        "bootstrap.servers": "${bootstrap}",
    }
    assert _source(topology.group("alert").instances[0], "AveragePriceStream")["group.id"] == "StockAlerts-alert-1"
    (sink,) = topology.group("filter").instances[0].app.definition("LargeTradeStream").annotations_named("sink")
    assert sink.annotation("map").get("type") == "binary"
    distribution = sink.annotation("distribution")
    assert (distribution.get("strategy"), distribution.get("partitionKey")) == ("partitioned", "symbol")
    assert [d.get("partition.no") for d in distribution.annotations_named("destination")] == ["0", "1"]
    assert "@dist(" not in topology.group("average").instances[0].siddhi
    # an inferred stream that travels between groups gets a definition with Siddhi's types
    definition = average.instances[0].app.definition("AveragePriceStream")
    assert [(a.name, a.type) for a in definition.attributes] == [("symbol", "string"), ("avgPrice", "double"), ("trades", "long")]


def test_a_field_grouped_topic_wider_than_the_group_is_split_in_contiguous_runs():
    topology = plan_text(RULES["field-grouped topics are sized to the widest reader"].app)
    narrow = topology.group("narrow")
    assert [i.partitions_of("Size.T.k") for i in narrow.instances] == [(0, 1), (2, 3, 4)]
    assert [_source(i, "T")["partition.no.list"] for i in narrow.instances] == ["0,1", "2,3,4"]


def test_the_passthrough_hosts_one_user_source_without_its_dist():
    topology = plan_text(RULES["each user source gets its own passthrough"].app)
    for group, url in (("passthrough-S-1", "http://0.0.0.0:8080/a"), ("passthrough-S-2", "http://0.0.0.0:8080/b")):
        for instance in topology.group(group).instances:
            (source,) = instance.app.definition("passthroughS").annotations_named("source")
            assert source.get("receiver.url") == url and not source.annotations_named("dist")
            assert "from passthroughS\nselect *\ninsert into S;" in instance.siddhi
    work = topology.group("work").instances[0].app.definition("S")
    assert [a.get("type") for a in work.annotations_named("source")] == ["kafka"]


def test_user_sinks_stay_with_producers_and_cluster_kafka_gets_the_servers():
    topology = plan_text(RULES["a kafka sink without servers publishes on the cluster"].app)
    (sink,) = topology.group("w").instances[0].app.definition("Alerts").annotations_named("sink")
    assert (sink.get("topic"), sink.get("bootstrap.servers")) == ("alerts", "${bootstrap}")
    assert topology.topic("alerts").role == "external"
    seed = plan_text(RULES["seed 004: a distributed sink stays with the group producing the stream"].app)
    (sink,) = seed.group("throttle").instances[0].app.definition("Request").annotations_named("sink")
    assert sink.get("type") == "http" and sink.annotation("distribution").get("partitionKey") == "userTenantDomain"


def test_a_keyed_entry_stream_is_routed_by_a_passthrough():
    topology = plan_text(RULES["a stream a partition does not key is broadcast; a keyed entry stream gets a router"].app)
    router = topology.groups[0]
    assert (router.name, router.receiver, router.kind) == ("Bcast-passthrough-S", False, "passthrough")
    assert [(p.topic, p.strategy, p.partitions) for p in router.outputs] == [("Bcast.S.k", "field_grouping", 3)]
    assert {t.name: t.role for t in topology.topics} == {"Bcast.Limits": "entry", "Bcast.S": "entry", "Bcast.S.k": "internal"}
    check = topology.group("check")
    assert [_source(i, "Limits")["group.id"] for i in check.instances] == ["Bcast-check-1", "Bcast-check-2", "Bcast-check-3"]


@pytest.mark.parametrize(
    "parallelism, partitions, expected",
    [(1, 1, [(0,)]), (2, 2, [(0,), (1,)]), (2, 3, [(0,), (1, 2)]), (3, 4, [(0,), (1,), (2, 3)]), (2, 5, [(0, 1), (2, 3, 4)])],
)
def test_partition_numbers_as_the_original(parallelism, partitions, expected):
    assert [partition_numbers(parallelism, partitions, i) for i in range(parallelism)] == expected


def test_more_instances_than_partitions_is_refused():
    with pytest.raises(ValueError):
        partition_numbers(3, 2, 0)


@pytest.mark.parametrize("stream, key", [("S", None), ("S", "symbol")])
def test_topic_names_match_the_messaging_layer(stream, key):
    assert topic_name("App", stream, key) == KafkaTransport("localhost:1").topic_name("App", stream, key)
