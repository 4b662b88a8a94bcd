"""Health: observations of each partial app and the live-worker and lag checks, run as Dagster's health job."""

from __future__ import annotations

import dagster as dg

from sp_dagster.cluster.store.deployments import list_instances
from sp_dagster.deploy import load_app, plan_app, record
from sp_dagster.orchestration.definitions import build_definitions
from sp_dagster.orchestration.health import growing_lags, worker_problems
from tests.fixtures.waiting import wait_until
from tests.orchestration.standin import StandInWorker

FILTER, ALERT = dg.AssetKey(["StockAlerts", "filter"]), dg.AssetKey(["StockAlerts", "alert"])
SINK = "StockAlerts.PriceAlerts"  # published to by the alert group, read by none


def check_results(result) -> dict[tuple[str, str], dg.AssetCheckEvaluation]:
    evaluations = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    return {(e.asset_key.path[-1], e.check_name): e for e in evaluations}


def test_observations_and_checks_follow_the_workers_and_the_lag(cluster, manager, plane):
    from sp_dagster.deploy import create_topics
    from sp_dagster.messaging.kafka import KafkaTransport

    loaded = load_app(cluster.add_app())
    record(plane, loaded, plan_app(loaded))
    kafka = KafkaTransport(cluster.bootstrap, timeout=15)
    create_topics(loaded.topology, kafka)
    (entry,) = [s["topic"] for s in plan_inputs(loaded, "filter")]
    publisher = kafka.raw_publisher()
    instance = dg.DagsterInstance.ephemeral()
    worker = StandInWorker(plane, "worker-1").start()
    try:
        wait_until(lambda: all(i.status == "running" for i in list_instances(plane, "StockAlerts")), what="every instance running")
        health = build_definitions(str(cluster.manager_conf), str(cluster.worker_conf)).get_job_def("health")
        results = []
        for n, lag in enumerate((10, 20, 30), start=1):
            worker.metrics["StockAlerts-filter-1"] = {
                "mode": "continuous",
                "rows_in_total": 100 * n,
                "rows_out_total": 50 * n,
                "rows_per_s": 10.0,
                "lag": lag,
                "latency_ms_p50": 4.0 * n,
                "latency_ms_p99": 9.5 * n,
            }
            wait_until(
                lambda: next(i for i in list_instances(plane, "StockAlerts") if i.instance_id == "StockAlerts-filter-1").metrics.get("lag") == lag,
                what=f"lag {lag} reported",
            )
            for _ in range(5 * n):  # 5, 10, 15 more events in the entry topic's partition 0
                publisher.produce(entry, b"{}", None, 0, None)
            for _ in range(0 if n == 2 else n):  # results land in the sink at the first and the last check only
                publisher.produce(SINK, b"{}", None, 0, None)
            publisher.flush()
            result = health.execute_in_process(instance=instance)
            assert result.success
            results.append(check_results(result))
    finally:
        worker.stop(leave=False)
        kafka.close()

    assert all(r[("filter", "live_worker")].passed for r in results)
    assert [r[("filter", "lag_not_growing")].passed for r in results] == [True, True, False]
    failed = results[-1][("filter", "lag_not_growing")]
    assert failed.severity == dg.AssetCheckSeverity.WARN and "StockAlerts-filter-1: lag 10 -> 20 -> 30" in failed.description
    assert results[-1][("alert", "lag_not_growing")].passed
    advice = results[-1][("filter", "parallelism_advice")]  # the leader's load samples of the filter group, read back
    assert advice.passed and advice.metadata["parallel"].value == 2 and advice.metadata["advised"].value == 2

    observations = instance.fetch_observations(FILTER, limit=10).records
    assert len(observations) == 3
    latest = observations[0].asset_observation.metadata
    assert latest["running"].value == "2/2" and latest["lag"].value == 30 and latest["rows_in_total"].value == 300
    assert latest["instances"].value["StockAlerts-filter-1"]["worker"] == "worker-1"
    assert latest["instances"].value["StockAlerts-filter-1"]["latency_ms_p99"] == 28.5 and latest["latency_ms_p99"].value == 28.5
    assert latest["latency_ms_p50"].value == 12.0
    assert latest["events_in_per_s"].value > 0 and "worker-1" in latest["workers"].value

    # The entry topic's asset: the events it holds, their rate, and the lag of the filter group reading it.
    topic_observations = instance.fetch_observations(dg.AssetKey(["topics", entry]), limit=10).records
    seen = [r.asset_observation.metadata for r in reversed(topic_observations)]
    assert [m["events_total"].value for m in seen] == [5, 15, 30]
    assert seen[-1]["end_offsets"].value["0"] == 30 and seen[-1]["consumer_lag"].value == 30
    assert "events_per_s" not in seen[0] and seen[-1]["events_per_s"].value > 0

    # The sink topic materializes when it holds new events (its freshness policy measures from there).
    sink = instance.fetch_materializations(dg.AssetKey(["topics", SINK]), limit=10).records
    assert [(r.asset_materialization.metadata["events_total"].value, r.asset_materialization.description) for r in reversed(sink)] == [
        (1, "holds 1 event"),
        (4, "3 new events since the last check"),
    ]
    assert not instance.fetch_materializations(dg.AssetKey(["topics", entry]), limit=10).records  # read by the app: no freshness of its own

    # The worker went silent: the leader declares it dead and the live-worker check fails.
    wait_until(lambda: any(i.node_id is None for i in list_instances(plane, "StockAlerts")) or _dead(plane), timeout=15, what="the worker declared dead")
    result = health.execute_in_process(instance=instance)
    evaluation = check_results(result)[("alert", "live_worker")]
    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR
    assert "StockAlerts-alert-1:" in evaluation.description

    # The deployed version is the partial app's materialization: logged once per generation, and the
    # checks count for it (the graph shows them on the asset instead of "never materialized").
    materialized = instance.fetch_materializations(FILTER, limit=10).records
    assert len(materialized) == 1
    assert materialized[0].asset_materialization.metadata["generation"].value == 1
    assert materialized[0].asset_materialization.metadata["parallelism"].value == 2
    assert failed.target_materialization_data is not None and failed.target_materialization_data.storage_id == materialized[0].storage_id
    changed = load_app(text=loaded.text.replace("volume > 100", "volume > 200"), source="stock-alerts.siddhi")
    record(plane, changed, plan_app(changed))
    health.execute_in_process(instance=instance)
    again = instance.fetch_materializations(FILTER, limit=10).records
    assert [r.asset_materialization.metadata["generation"].value for r in again] == [2, 1]


def plan_inputs(loaded, exec_group: str) -> list[dict]:
    """The inputs of one execution group of a loaded app, as its plan records them."""
    from sp_dagster.topology.output import to_dict

    (group,) = [g for g in to_dict(loaded.topology)["groups"] if g["name"] == f"{loaded.name}-{exec_group}"]
    return list(group["inputs"].values())


def _dead(plane) -> bool:
    from sp_dagster.cluster.membership import list_nodes

    return any(n.state == "dead" for n in list_nodes(plane))


def test_growing_lag_needs_every_step_to_rise():
    assert growing_lags([{"a": 1}, {"a": 2}], {"a": 3}, 3) == {"a": [1, 2, 3]}
    assert growing_lags([{"a": 1}, {"a": 5}], {"a": 3}, 3) == {}
    assert growing_lags([{"a": 1}], {"a": 3}, 3) == {}  # not enough observations yet
    assert growing_lags([{}, {"b": 1}], {"a": 3, "b": 2}, 2) == {"b": [1, 2]}


def test_worker_problems_name_each_instance_and_why():
    nodes = {
        "w1": {"node": "w1", "state": "alive", "last_heartbeat_ago_ms": 100},
        "w2": {"node": "w2", "state": "dead", "last_heartbeat_ago_ms": 9000},
        "w3": {"node": "w3", "state": "alive", "last_heartbeat_ago_ms": 5000},
    }
    instances = [
        {"instance": "a", "node": "w1"},
        {"instance": "b", "node": "w2"},
        {"instance": "c", "node": "w3"},
        {"instance": "d", "node": None, "detail": "no live worker"},
        {"instance": "e", "node": "w9"},
    ]
    assert worker_problems(instances, nodes, 1000) == [
        "b: its worker w2 is dead",
        "c: its worker w3 has been silent for 5.0 s",
        "d: not placed (no live worker)",
        "e: its worker w9 is not registered",
    ]


def test_receiver_urls_appear_in_the_observation():
    from sp_dagster.orchestration.health import observe

    key = dg.AssetKey(["Tenants", "passthrough-RequestIn"])
    url = "http://0.0.0.0:8280/requests"
    instances = [
        {
            "instance": "Tenants-passthrough-RequestIn-1",
            "node": "receiver-1",
            "status": "running",
            "metrics": {"mode": "receiver", "receiver_urls": [url], "rows_in_total": 7},
        }
    ]
    nodes = {"receiver-1": {"node": "receiver-1", "state": "alive", "last_heartbeat_ago_ms": 100}}
    metadata = observe(key, instances, nodes, [], 0.0).metadata
    assert metadata["receiver_urls"].value == [url]
    assert metadata["instances"].value["Tenants-passthrough-RequestIn-1"]["receiver_urls"] == [url]
    assert "receiver_urls" not in observe(key, [{**instances[0], "metrics": {}}], nodes, [], 0.0).metadata


def test_the_lag_check_fails_while_an_instance_reads_nothing():
    from sp_dagster.orchestration.health import lag_result

    key = dg.AssetKey(["App", "filter"])
    running = {"instance": "App-filter-1", "node": "w1", "status": "running"}
    unplaced = {"instance": "App-filter-2", "node": None, "status": "starting"}
    starting = {"instance": "App-filter-3", "node": "w2", "status": "starting"}
    assert lag_result(key, "App", [running], [], {"App-filter-1": 0}, 3).passed
    result = lag_result(key, "App", [running, unplaced, starting], [], {"App-filter-1": 0}, 3)  # only the running one reports "lag 0"
    assert not result.passed and result.severity == dg.AssetCheckSeverity.WARN
    assert result.description == (
        "2 instances not running, so nothing reads their input and the lag there is not known: App-filter-2 (not placed), App-filter-3 (starting)"
    )
    growing = lag_result(key, "App", [running, unplaced], [{"App-filter-1": 1}, {"App-filter-1": 2}], {"App-filter-1": 3}, 3)
    assert growing.description.startswith("lag keeps growing: App-filter-1: lag 1 -> 2 -> 3; 1 instance not running, so nothing reads its input")
