"""The app-repository sensor, evaluated with Dagster's sensor contexts against a real directory."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from sp_dagster.orchestration.jobs import deploy_job, undeploy_job
from sp_dagster.orchestration.sensors import build_app_repository_sensor, diff_repository, scan_repository


@pytest.fixture
def repo(tmp_path):
    path = tmp_path / "apps"
    path.mkdir()
    return path


def tick(sensor, cursor=None, instance=None):
    """Evaluate the sensor once; returns (run requests, skip reason, new cursor)."""
    context = dg.build_sensor_context(cursor=cursor, instance=instance)
    data = sensor.evaluate_tick(context)
    return data.run_requests or [], data.skip_message, data.cursor or cursor


def test_new_changed_unchanged_and_deleted_files(repo):
    sensor = build_app_repository_sensor(repo, [deploy_job, undeploy_job])
    (repo / "a.siddhi").write_text("define stream A (x int);\n")
    (repo / "notes.txt").write_text("not an app")
    requests, _, cursor = tick(sensor)
    assert [(r.job_name, r.tags["sp-dagster/app-file"]) for r in requests] == [("deploy", "a.siddhi")]
    config = requests[0].run_config["ops"]["load_app"]["config"]
    assert config["path"] == str(repo / "a.siddhi")
    assert requests[0].run_key.startswith(f"deploy:a.siddhi:{config['content_hash'][:16]}:")

    requests, skip, cursor = tick(sensor, cursor)
    assert requests == [] and "no change" in skip

    (repo / "a.siddhi").write_text("define stream A (x long);\n")
    (repo / "b.siddhi").write_text("define stream B (y int);\n")
    requests, _, cursor = tick(sensor, cursor)
    assert sorted(r.tags["sp-dagster/app-file"] for r in requests) == ["a.siddhi", "b.siddhi"]

    b_hash = scan_repository(repo)["b.siddhi"]
    (repo / "b.siddhi").unlink()
    requests, _, cursor = tick(sensor, cursor)
    [undeploy] = requests
    assert undeploy.job_name == "undeploy" and undeploy.run_key.startswith("undeploy:b.siddhi:")
    assert undeploy.run_config["ops"]["resolve_app"]["config"]["content_hashes"] == [b_hash]
    assert "b.siddhi" not in json.loads(cursor)["files"]


def test_a_file_changed_back_redeploys_with_a_new_run_key(repo):
    sensor = build_app_repository_sensor(repo, [deploy_job, undeploy_job])
    keys, cursor = [], None
    for text in ("define stream A (x int);\n", "define stream A (x long);\n", "define stream A (x int);\n"):
        (repo / "a.siddhi").write_text(text)
        requests, _, cursor = tick(sensor, cursor)
        keys += [r.run_key for r in requests]
    assert len(keys) == 3 and len(set(keys)) == 3
    assert keys[0].split(":")[2] == keys[2].split(":")[2]  # same content, same hash, another event


def test_run_keys_dedupe_a_replayed_tick(repo):
    """A tick evaluated twice from the same cursor asks for the same run keys, which Dagster runs once."""
    sensor = build_app_repository_sensor(repo, [deploy_job, undeploy_job])
    (repo / "a.siddhi").write_text("define stream A (x int);\n")
    first, _, _ = tick(sensor)
    again, _, _ = tick(sensor)
    assert [r.run_key for r in first] == [r.run_key for r in again]


def test_an_invalid_app_still_gets_its_run(repo):
    """The sensor never parses: a broken app becomes a deploy run that fails with the parser's message."""
    sensor = build_app_repository_sensor(repo, [deploy_job, undeploy_job])
    (repo / "broken.siddhi").write_text("define stream A (x int;\n")
    requests, _, _ = tick(sensor)
    assert [r.job_name for r in requests] == ["deploy"]


def test_missing_repository_is_a_skip_not_an_error(tmp_path):
    sensor = build_app_repository_sensor(tmp_path / "nowhere", [deploy_job, undeploy_job])
    requests, skip, _ = tick(sensor)
    assert requests == [] and "does not exist" in skip


def test_run_requests_are_valid_run_config_for_their_jobs(repo):
    sensor = build_app_repository_sensor(repo, [deploy_job, undeploy_job])
    (repo / "a.siddhi").write_text("define stream A (x int);\n")
    requests, _, cursor = tick(sensor)
    (repo / "a.siddhi").unlink()
    requests += tick(sensor, cursor)[0]
    assert [r.job_name for r in requests] == ["deploy", "undeploy"]  # one of each, or there is nothing to validate
    jobs = {"deploy": deploy_job, "undeploy": undeploy_job}
    for request in requests:
        dg.validate_run_config(jobs[request.job_name], request.run_config)


def test_diff_keeps_a_bounded_hash_history():
    cursor = None
    for n in range(8):
        _, cursor = diff_repository(cursor, {"a.siddhi": f"{n:064x}"})
    state = json.loads(cursor)
    assert state["event"] == 8 and len(state["files"]["a.siddhi"]) == 5
    assert state["files"]["a.siddhi"][-1] == f"{7:064x}"
