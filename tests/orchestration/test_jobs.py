"""The deploy, undeploy and rebalance jobs, executed in process against the real broker and a SQLite control plane.

A leader manager runs in a thread; the workers are stand-ins that speak the workers'
control-plane protocol (see standin.py), since these tests are about Dagster, not Spark.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from sp_dagster.cluster.election import current_leader, rebalance_requests
from sp_dagster.cluster.store.deployments import get_deployment, list_instances
from sp_dagster.orchestration.jobs import deploy_job, rebalance_job, undeploy_job
from sp_dagster.orchestration.sensors import build_app_repository_sensor
from tests.fixtures.waiting import wait_until
from tests.orchestration.standin import StandInWorker

SAMPLE_APP = Path(__file__).resolve().parents[2] / "apps" / "stock-alerts.siddhi"
DEPLOY_STEPS = ["load_app", "plan_app", "create_topics", "record_deployment", "refresh_asset_graph", "wait_until_placed", "wait_until_running"]


def execute(job, cluster, run_config, instance=None):
    return job.execute_in_process(run_config=run_config, resources=cluster.resources(), instance=instance, raise_on_error=False)


def deploy(cluster, path, **ops):
    return execute(deploy_job, cluster, {"ops": {"load_app": {"config": {"path": str(path)}}, **ops}})


def failures(result) -> list[str]:
    """Each failed step with its message, for an assertion's report."""
    return [f"{e.step_key}: {e.message}" for e in result.all_events if e.is_failure]


def failure_message(result, step: str) -> str:
    failure = result.failure_data_for_node(step)
    assert failure is not None, f"{step} did not fail"
    return failure.user_failure_data.description if failure.user_failure_data else failure.error.message


def test_deploy_job_records_places_and_runs_the_sample_app(cluster, manager, plane, kafka):
    path = cluster.add_app()
    # Checked while the workers are up: once they leave, the leader re-marks the deployment waiting.
    with StandInWorker(plane, "worker-1"), StandInWorker(plane, "worker-2"):
        result = deploy(cluster, path)
        assert result.success, failures(result)
        record = get_deployment(plane, "StockAlerts")
        instances = list_instances(plane, "StockAlerts")
        again = deploy(cluster, path)
    assert [e.step_key for e in result.all_events if e.event_type_value == "STEP_SUCCESS"] == DEPLOY_STEPS
    topics = kafka.list_topics()
    for name in ("StockAlerts.TradeStream", "StockAlerts.LargeTradeStream.symbol", "StockAlerts.AveragePriceStream", "StockAlerts.deadletter"):
        assert name in topics
    assert record.status == "placed" and record.generation == 1
    assert len(instances) == 5 and {i.node_id for i in instances} == {"worker-1", "worker-2"}
    assert result.output_for_node("record_deployment") == "StockAlerts"
    # The same file again changes nothing: same generation, every instance kept where it was.
    assert again.success
    recorded = [e for e in again.all_events if e.step_key == "record_deployment" and e.event_type_value == "STEP_OUTPUT"]
    assert recorded[0].event_specific_data.metadata["changed"].value is False
    assert get_deployment(plane, "StockAlerts").generation == 1


def test_an_invalid_app_fails_its_run_with_line_and_column(cluster):
    path = cluster.add_app("broken.siddhi", "define stream A (x int);\nfrom A[x >] select x insert into B;\n")
    result = deploy(cluster, path)
    assert not result.success
    message = failure_message(result, "load_app")
    assert f"{path}:2:11:" in message and "expected an expression" in message
    assert [e.step_key for e in result.all_events if e.event_type_value == "STEP_SUCCESS"] == []


def test_without_workers_the_run_says_what_could_not_be_placed_and_why(cluster, manager, plane):
    path = cluster.add_app()
    result = deploy(cluster, path, wait_until_placed={"config": {"timeout": 3}})
    assert not result.success
    message = failure_message(result, "wait_until_placed")
    assert "5 instances not placed after 3s" in message
    assert "waiting" in message and "not placed" in message
    assert get_deployment(plane, "StockAlerts") is not None  # recorded: it is placed once a worker comes


def test_sensor_runs_deploy_then_undeploy_when_the_file_goes(cluster, manager, plane):
    sensor = build_app_repository_sensor(cluster.apps, [deploy_job, undeploy_job])
    cluster.add_app()
    instance = dg.DagsterInstance.ephemeral()
    data = sensor.evaluate_tick(dg.build_sensor_context(instance=instance))
    [request] = data.run_requests
    with StandInWorker(plane, "worker-1"):
        result = execute(deploy_job, cluster, request.run_config, instance)
        assert result.success, failures(result)
    assert get_deployment(plane, "StockAlerts") is not None

    (cluster.apps / "stock-alerts.siddhi").unlink()
    data = sensor.evaluate_tick(dg.build_sensor_context(cursor=data.cursor, instance=instance))
    [request] = data.run_requests
    assert request.job_name == "undeploy"
    result = execute(undeploy_job, cluster, request.run_config, instance)
    assert result.success and result.output_for_node("resolve_app") == "StockAlerts"
    assert get_deployment(plane, "StockAlerts") is None
    assert list_instances(plane, "StockAlerts") == []


def test_undeploy_of_a_file_that_never_deployed_does_nothing(cluster, plane):
    from sp_dagster.deploy import load_app, plan_app, record

    loaded = load_app(cluster.add_app())
    record(plane, loaded, plan_app(loaded))
    result = execute(undeploy_job, cluster, {"ops": {"resolve_app": {"config": {"path": "gone.siddhi", "content_hashes": ["0" * 64]}}}})
    assert result.success and result.output_for_node("resolve_app") is None
    assert get_deployment(plane, "StockAlerts") is not None


def test_undeploy_by_name_can_delete_the_topics(cluster, manager, plane, kafka):
    with StandInWorker(plane, "worker-1"):
        result = deploy(cluster, cluster.add_app())
        assert result.success, failures(result)
    run_config = {"ops": {"resolve_app": {"config": {"app": "StockAlerts"}}, "undeploy_app": {"config": {"delete_topics": True}}}}
    result = execute(undeploy_job, cluster, run_config)
    assert result.success
    assert result.output_for_node("undeploy_app") == "StockAlerts"
    topics = kafka.list_topics()
    assert "StockAlerts.TradeStream" not in topics and "StockAlerts.deadletter" not in topics


def test_undeploy_of_an_unknown_app_fails_clearly(cluster, plane):
    result = execute(undeploy_job, cluster, {"ops": {"resolve_app": {"config": {"app": "Nope"}}}})
    assert not result.success
    assert "no deployment named 'Nope'" in failure_message(result, "undeploy_app")


def test_rebalance_job_asks_the_leader_and_reports_moves(cluster, manager, plane):
    with StandInWorker(plane, "worker-1"):
        result = deploy(cluster, cluster.add_app())
        assert result.success, failures(result)
        with StandInWorker(plane, "worker-2"):
            wait_until(lambda: current_leader(plane) and current_leader(plane).alive, what="a live leader")
            with plane.transaction() as conn:
                before = rebalance_requests(conn, "sp")
            result = execute(rebalance_job, cluster, {"ops": {"report_rebalance": {"config": {"seconds": 2}}}})
            assert result.success
            with plane.transaction() as conn:
                assert rebalance_requests(conn, "sp") == before + 1
            placed = {i.node_id for i in list_instances(plane, "StockAlerts")}
    moves = [e for e in result.all_events if e.step_key == "report_rebalance" and e.event_type_value == "STEP_OUTPUT"]
    assert "moved" in moves[0].event_specific_data.metadata
    assert placed == {"worker-1", "worker-2"}  # the leader spread the instances over both workers


def logs(instance, result) -> list[str]:
    return [entry.user_message for entry in instance.all_logs(result.run_id)]


def test_rebalance_without_a_leader_is_a_warning_not_a_failure(cluster, plane):
    instance = dg.DagsterInstance.ephemeral()
    result = execute(rebalance_job, cluster, {}, instance)
    assert result.success and result.output_for_node("request_rebalance") is None
    assert any("no live leader manager in group 'sp'" in m for m in logs(instance, result))


def test_a_rescale_that_would_lose_state_fails_the_run_before_any_topic_changes(cluster, plane, kafka):
    # The group keeps per-key state and also reads an unkeyed stream: its state cannot move key by key.
    text = """@App:name('Resized')
define stream S (symbol string, price double);
define stream T (symbol string, price double);
@sink(type = 'kafka', topic = 'Resized.Out', @map(type = 'json'))
define stream O (symbol string, p double);
@dist(execGroup = 'win', parallel = '{n}')
partition with (symbol of S)
begin
    from S#window.length(5) select symbol, avg(price) as p insert into O;
end;
@dist(execGroup = 'win', parallel = '{n}')
from T[price > 0.0] select symbol, price as p insert into O;
"""
    path = cluster.add_app("resized.siddhi", text.format(n=2))
    first = deploy(cluster, path, wait_until_placed={"config": {"timeout": 1}})
    assert "record_deployment" in [e.step_key for e in first.all_events if e.event_type_value == "STEP_SUCCESS"]
    before = {name: kafka.topic_info(name).partitions for name in kafka.list_topics() if name.startswith("Resized.")}
    path.write_text(text.format(n=3))
    result = deploy(cluster, path, wait_until_placed={"config": {"timeout": 1}})
    assert not result.success
    message = failure_message(result, "create_topics")
    assert "Resized-win: 2 -> 3" in message and "--fresh" in message
    assert [e.step_key for e in result.all_events if e.event_type_value == "STEP_SUCCESS"] == ["load_app", "plan_app"]
    assert {name: kafka.topic_info(name).partitions for name in kafka.list_topics() if name.startswith("Resized.")} == before
    assert get_deployment(plane, "Resized").generation == 1


def test_the_deploy_job_gives_parallel_groups_the_clusters_default_room(cluster, manager, plane, kafka):
    """deployment.config.maxParallelism reaches the job's plan: the keyed topic is laid out for it, and the recorded plan says so."""
    conf = cluster.manager_conf.read_text()
    cluster.manager_conf.write_text(conf.replace("  type: distributed\n", "  type: distributed\n  maxParallelism: 4\n", 1))
    text = SAMPLE_APP.read_text().replace("StockAlerts", "RoomyAlerts")
    path = cluster.add_app("roomy.siddhi", text)
    with StandInWorker(plane, "worker-1"):
        result = deploy(cluster, path)
    assert result.success, failures(result)
    assert kafka.topic_info("RoomyAlerts.LargeTradeStream.symbol").partitions == 4
    groups = {g["name"]: g for g in get_deployment(plane, "RoomyAlerts").plan["groups"]}
    assert groups["RoomyAlerts-average"]["max_parallelism"] == 4 and groups["RoomyAlerts-average"]["parallelism"] == 2
