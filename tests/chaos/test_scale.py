"""`sp-dagster scale` of a keyed group with room to grow (`maxParallel='3'`) under load on real workers: 1 -> 2 -> 3 -> 2
instances, every key's outputs equal the engine's, and no topic changes (the embedded broker could not add partitions).
On Kafka and on NATS JetStream alike: a rescale within the room stops each old instance after a last checkpoint, so even
at-least-once NATS replays nothing."""

from __future__ import annotations

import uuid

import pytest

from sp_dagster.embedded.chaos import KEYED_GROUP, ChaosRun
from tests.fixtures.chaos import run_exact
from tests.fixtures.trades import APP_PATH

pytestmark = [pytest.mark.slow]


@pytest.fixture(params=[pytest.param("kafka", marks=pytest.mark.broker), pytest.param("nats", marks=pytest.mark.nats)])
def layer(request):
    """The messaging layer's name and servers: the embedded Kafka broker, then a real nats-server."""
    if request.param == "nats":
        return "nats", request.getfixturevalue("nats_server").url
    return "kafka", request.getfixturevalue("broker").bootstrap_servers


def test_scale_up_then_down_within_the_maximum_is_exact_and_changes_no_topic(layer, tmp_path):
    messaging, servers = layer
    name = f"TradesScale{messaging.title()}"
    text = APP_PATH.read_text().replace("Trades", name).replace(KEYED_GROUP.format(2), KEYED_GROUP.format(1) + ", maxParallel = '3'")
    run = ChaosRun(tmp_path, servers, text, messaging=messaging, cluster_id=f"scale{uuid.uuid4().hex[:6]}")
    topics = {t.name: t.partitions for t in run.loaded.topology.topics}
    assert topics[f"{name}.BigTradeStream.symbol"] == 3  # laid out for the maximum from the start
    run_exact(run, ("scale-up", "scale-up", "scale-down"), check_faults=False, seed=7)
    with run.cluster.plane() as plane:
        from sp_dagster.cluster.store.deployments import list_instances

        running = sorted(i.instance_id for i in list_instances(plane, name) if "-average-" in i.instance_id)
    assert running == [f"{name}-average-1", f"{name}-average-2"]
    transport = run.client()
    try:
        assert {topic: transport.require_topic(topic).partitions for topic in topics} == topics
    finally:
        transport.close()
