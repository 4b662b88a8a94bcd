"""`sp-dagster scale` of a keyed group on micro-batch workers: each new query starts its partitions where the old queries'
last committed batches ended, and takes over the state of the keys it now owns (read from the old checkpoints with
Spark's state data source, handed in as initial state). 1 -> 3 -> 2 instances with events between the steps: every
symbol's outputs are the engine's in order (a key whose window restarted empty, or a partition read again from its
start, would show), and no topic changes. On Kafka and on NATS JetStream."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from sp_dagster.deploy import load_app, plan_app
from sp_dagster.embedded.chaos import KEYED_GROUP
from sp_dagster.embedded.local_cluster import LocalCluster
from sp_dagster.worker.instance.plan import plan_instance
from tests.fixtures.trades import APP_PATH, SYMBOLS, collect, expected_outputs, publish, trades

pytestmark = [pytest.mark.slow]


@pytest.fixture(params=[pytest.param("kafka", marks=pytest.mark.broker), pytest.param("nats", marks=pytest.mark.nats)])
def layer(request):
    """The messaging layer's name, servers, cluster id and a client: the embedded Kafka broker, then a real nats-server."""
    if request.param == "nats":
        from sp_dagster.messaging.nats import NatsTransport

        url, cluster_id = request.getfixturevalue("nats_server").url, f"mbscale{uuid.uuid4().hex[:6]}"
        transport = NatsTransport(url, cluster_id, timeout=15)
        yield "nats", url, cluster_id, transport
        transport.close()
    else:
        yield "kafka", request.getfixturevalue("broker").bootstrap_servers, "sp-dagster", request.getfixturevalue("kafka")


def by_symbol(outputs: list[tuple]) -> dict[str, list[tuple]]:
    """Each symbol's outputs in the order they came."""
    found: dict[str, list[tuple]] = {}
    for output in outputs:
        found.setdefault(output[0], []).append(output)
    return found


def keyed_app(tmp_path, name: str):
    """The trades app named `name` with its keyed group at parallel 1 and room for 3: its file, the loaded app, its plan
    and the filter group's entry stream."""
    text = APP_PATH.read_text().replace("Trades", name).replace(KEYED_GROUP.format(2), KEYED_GROUP.format(1) + ", maxParallel = '3'")
    app_path = tmp_path / "app.siddhi"
    app_path.write_text(text)
    loaded = load_app(app_path)
    topology = plan_app(loaded)
    group = topology.group("filter")
    assert group is not None
    (entry,) = plan_instance(group.instances[0].name, group.instances[0].siddhi).inputs
    return app_path, loaded, topology, entry


def test_a_keyed_groups_positions_and_state_move_across_micro_batch_rescales(layer, tmp_path):
    messaging, servers, cluster_id, kafka = layer
    name = f"TradesMicroScale{messaging.title()}"
    app_path, loaded, topology, entry = keyed_app(tmp_path, name)
    rows, stamps = trades(3000, seed=5, symbols=SYMBOLS)
    cluster = LocalCluster(tmp_path / "cluster", servers, mode="microbatch", messaging=messaging, cluster_id=cluster_id).start()
    try:
        cluster.deploy(app_path, timeout=240)
        partitions = {t.name: kafka.require_topic(t.name).partitions for t in topology.topics}
        for step, parallel in ((1000, 3), (2000, 2), (3000, None)):
            done = slice(step - 1000, step)
            publish(kafka, entry, rows[done], stamps[done])
            expected = expected_outputs(loaded.text, rows[:step], stamps[:step])
            got = collect(kafka, f"{name}.Averages", expected, timeout=180)
            assert by_symbol(got) == by_symbol(expected), f"after {step} events:\n{cluster.logs()}"
            if parallel is not None:
                cluster.cli("scale", name, "average", str(parallel))
        assert cluster.grep(r"starts with the keys it owns of"), cluster.logs()
        assert {t: kafka.require_topic(t).partitions for t in partitions} == partitions
    finally:
        cluster.stop()


def test_under_load_a_micro_batch_rescale_neither_loses_nor_repeats_an_output(layer, tmp_path):
    messaging, servers, cluster_id, kafka = layer
    name = f"TradesMicroLoad{messaging.title()}"
    app_path, loaded, _topology, entry = keyed_app(tmp_path, name)
    rows, stamps = trades(20_000, seed=9, symbols=SYMBOLS)
    sent, stop = [0], threading.Event()

    def produce() -> None:
        """50 trades every 0.2 s until stopped: a steady load through both rescales."""
        while not stop.is_set() and sent[0] < len(rows):
            chunk = slice(sent[0], sent[0] + 50)
            publish(kafka, entry, rows[chunk], stamps[chunk])
            sent[0] += len(rows[chunk])
            time.sleep(0.2)

    cluster = LocalCluster(tmp_path / "cluster", servers, mode="microbatch", messaging=messaging, cluster_id=cluster_id).start()
    producer = threading.Thread(target=produce, daemon=True)
    try:
        cluster.deploy(app_path, timeout=240)
        producer.start()
        time.sleep(5)
        cluster.cli("scale", name, "average", "3")
        time.sleep(5)
        cluster.cli("scale", name, "average", "2")
        time.sleep(5)
        stop.set()
        producer.join(30)
        expected = expected_outputs(loaded.text, rows[: sent[0]], stamps[: sent[0]])
        got = collect(kafka, f"{name}.Averages", expected, timeout=180)
        assert by_symbol(got) == by_symbol(expected), (len(got), len(expected), cluster.logs())
    finally:
        stop.set()
        cluster.stop()
