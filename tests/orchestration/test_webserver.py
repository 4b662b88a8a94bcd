"""A live `dagster dev` on the sp-dagster code location, driven through its GraphQL API.

The sensor deploys the app it finds (through the daemon and a real run worker), the deploy run
reloads the code location so the partial apps appear with their lineage, the health job's run
worker rebuilds the same graph from the reconstruction metadata, and a manager run started
from the UI's API streams its log and stops when the run is terminated. The workers are
stand-ins speaking the workers' control-plane protocol (Spark is beside the point here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from sp_dagster.deploy import steps
from tests.fixtures.waiting import wait_until
from tests.orchestration.conftest import command_lines
from tests.orchestration.standin import StandInWorker

pytestmark = pytest.mark.slow


def graphql(url: str, query: str, variables: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"{url}/graphql", data=json.dumps({"query": query, "variables": variables or {}}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        body = json.loads(response.read())
    assert "errors" not in body, body
    return body["data"]


ASSETS = "{ assetNodes { assetKey { path } dependencyKeys { path } groupName } }"
RUNS = "query($job: String!) { runsOrError(filter: {pipelineName: $job}) { ... on Runs { results { runId status tags { key value } } } } }"
LAUNCH = """mutation($job: String!, $config: RunConfigData) {
  launchRun(executionParams: {selector: {repositoryLocationName: "sp-dagster", repositoryName: "__repository__", jobName: $job}, runConfigData: $config}) {
    __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } ... on RunConfigValidationInvalid { errors { message } }
  }
}"""
TERMINATE = "mutation($id: String!) { terminateRun(runId: $id) { __typename } }"
LOGS = "query($id: ID!) { logsForRun(runId: $id) { ... on EventConnection { events { __typename ... on MessageEvent { message } } } } }"
CHECKS = """query { assetNodes(assetKeys: [{path: ["StockAlerts", "filter"]}]) { assetChecksOrError { ... on AssetChecks { checks { name } } } } }"""


def lineage(url: str) -> dict[str, set[str]]:
    return {"/".join(n["assetKey"]["path"]): {"/".join(d["path"]) for d in n["dependencyKeys"]} for n in graphql(url, ASSETS)["assetNodes"]}


def runs(url: str, job: str) -> list[dict]:
    return graphql(url, RUNS, {"job": job})["runsOrError"]["results"]


def launch(url: str, job: str, config: dict | None = None) -> str:
    result = graphql(url, LAUNCH, {"job": job, "config": config or {}})["launchRun"]
    assert result["__typename"] == "LaunchRunSuccess", result
    return result["run"]["runId"]


def status(url: str, job: str, run_id: str) -> str:
    return next(r["status"] for r in runs(url, job) if r["runId"] == run_id)


def messages(url: str, run_id: str) -> list[str]:
    return [e.get("message") or "" for e in graphql(url, LOGS, {"id": run_id})["logsForRun"]["events"]]


def test_sensor_deploys_assets_appear_health_runs_and_a_manager_run_stops_on_terminate(live, manager, plane):
    cluster, url = live
    cluster.add_app()  # dropped into the app repository while Dagster runs
    with StandInWorker(plane, "worker-1"), StandInWorker(plane, "worker-2"):
        # The daemon ticks the sensor, which launches a deploy run for apps/stock-alerts.siddhi.
        deploy = wait_until(
            lambda: [r for r in runs(url, "deploy") if r["status"] in ("SUCCESS", "FAILURE")], timeout=240, interval=1, what="the sensor's deploy run"
        )
        assert deploy[0]["status"] == "SUCCESS", messages(url, deploy[0]["runId"])[-20:]
        assert {"key": "sp-dagster/app-file", "value": "stock-alerts.siddhi"} in deploy[0]["tags"]

        # Its last op reloaded the code location: the partial apps are assets, with lineage.
        reloads = [m for m in messages(url, deploy[0]["runId"]) if "code location" in m]
        graph = wait_until(
            lambda: (g := lineage(url)) and "StockAlerts/filter" in g and g, timeout=60, interval=1, what=f"the partial apps in the asset graph ({reloads})"
        )
        assert graph["StockAlerts/filter"] == {"topics/StockAlerts.TradeStream"}
        assert graph["topics/StockAlerts.LargeTradeStream.symbol"] == {"StockAlerts/filter"}
        assert graph["StockAlerts/average"] == {"topics/StockAlerts.LargeTradeStream.symbol"}
        assert graph["StockAlerts/alert"] == {"topics/StockAlerts.AveragePriceStream"}

        # A run worker rebuilds the graph from the reconstruction metadata and runs the checks.
        health = launch(url, "health")
        wait_until(lambda: status(url, "health", health) in ("SUCCESS", "FAILURE"), timeout=180, interval=1, what="the health run")
        assert status(url, "health", health) == "SUCCESS", messages(url, health)[-20:]
        checks = graphql(url, CHECKS)["assetNodes"][0]["assetChecksOrError"]["checks"]
        assert {c["name"] for c in checks} == {"live_worker", "lag_not_growing", "parallelism_advice"}
        kinds = [e["__typename"] for e in graphql(url, LOGS, {"id": health})["logsForRun"]["events"]]
        topics = [key for key in graph if key.startswith("topics/")]
        assert topics, graph
        # One observation per partial app (3) and one per topic of the app, each check once per partial app.
        assert kinds.count("AssetCheckEvaluationEvent") == 3 * len(checks) and kinds.count("ObservationEvent") == 3 + len(topics), (kinds, topics)

    # A manager launched as a run: its log lines reach the run, and terminating the run stops it.
    run_id = launch(url, "manager", {"ops": {"run_manager": {"config": {"node_id": "manager-9", "stop_timeout": 20}}}})
    wait_until(lambda: any("manager manager-9 (group 'sp')" in m for m in messages(url, run_id)), timeout=120, interval=1, what="the manager's log in the run")
    assert any("--id manager-9" in line for line in command_lines())
    graphql(url, TERMINATE, {"id": run_id})
    wait_until(lambda: status(url, "manager", run_id) == "CANCELED", timeout=90, interval=1, what="the manager run to be canceled")
    wait_until(lambda: not any("--id manager-9" in line for line in command_lines()), timeout=30, what="the manager process to exit")
    assert any("stopping pid" in m for m in messages(url, run_id))

    # The CLI's undeploy and deploy reload the code location too: the graph follows with no *Reload*.
    env = {**os.environ, "SP_DAGSTER_CONF": str(cluster.manager_conf)}
    cli = [sys.executable, "-m", "sp_dagster.cli"]
    undeploy = subprocess.run([*cli, "undeploy", "StockAlerts"], env=env, capture_output=True, text=True, timeout=120)
    assert undeploy.returncode == 0 and "Dagster: reloaded code location 'sp-dagster'" in undeploy.stdout, undeploy.stdout + undeploy.stderr
    assert "StockAlerts/filter" not in lineage(url)
    deploy = subprocess.run([*cli, "deploy", str(cluster.apps / "stock-alerts.siddhi"), "--no-wait"], env=env, capture_output=True, text=True, timeout=120)
    assert deploy.returncode == 0 and "Dagster: reloaded code location 'sp-dagster'" in deploy.stdout, deploy.stdout + deploy.stderr
    assert lineage(url)["StockAlerts/average"] == {"topics/StockAlerts.LargeTradeStream.symbol"}

    # A change nobody tells this UI about (the manager API, another Dagster): the asset_graph_sync sensor reloads.
    steps.undeploy(plane, "StockAlerts")
    wait_until(lambda: "StockAlerts/filter" not in lineage(url), timeout=60, interval=1, what="the undeployed app gone from the graph, with no reload asked")
    loaded = steps.load_app(cluster.apps / "stock-alerts.siddhi")
    steps.record(plane, loaded, steps.plan_app(loaded))
    wait_until(lambda: "StockAlerts/filter" in lineage(url), timeout=60, interval=1, what="the recorded app back in the graph, with no reload asked")
