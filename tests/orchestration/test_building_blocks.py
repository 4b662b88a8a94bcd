"""The building blocks of sp_dagster.dagster in a user's own Definitions (own resource keys), and the YAML component."""

import dagster as dg
import pytest

from sp_dagster.cluster.store.deployments import get_deployment
from sp_dagster.dagster import (
    ControlPlaneResource,
    MessagingResource,
    SiddhiAssetProps,
    SpDagsterComponent,
    SpDagsterTranslator,
    build_app_repository_sensor,
    build_autoscaling_sensor,
    build_deploy_jobs,
    build_rescale_job,
    deploy_siddhi_app,
    siddhi_app_assets,
)
from tests.orchestration.standin import StandInWorker

K = dg.AssetKey


class Streaming(SpDagsterTranslator):
    def get_asset_spec(self, props: SiddhiAssetProps) -> dg.AssetSpec:
        spec = super().get_asset_spec(props)
        return spec.replace_attributes(key=spec.key.with_prefix("streaming"), owners=["team:streaming"])


def test_a_users_definitions_take_the_assets_and_the_sensor_under_their_own_resource_keys(cluster, manager, plane, kafka):
    app = cluster.add_app()

    @siddhi_app_assets(app=app, translator=Streaming())
    def stock_alerts(context: dg.AssetExecutionContext, sp_db: ControlPlaneResource, sp_bus: MessagingResource):
        yield from deploy_siddhi_app(context, sp_db, sp_bus)

    @dg.asset(deps=[K(["streaming", "topics", "StockAlerts.PriceAlerts"])])
    def alert_report() -> None:
        """The user's own asset downstream of a topic."""

    deploy, undeploy, _ = build_deploy_jobs(control_plane_key="sp_db", messaging_key="sp_bus")
    rescale = build_rescale_job(control_plane_key="sp_db", messaging_key="sp_bus")
    resources = {"sp_db": ControlPlaneResource(conf=str(cluster.manager_conf)), "sp_bus": MessagingResource(conf=str(cluster.manager_conf))}
    sensors = [build_app_repository_sensor(cluster.apps, [deploy, undeploy]), build_autoscaling_sensor(rescale, control_plane_key="sp_db")]
    defs = dg.Definitions(assets=[stock_alerts, alert_report], sensors=sensors, resources=resources)
    repo = defs.get_repository_def()
    graph = repo.asset_graph
    assert set(repo.get_top_level_resources()) == {"sp_db", "sp_bus"}
    assert {j.name for j in repo.get_all_jobs()} >= {"deploy", "undeploy", "rescale"}
    with dg.build_sensor_context(resources=resources) as context:  # autoscaling is off in this conf: it says so, under the user's key
        assert "autoscaling is off" in (repo.get_sensor_def("autoscaling").evaluate_tick(context).skip_message or "")
    filter_key, trades = K(["streaming", "StockAlerts", "filter"]), K(["streaming", "topics", "StockAlerts.TradeStream"])
    assert set(graph.get(filter_key).parent_keys) == {trades}  # lineage follows the translated keys
    assert set(graph.get(K(["alert_report"])).parent_keys) == {K(["streaming", "topics", "StockAlerts.PriceAlerts"])}
    assert graph.get(filter_key).owners == ["team:streaming"]

    with dg.instance_for_test() as instance, StandInWorker(plane, "worker-1"):
        sensor = repo.get_sensor_def("app_repository")
        [request] = sensor(dg.build_sensor_context(instance=instance, repository_def=repo)).run_requests
        assert request.job_name == "deploy"
        run = repo.get_job("deploy").execute_in_process(run_config=request.run_config, instance=instance, raise_on_error=False)
        assert run.success, [e.message for e in run.all_events if e.is_failure]
        assert get_deployment(plane, "StockAlerts").generation == 1

        materialized = dg.materialize([stock_alerts], resources=resources, instance=instance)
        # One asset selected (as clicking one box in the UI does): the whole app is deployed, that one is reported.
        one = dg.materialize([stock_alerts], selection=[filter_key], resources=resources, instance=instance)
    assert materialized.success
    events = {e.asset_key: e.metadata for e in materialized.get_asset_materialization_events() for e in [e.materialization]}
    assert set(events) == {k for k in stock_alerts.keys}
    assert events[filter_key]["changed"].value is False and events[filter_key]["generation"].value == 1
    assert one.success and [e.asset_key for e in one.get_asset_materialization_events()] == [filter_key]


def test_the_component_loads_from_defs_yaml(cluster):
    from dagster.components.testing import create_defs_folder_sandbox

    with create_defs_folder_sandbox() as sandbox:
        defs_path = sandbox.scaffold_component(
            component_cls=SpDagsterComponent,
            defs_yaml_contents={
                "type": "sp_dagster.dagster.SpDagsterComponent",
                "attributes": {"app_repository": "apps", "conf": str(cluster.manager_conf), "worker_conf": str(cluster.worker_conf)},
            },
        )
        (defs_path / "apps").mkdir()
        with sandbox.load_component_and_build_defs(defs_path=defs_path) as (component, defs):
            assert isinstance(component, SpDagsterComponent)
            repo = defs.get_repository_def()
            assert str(defs_path / "apps") in repo.get_sensor_def("app_repository").description
            assert {j.name for j in repo.get_all_jobs()} >= {"deploy", "undeploy", "rebalance", "manager", "worker"}
            assert K(["sp_dagster", "control_plane"]) in repo.asset_graph.get_all_asset_keys()


def test_the_components_translation_block_applies_to_every_asset_and_lineage_follows(cluster, plane):
    from dagster.components.testing import create_defs_folder_sandbox

    from sp_dagster.deploy import load_app, plan_app, record

    loaded = load_app(cluster.add_app())
    record(plane, loaded, plan_app(loaded))
    with create_defs_folder_sandbox() as sandbox:
        defs_path = sandbox.scaffold_component(
            component_cls=SpDagsterComponent,
            defs_yaml_contents={
                "type": "sp_dagster.dagster.SpDagsterComponent",
                "attributes": {
                    "conf": str(cluster.manager_conf),
                    "worker_conf": str(cluster.worker_conf),
                    "translation": {"key_prefix": "streaming", "group_name": "sp_{{ app }}", "owners": ["team:streaming"], "tags": {"kind": "{{ kind }}"}},
                },
            },
        )
        with sandbox.load_component_and_build_defs(defs_path=defs_path) as (_component, defs):
            graph = defs.get_repository_def().asset_graph
            average = graph.get(K(["streaming", "StockAlerts", "average"]))
            assert average.group_name == "sp_StockAlerts" and average.owners == ["team:streaming"] and average.tags["kind"] == "partial_app"
            assert K(["streaming", "topics", "StockAlerts.LargeTradeStream.symbol"]) in average.parent_keys
            assert graph.get(K(["streaming", "topics", "StockAlerts.LargeTradeStream.symbol"])).tags["kind"] == "topic"


def test_a_component_naming_a_conf_that_does_not_exist_fails_to_load(tmp_path):
    from dagster.components.testing import create_defs_folder_sandbox

    with create_defs_folder_sandbox() as sandbox:
        defs_path = sandbox.scaffold_component(
            component_cls=SpDagsterComponent,
            defs_yaml_contents={"type": "sp_dagster.dagster.SpDagsterComponent", "attributes": {"conf": "no-such-conf"}},
        )
        try:
            with sandbox.load_component_and_build_defs(defs_path=defs_path):
                raise AssertionError("a missing conf loaded")
        except Exception as exc:  # Dagster wraps what build_defs raises
            text = "".join(str(e) for e in (exc, exc.__cause__, getattr(exc.__cause__, "__cause__", None)) if e)
            assert f"{defs_path / 'defs.yaml'}: conf 'no-such-conf' ({(defs_path / 'no-such-conf').resolve()}) does not exist" in text, text


def test_the_component_is_registered_for_dg():
    from dagster.components.core.package_entry import discover_entry_point_package_objects
    from dagster_shared.serdes.objects import EnvRegistryKey

    assert EnvRegistryKey(name="SpDagsterComponent", namespace="sp_dagster.dagster") in discover_entry_point_package_objects()


@pytest.mark.slow
def test_dg_lists_the_component_and_check_defs_fails_on_a_wrong_conf_and_passes_on_a_good_one(tmp_path):
    """The real `dg` CLI in a project of the user's: what the docs tell a dg user to run."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    dg_cli = Path(sys.executable).parent / "dg"
    env = {**os.environ, "SP_DAGSTER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(tmp_path / "project" / "src")}
    listed = subprocess.run([str(dg_cli), "list", "components"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert listed.returncode == 0 and "sp_dagster.dagster.SpDagsterComponent" in listed.stdout, listed.stdout + listed.stderr
    project = tmp_path / "project"
    folder = project / "src" / "proj" / "defs" / "streaming"
    folder.mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[project]\nname = "proj"\nversion = "0.1.0"\n[tool.dg]\ndirectory_type = "project"\n[tool.dg.project]\nroot_module = "proj"\n'
    )
    (project / "src" / "proj" / "__init__.py").write_text("")
    (project / "src" / "proj" / "defs" / "__init__.py").write_text("")
    (project / "src" / "proj" / "definitions.py").write_text(
        "from pathlib import Path\nimport dagster as dg\n\n\n@dg.definitions\ndef defs():\n"
        "    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)\n"
    )
    shutil.copytree(Path(__file__).resolve().parents[2] / "conf", folder / "conf")
    checks = {}
    for conf in ("no-such-conf", "conf"):
        (folder / "defs.yaml").write_text(f"type: sp_dagster.dagster.SpDagsterComponent\nattributes:\n  conf: {conf}\n")
        checks[conf] = subprocess.run([str(dg_cli), "check", "defs"], cwd=project, capture_output=True, text=True, timeout=300, env=env)
    wrong, good = checks["no-such-conf"], checks["conf"]
    assert wrong.returncode != 0, wrong.stdout + wrong.stderr
    assert f"{folder / 'defs.yaml'}: conf 'no-such-conf' ({folder / 'no-such-conf'}) does not exist" in wrong.stdout + wrong.stderr
    assert good.returncode == 0 and "All definitions loaded successfully" in good.stdout + good.stderr, good.stdout + good.stderr


def test_the_docs_composition_example_loads_from_another_directory(tmp_path):
    import re
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "dagster.md").read_text()
    code = re.search(r"Your own `Definitions`, under your own resource keys:\n\n```python\n(.*?)```", page, re.S).group(1)
    project = tmp_path / "project"
    (project / "apps").mkdir(parents=True)
    shutil.copy(root / "apps" / "stock-alerts.siddhi", project / "apps")
    shutil.copytree(root / "conf", project / "conf")
    (project / "definitions.py").write_text(code)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    check = "import runpy, sys; d = runpy.run_path(sys.argv[1])['defs'].get_repository_def(); print(sorted(k.to_user_string() for k in d.asset_graph.get_all_asset_keys()))"
    run = subprocess.run([sys.executable, "-c", check, str(project / "definitions.py")], cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "streaming/StockAlerts/filter" in run.stdout and "streaming/topics/StockAlerts.TradeStream" in run.stdout
