"""Manager and worker runs in process: refusals, a node that exits, the Spark resource's settings; the config they use."""

from __future__ import annotations

import dagster as dg
import pytest
import yaml

from sp_dagster.config.loader import load_config, parse_config
from sp_dagster.errors import ConfigError
from sp_dagster.orchestration.jobs import build_node_jobs, worker_conf_for
from sp_dagster.orchestration.resources import spark_config_of
from sp_dagster.orchestration.schedules import cron_every
from tests.orchestration.standin import StandInWorker


def node_jobs(cluster) -> dict[str, dg.JobDefinition]:
    return {job.name: job for job in build_node_jobs(str(cluster.manager_conf), str(cluster.worker_conf))}


def logs(instance, result) -> list[str]:
    return [entry.user_message for entry in instance.all_logs(result.run_id)]


def test_a_worker_run_is_refused_while_that_worker_heartbeats(cluster, plane):
    with StandInWorker(plane, "worker-1"):
        result = node_jobs(cluster)["worker"].execute_in_process(resources=cluster.resources(), raise_on_error=False)
    assert not result.success
    failure = result.failure_data_for_node("run_worker").user_failure_data
    assert failure.description.startswith("worker worker-1 already runs (heartbeat")


def test_a_manager_that_exits_fails_its_run_with_its_last_lines_in_the_log(cluster, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(cluster.manager_conf.read_text().replace("minResourceCount", "minResourceCont"))
    instance = dg.DagsterInstance.ephemeral()
    run_config = {"ops": {"run_manager": {"config": {"conf": str(bad), "node_id": "manager-5"}}}}
    result = node_jobs(cluster)["manager"].execute_in_process(run_config=run_config, resources=cluster.resources(), instance=instance, raise_on_error=False)
    assert not result.success
    assert result.failure_data_for_node("run_manager").user_failure_data.description.startswith("manager manager-5 exited with code 1")
    lines = logs(instance, result)
    assert any("started pid" in line and "--id manager-5" in line for line in lines)
    assert any("did you mean 'minResourceCount'" in line for line in lines)


def test_node_runs_are_exempt_from_max_runtime(cluster):
    for job in node_jobs(cluster).values():
        assert job.tags["dagster/max_runtime"] == "0"


def test_the_spark_resource_settings_reach_the_worker_conf(cluster, tmp_path):
    conf = str(cluster.worker_conf)
    same = spark_config_of(load_config(conf, role="worker"))
    assert worker_conf_for(conf, same, tmp_path) == conf
    changed = worker_conf_for(conf, {**same, "spark.master": "local[2]", "spark.executor.memory": "1g"}, tmp_path)
    assert changed != conf
    config = load_config(changed, role="worker")
    assert config.spark.master == "local[2]" and config.spark.conf["spark.executor.memory"] == "1g"
    assert config.control_plane.url == load_config(conf, role="worker").control_plane.url
    assert yaml.safe_load(open(changed))["wso2.carbon"] == {"id": "worker-1"}


@pytest.mark.parametrize("minutes, cron", [(1, "* * * * *"), (15, "*/15 * * * *"), (60, "0 * * * *"), (120, "0 */2 * * *"), (1440, "0 0 * * *")])
def test_intervals_become_cron_schedules(minutes, cron):
    assert parse_config(f"dagster:\n  rebalanceInterval: {minutes}\n", "c.yaml").dagster.rebalance_interval == minutes
    assert cron_every(minutes) == cron


@pytest.mark.parametrize("minutes", [7, 90, 0, "soon"])
def test_intervals_a_cron_cannot_repeat_are_config_errors(minutes):
    with pytest.raises(ConfigError, match=r"c.yaml:2:\d+: dagster.healthInterval: expected"):
        parse_config(f"dagster:\n  healthInterval: {minutes}\n", "c.yaml")
