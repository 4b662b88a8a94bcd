"""Partial apps read entry topics as JSON (users publish to them) and internal topics as binary."""

from pathlib import Path

from sp_dagster.siddhi import parse
from sp_dagster.topology import plan

ROOT = Path(__file__).resolve().parents[2]


def test_entry_topics_are_json_and_internal_topics_binary():
    topology = plan(parse((ROOT / "apps" / "stock-alerts.siddhi").read_text()))
    roles = {t.name: t.role for t in topology.topics}
    seen = set()
    for instance in topology.partial_apps:
        for definition in instance.app.definitions:
            for source in definition.annotations_named("source"):
                kind = source.annotation("map").get("type")
                expected = "json" if roles[source.get("topic.list")] == "entry" else "binary"
                assert kind == expected, (instance.name, source.get("topic.list"))
                seen.add(kind)
    assert seen == {"json", "binary"}
