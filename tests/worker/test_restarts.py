"""A restart of the whole stack on an in-memory broker (as `sp-dagster down` / `up` does): the control plane
and the state revisions survive, the topics do not. Every key's result after the restart is exact."""

from __future__ import annotations

import pytest

from sp_dagster.deploy import deployment_state, load_app, plan_app
from sp_dagster.embedded import EmbeddedBroker
from sp_dagster.embedded.local_cluster import LocalCluster
from sp_dagster.messaging.kafka import KafkaTransport
from sp_dagster.worker.instance.plan import plan_instance
from tests.fixtures.trades import APP_PATH, SYMBOLS, collect, expected_outputs, publish, trades
from tests.fixtures.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.broker]


def by_symbol(items):
    return {s: [r for r in items if r[0] == s] for s in SYMBOLS}


def trades_app(tmp_path, name: str):
    """The trades app renamed `name` in tmp_path: its path, the loaded app, and its entry input."""
    app_path = tmp_path / "trades.siddhi"
    app_path.write_text(APP_PATH.read_text().replace("Trades", name))
    loaded = load_app(app_path)
    first = plan_app(loaded).group("filter").instances[0]
    (entry,) = plan_instance(first.name, first.siddhi).inputs
    return app_path, loaded, entry


def test_up_deploy_produce_down_up_produce_gives_exact_results_per_key(tmp_path, monkeypatch):
    app_path, loaded, entry = trades_app(tmp_path, "TradesRestart")
    port = None
    for round_, seed in enumerate((31, 32)):
        broker = EmbeddedBroker(port=port, log_path=tmp_path / f"broker-{round_}.log").start()
        port = broker.port
        cluster = LocalCluster(tmp_path / "cluster", broker.bootstrap_servers, workers=1, slots=4).start()
        kafka = KafkaTransport(broker.bootstrap_servers, timeout=15)
        try:
            cluster.deploy(app_path, timeout=240)  # the second time: unchanged, its topics created afresh
            rows, stamps = trades(20_000, seed=seed, symbols=SYMBOLS)
            expected = expected_outputs(loaded.text, rows, stamps)  # the new topics hold only this round's events
            publish(kafka, entry, rows, stamps)
            got = collect(kafka, f"{loaded.name}.Averages", expected, timeout=180)
            assert by_symbol(got) == by_symbol(expected), cluster.logs()
            assert len(got) == len(expected)
            if round_:
                with cluster.plane() as plane:
                    notes = {i.instance: i.detail for i in deployment_state(plane, loaded.name).instances}
                assert all(note and note.startswith("state and offsets reset: ") for note in notes.values()), notes
                _undeploy_dropping_state(cluster, loaded.name, monkeypatch)
        finally:
            kafka.close()
            cluster.stop()
            broker.stop()


def _undeploy_dropping_state(cluster, app, monkeypatch):
    """`undeploy --drop-state`: once the worker let go, no revision and no checkpoint of the app is left."""
    from sp_dagster.cluster.store.revisions import RevisionStore
    from sp_dagster.config.loader import load_config
    from sp_dagster.deploy import undeploy
    from sp_dagster.deploy.state import checkpoint_directories, drop_state

    monkeypatch.setenv("SP_DAGSTER_HOME", str(cluster.home))  # where the workers keep their local checkpoints
    config = load_config(cluster.worker_conf)
    with cluster.plane() as plane:
        instances = [i.instance for i in deployment_state(plane, app).instances]
        assert checkpoint_directories(config, instances)
        undeploy(plane, app)
        assert drop_state(plane, config, instances, timeout=60).startswith(f"dropped the state of {len(instances)} instances")
        store = RevisionStore.from_config(config, plane)
        assert all(store.revisions(i) == [] for i in instances)
        store.close()
    assert checkpoint_directories(config, instances) == []


def test_a_redeploy_after_drop_state_from_another_machine_starts_empty_at_the_committed_offsets(tmp_path, monkeypatch):
    # The operator's machine shares only the control plane: its own persistence file and home hold
    # nothing of the workers', so it can delete no revision and no checkpoint of theirs itself.
    from sp_dagster.cluster.store.revisions import RevisionStore
    from sp_dagster.config.loader import load_config
    from sp_dagster.deploy import undeploy
    from sp_dagster.deploy.state import drop_state

    app_path, loaded, entry = trades_app(tmp_path, "TradesDrop")
    topic = f"{loaded.name}.Averages"
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        cluster = LocalCluster(tmp_path / "cluster", broker.bootstrap_servers, workers=1, slots=4).start()
        kafka = KafkaTransport(broker.bootstrap_servers, timeout=15)
        try:
            cluster.deploy(app_path, timeout=240)
            rows, stamps = trades(3_000, seed=41, symbols=SYMBOLS)
            expected = expected_outputs(loaded.text, rows, stamps)
            publish(kafka, entry, rows, stamps)
            assert len(collect(kafka, topic, expected, timeout=180)) == len(expected), cluster.logs()
            worker_config = load_config(cluster.worker_conf, role="worker")
            with cluster.plane() as plane:
                instances = [i.instance for i in deployment_state(plane, loaded.name).instances]
                store = RevisionStore.from_config(worker_config, plane)
                # Every instance has saved the state a replay must not bring back.
                wait_until(lambda: all(store.revisions(i) for i in instances), timeout=60, interval=0.5, what="a state revision of every instance")
                store.close()
                operator = tmp_path / "operator.yaml"
                operator.write_text(
                    cluster.worker_conf.read_text().replace(str(tmp_path / "cluster" / "persistence.db"), str(tmp_path / "operator-persistence.db"))
                )
                monkeypatch.setenv("SP_DAGSTER_HOME", str(tmp_path / "operator-home"))
                undeploy(plane, loaded.name)
                said = drop_state(plane, load_config(operator), instances, timeout=60)
            assert said.startswith(f"dropped the state of {len(instances)} instances: a redeploy starts them empty"), said
            assert "(0 revisions and 0 checkpoint directories deleted here)" in said  # nothing of the workers' is here
            # The worker deletes the checkpoint folders it holds, on the control plane's word.
            held = lambda: [p for i in instances for p in (tmp_path / "cluster").glob(f"worker-*/checkpoints/{i}")]  # noqa: E731
            assert held(), "the worker kept no checkpoint folder: their deletion would prove nothing"
            wait_until(lambda: not held(), 60, 0.5, "the worker deleting the checkpoint folders of the dropped state")
            end = kafka.end_offsets(topic)[0]
            cluster.deploy(app_path, timeout=240)
            rows, stamps = trades(2_000, seed=42, symbols=SYMBOLS)
            expected = expected_outputs(loaded.text, rows, [s + 10_000 for s in stamps])  # as if nothing came before
            publish(kafka, entry, rows, [s + 10_000 for s in stamps])
            got = collect(kafka, topic, expected, timeout=180, start=end)
            assert by_symbol(got) == by_symbol(expected), cluster.logs()
            assert len(got) == len(expected)
        finally:
            kafka.close()
            cluster.stop()
