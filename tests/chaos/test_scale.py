"""`sp-dagster scale` of a keyed group with room to grow (`maxParallel='3'`) under load on real workers: 1 -> 2 -> 3 -> 2
instances, every key's outputs equal the engine's, and no topic changes (the embedded broker could not add partitions)."""

from __future__ import annotations

import json

import pytest

from sp_dagster.embedded.chaos import KEYED_GROUP, ChaosRun
from tests.fixtures.trades import APP_PATH

pytestmark = [pytest.mark.slow, pytest.mark.broker]


def test_scale_up_then_down_within_the_maximum_is_exact_and_changes_no_topic(broker, tmp_path):
    from sp_dagster.messaging.kafka import KafkaTransport

    text = APP_PATH.read_text().replace("Trades", "TradesScale").replace(KEYED_GROUP.format(2), KEYED_GROUP.format(1) + ", maxParallel = '3'")
    run = ChaosRun(tmp_path, broker.bootstrap_servers, text)
    transport = KafkaTransport(broker.bootstrap_servers, timeout=15)
    try:
        topics = {t.name: t.partitions for t in run.loaded.topology.topics}
        assert topics["TradesScale.BigTradeStream.symbol"] == 3  # laid out for the maximum from the start
        report = run.run(("scale-up", "scale-up", "scale-down"), seed=7, settle_s=(6.0, 10.0))
        for line in report.lines():
            print(json.dumps(line))
        verdict = "\n".join(json.dumps(line) for line in report.lines())
        assert report.events_in > 0 and report.outputs > 0
        assert (report.lost, report.duplicated) == (0, 0), f"{verdict}\n{run.final_status}\n{run.cluster.logs()}"
        assert report.exact_per_key and report.outputs == report.expected
        with run.cluster.plane() as plane:
            from sp_dagster.cluster.store.deployments import list_instances

            running = sorted(i.instance_id for i in list_instances(plane, "TradesScale") if "-average-" in i.instance_id)
        assert running == ["TradesScale-average-1", "TradesScale-average-2"]
        assert {name: transport.require_topic(name).partitions for name in topics} == topics
    finally:
        transport.close()
