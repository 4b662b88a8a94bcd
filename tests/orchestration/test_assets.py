"""The asset graph: partial apps and topics from the recorded deployments, and how run workers rebuild it."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.definitions_load_context import DefinitionsLoadContext, DefinitionsLoadType
from dagster._core.definitions.repository_definition import RepositoryLoadData

from sp_dagster.cluster.store.deployments import remove_deployment
from sp_dagster.deploy import load_app, plan_app, record
from sp_dagster.embedded.broker import free_port
from sp_dagster.orchestration.assets import CONTROL_PLANE_KEY, DEFS_KEY, SiddhiAssetProps, SpDagsterTranslator, group_name
from sp_dagster.orchestration.definitions import build_definitions
from tests.orchestration.conftest import REPO

K = dg.AssetKey
FILTER, AVERAGE, ALERT = K(["StockAlerts", "filter"]), K(["StockAlerts", "average"]), K(["StockAlerts", "alert"])
TRADES, LARGE, AVERAGES, ALERTS = (K(["topics", f"StockAlerts.{t}"]) for t in ("TradeStream", "LargeTradeStream.symbol", "AveragePriceStream", "PriceAlerts"))


def record_sample(cluster, plane):
    loaded = load_app(cluster.add_app())
    record(plane, loaded, plan_app(loaded))


def build(cluster, **kwargs) -> dg.Definitions:
    return build_definitions(str(cluster.manager_conf), str(cluster.worker_conf), **kwargs)


def graph(defs: dg.Definitions):
    return defs.get_repository_def().asset_graph


def test_partial_apps_and_topics_with_lineage_grouped_per_app(cluster, plane):
    record_sample(cluster, plane)
    defs = build(cluster)
    assets = graph(defs)
    assert set(assets.get_all_asset_keys()) == {FILTER, AVERAGE, ALERT, TRADES, LARGE, AVERAGES, ALERTS, CONTROL_PLANE_KEY}
    lineage = {key: set(assets.get(key).parent_keys) for key in (FILTER, LARGE, AVERAGE, AVERAGES, ALERT, ALERTS, TRADES)}
    assert lineage == {
        FILTER: {TRADES},
        LARGE: {FILTER},
        AVERAGE: {LARGE},
        AVERAGES: {AVERAGE},
        ALERT: {AVERAGES},
        ALERTS: {ALERT},
        TRADES: set(),
    }
    assert {assets.get(k).group_name for k in (FILTER, AVERAGE, ALERT, TRADES, LARGE, AVERAGES, ALERTS)} == {"StockAlerts"}

    spec = defs.resolve_assets_def(FILTER).specs_by_key[FILTER]
    meta = {k: getattr(v, "value", v) for k, v in spec.metadata.items()}
    assert meta["parallelism"] == 2 and meta["instances"] == ["StockAlerts-filter-1", "StockAlerts-filter-2"]
    assert meta["strategies"] == {
        "in": {"TradeStream": "round_robin <- StockAlerts.TradeStream"},
        "out": {"LargeTradeStream -> StockAlerts.LargeTradeStream.symbol": "field_grouping(symbol)"},
    }
    assert meta["placement"] == {"StockAlerts-filter-1": "not placed", "StockAlerts-filter-2": "not placed"}
    assert "@source(type = 'kafka', topic.list = 'StockAlerts.TradeStream'" in meta["siddhi"]
    assert "volume > 100" in meta["siddhi"]
    assert set(spec.kinds) == {"siddhi", "spark"}

    # The app's results land in its sink topic: stale (in Dagster's freshness) after dagster.sinkFreshness without new events.
    policies = {k: defs.resolve_assets_def(k).specs_by_key[k].freshness_policy for k in (TRADES, LARGE, AVERAGES, ALERTS)}
    assert policies == {TRADES: None, LARGE: None, AVERAGES: None, ALERTS: dg.FreshnessPolicy.time_window(fail_window=timedelta(minutes=60))}

    checks = {(key.asset_key, key.name) for key in graph(defs).asset_check_keys}
    assert checks == {(k, n) for k in (FILTER, AVERAGE, ALERT) for n in ("live_worker", "lag_not_growing", "parallelism_advice")}
    repo = defs.get_repository_def()
    assert {j.name for j in repo.get_all_jobs()} >= {"deploy", "undeploy", "rebalance", "rescale", "manager", "worker", "health"}
    assert {s.name for s in repo.schedule_defs} == {"rebalance_schedule", "health_schedule"}
    sensors = {s.name: s.default_status for s in repo.sensor_defs}
    running, stopped = dg.DefaultSensorStatus.RUNNING, dg.DefaultSensorStatus.STOPPED
    assert sensors == {"app_repository": running, "asset_graph_sync": running, "autoscaling": stopped}  # autoscaling is off by default


def test_a_receiver_partial_app_shows_its_urls(cluster, plane):
    app = Path(__file__).parents[1] / "worker" / "apps" / "seed-004.siddhi"
    loaded = load_app(cluster.add_app("seed-004.siddhi", app.read_text()))
    record(plane, loaded, plan_app(loaded))
    defs = build(cluster)
    receiver, work = K(["Seed004", "passthrough-RequestIn"]), K(["Seed004", "partitioning"])
    metadata = {key: defs.resolve_assets_def(key).specs_by_key[key].metadata for key in (receiver, work)}
    assert metadata[receiver]["receiver_urls"].value == ["http://127.0.0.1:8280/requests"]
    assert "receiver_urls" not in metadata[work]


def description(defs: dg.Definitions) -> str:
    return defs.resolve_assets_def(CONTROL_PLANE_KEY).specs_by_key[CONTROL_PLANE_KEY].description


def test_an_empty_or_missing_control_plane_still_loads_and_says_why(cluster, plane):
    missing = build_definitions(str(cluster.root / "elsewhere.yaml"), str(cluster.worker_conf))
    assert set(graph(missing).get_all_asset_keys()) == {CONTROL_PLANE_KEY}
    assert "elsewhere.yaml" in description(missing)

    empty = build(cluster)  # the `plane` fixture created the schema: a cluster without deployments
    assert set(graph(empty).get_all_asset_keys()) == {CONTROL_PLANE_KEY}
    assert "No app is deployed yet" in description(empty)


def test_an_unreachable_control_plane_still_loads(cluster, monkeypatch):
    monkeypatch.setenv("SP_MGT_DB_URL", f"postgresql+psycopg://sp:secret@127.0.0.1:{free_port()}/sp")
    defs = build(cluster)
    text = description(defs)
    assert "could not be read" in text and "unreachable" in text and "secret" not in text
    assert set(graph(defs).get_all_asset_keys()) == {CONTROL_PLANE_KEY}


def test_a_bad_conf_still_loads_with_the_config_error(cluster):
    cluster.manager_conf.write_text(cluster.manager_conf.read_text().replace("minResourceCount", "minResourceCont"))
    defs = build(cluster)
    assert "minResourceCont" in description(defs) and "did you mean 'minResourceCount'" in description(defs)


def test_a_run_worker_rebuilds_the_graph_the_ui_showed_without_reading_the_database(cluster, plane):
    record_sample(cluster, plane)
    shown = build(cluster)
    metadata = shown.metadata
    assert DEFS_KEY in metadata

    remove_deployment(plane, "StockAlerts")
    assert set(graph(build(cluster)).get_all_asset_keys()) == {CONTROL_PLANE_KEY}  # a fresh load sees the change

    cluster.db.unlink()  # and a run worker must not even need the database
    context = DefinitionsLoadContext(DefinitionsLoadType.RECONSTRUCTION, RepositoryLoadData(reconstruction_metadata=metadata))
    with DefinitionsLoadContext.scoped(context):
        rebuilt = build(cluster)
    assert set(graph(rebuilt).get_all_asset_keys()) == set(graph(shown).get_all_asset_keys())
    assert set(graph(rebuilt).asset_check_keys) == set(graph(shown).asset_check_keys)
    assert not cluster.db.exists()


class PrefixedTopics(SpDagsterTranslator):
    def get_asset_spec(self, props: SiddhiAssetProps) -> dg.AssetSpec:
        spec = super().get_asset_spec(props)
        return spec.replace_attributes(key=["kafka", props.topic["name"]]) if props.kind == "topic" else spec


def test_a_translator_subclass_changes_keys_and_lineage_follows(cluster, plane):
    record_sample(cluster, plane)
    assets = graph(build(cluster, translator=PrefixedTopics()))
    assert set(assets.get(FILTER).parent_keys) == {K(["kafka", "StockAlerts.TradeStream"])}
    assert set(assets.get(K(["kafka", "StockAlerts.AveragePriceStream"])).parent_keys) == {AVERAGE}
    assert TRADES not in set(assets.get_all_asset_keys())


@pytest.mark.parametrize("name", ["Stock-Alerts.v2"])
def test_app_names_become_valid_group_names(name):
    assert group_name(name) == "Stock_Alerts_v2"


def test_dagster_definitions_validate_passes_on_the_code_location(cluster, plane, tmp_path):
    record_sample(cluster, plane)
    env = {**os.environ, "SP_DAGSTER_CONF": str(cluster.manager_conf), "SP_DAGSTER_WORKER_CONF": str(cluster.worker_conf), "DAGSTER_HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Validation successful for code location sp-dagster" in result.stdout + result.stderr


def test_counts_in_descriptions_take_the_right_number_and_siddhi_shows_how_the_instances_differ():
    from sp_dagster.orchestration.app_assets import build_partial_app_specs

    specs = {spec.key: spec for spec in build_partial_app_specs(REPO / "apps" / "stock-alerts.siddhi")}
    assert specs[AVERAGES].description.startswith("Topic `StockAlerts.AveragePriceStream` (1 partition).")
    assert specs[TRADES].description.startswith("Topic `StockAlerts.TradeStream` (2 partitions)")
    assert "1 parallel instance." in specs[ALERT].description and "2 parallel instances." in specs[FILTER].description

    single, first = specs[ALERT].metadata["siddhi"].value, specs[FILTER].metadata["siddhi"].value
    assert "@App:name('StockAlerts-alert-1')" in single and "siddhi_of_other_instances" not in specs[ALERT].metadata
    assert "@App:name('StockAlerts-filter-1')" in first and "partition.no.list = '0'" in first and "volume > 100" in first
    diff = specs[FILTER].metadata["siddhi_of_other_instances"].value
    assert "+@App:name('StockAlerts-filter-2')" in diff and "partition.no.list = '1'" in diff and "volume > 100" not in diff
