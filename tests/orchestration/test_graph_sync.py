"""The asset-graph sync sensor reloads the code location when the recorded deployments change, and only then."""

from __future__ import annotations

import dagster as dg

from sp_dagster.deploy import load_app, plan_app
from sp_dagster.deploy.steps import record
from sp_dagster.embedded.broker import free_port
from sp_dagster.orchestration.assets import fetch_deployments
from sp_dagster.orchestration.graph_sync import build_graph_sync_sensor, graph_fingerprint
from sp_dagster.orchestration.resources import ControlPlaneResource, load_conf
from tests.orchestration.conftest import SAMPLE_APP


def _tick(sensor: dg.SensorDefinition) -> str:
    with dg.build_sensor_context() as context:
        result = sensor.evaluate_tick(context)
    assert not result.run_requests
    return result.skip_message or ""


def test_it_reloads_when_the_recorded_deployments_differ_from_the_graph_and_not_otherwise(cluster, plane):
    port = free_port()  # no webserver there: the reload is tried and its failure said
    cluster.manager_conf.write_text(cluster.manager_conf.read_text().replace("port: 3000", f"port: {port}"))
    resource = ControlPlaneResource(conf=str(cluster.manager_conf))
    settings = load_conf(str(cluster.manager_conf)).dagster
    empty = build_graph_sync_sensor(graph_fingerprint(fetch_deployments(resource)), lambda: fetch_deployments(resource), settings)
    assert _tick(empty) == "the asset graph shows the control plane's 0 deployments"

    loaded = load_app(SAMPLE_APP)
    record(plane, loaded, plan_app(loaded))  # as the manager API or another Dagster would: nobody asks this UI to reload
    said = _tick(empty)
    assert said.startswith("the recorded deployments changed (now: StockAlerts): ") and f"127.0.0.1:{port} did not answer" in said, said

    rebuilt = build_graph_sync_sensor(graph_fingerprint(fetch_deployments(resource)), lambda: fetch_deployments(resource), settings)
    assert _tick(rebuilt) == "the asset graph shows the control plane's 1 deployment"


def test_an_unreadable_control_plane_leaves_the_graph_as_it_is(cluster):
    resource = ControlPlaneResource(conf=str(cluster.manager_conf), url="postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=2")
    settings = load_conf(str(cluster.manager_conf)).dagster
    built = graph_fingerprint({"deployments": [], "error": None})
    said = _tick(build_graph_sync_sensor(built, lambda: fetch_deployments(resource), settings))
    assert said.startswith("the control plane cannot be read (") and said.endswith("): the graph stays as it is"), said
