"""The manager API end to end: real manager processes over TLS, a real database and broker, the CLI as an operator runs it without database credentials."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sp_dagster.cluster.api_users import basic_authorization
from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.election import current_leader
from sp_dagster.cluster.processes import ManagerProcess, manager_config
from sp_dagster.embedded.broker import free_port
from tests.fixtures.certificates import certificate
from tests.fixtures.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
FAST = dict(heartbeat_interval_ms=200, heartbeat_max_retry=3, event_polling_interval_ms=200)
PASSWORDS = {"ALICE_PW": "Planted-Alice-9f3k", "VERA_PW": "Planted-Vera-2m7q", "ADAM_PW": "Planted-Adam-5x1z"}
APP_SECRET = "Planted-App-S3cret"
APP = f"""\
@App:name('ApiApp')
define stream In (symbol string, price double);
@sink(type='http', publisher.url='http://127.0.0.1:9/x', basic.auth.username='u', basic.auth.password='{APP_SECRET}', @map(type='json'))
define stream Out (symbol string, price double);
@info(name='q') @dist(execGroup='g', parallel='1')
from In[price > 10.0] select symbol, price insert into Out;
"""


def manager_conf(tmp_path: Path, name: str, url: str, bootstrap: str, port: int, cert: Path, key: Path) -> Path:
    """A manager deployment.yaml serving the API on 127.0.0.1:port over TLS, with a viewer, a deployer and an admin."""
    api = f"""\
  bootstrapURLs: {bootstrap}
  httpsInterface:
    host: 127.0.0.1
    port: {port}
  api:
    enabled: true
    certFile: {cert}
    keyFile: {key}
    users:
      - {{username: alice, password: "${{ALICE_PW}}", role: deployer}}
      - {{username: vera, password: "${{VERA_PW}}", role: viewer}}
      - {{username: adam, password: "${{ADAM_PW}}", role: admin}}
"""
    text = manager_config(url, **FAST).replace("deployment.config:\n", "deployment.config:\n" + api)
    conf = tmp_path / f"{name}.yaml"
    conf.write_text(text)
    return conf


@pytest.fixture
def cluster(tmp_path, broker):
    """Two managers (m1 leads) with the API on, and an operator conf naming m2's API and a database that does not answer."""
    url = f"sqlite:///{tmp_path / 'cp.db'}"
    ControlPlane(url).migrate()
    cert, key = certificate(tmp_path, "api")
    ports = {"m1": free_port(), "m2": free_port()}
    procs = {}
    for name in ("m1", "m2"):
        conf = manager_conf(tmp_path, name, url, broker.bootstrap_servers, ports[name], cert, key)
        procs[name] = ManagerProcess(conf, name, log_path=tmp_path / f"{name}.log", journal=tmp_path / f"{name}.jsonl", cwd=ROOT, env=PASSWORDS)
        procs[name].start()
        if name == "m1":
            plane = ControlPlane(url)
            wait_until(lambda: (lead := current_leader(plane)) is not None and lead.alive and lead.holder == "m1", what="m1 to lead")
            plane.close()
    wait_until(lambda: procs["m2"].ready, what="m2 to start")
    operator = tmp_path / "operator.yaml"
    # Any database access from the CLI would fail: this one does not answer.
    operator.write_text(
        f"deployment.config:\n  type: distributed\n  api:\n    url: https://127.0.0.1:{ports['m2']}\n    caFile: {cert}\n"
        f"datasources:\n  SP_MGT_DB: postgresql+psycopg://nobody@127.0.0.1:{free_port()}/none\n"
    )
    try:
        yield {"ports": ports, "operator": operator, "cert": cert, "tmp": tmp_path, "procs": procs}
    finally:
        for proc in procs.values():
            proc.stop()


def cli(conf: Path, user: str, password: str, *args: str) -> subprocess.CompletedProcess:
    """`sp-dagster ARGS --conf CONF --user USER` with the password in SP_DAGSTER_PASSWORD and no database settings in the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SP_") and k not in PASSWORDS}
    env.update(SP_DAGSTER_PASSWORD=password, PYTHONPATH=str(ROOT), SP_DAGSTER_HOME=str(conf.parent / "home"))
    return subprocess.run(
        [sys.executable, "-m", "sp_dagster.cli", *args, "--conf", str(conf), "--user", user], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT
    )


def get(url: str, user: str, password: str, cafile: Path) -> tuple[int, dict, dict]:
    """(status, JSON body, headers) of a GET, redirects not followed."""
    import ssl

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args):
            return None

    opener = urllib.request.build_opener(NoRedirect(), urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=str(cafile))))
    request = urllib.request.Request(url, headers={"Authorization": basic_authorization(user, password)})
    try:
        with opener.open(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read()), dict(answer.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


@pytest.mark.slow
def test_operator_deploys_lists_and_undeploys_through_the_api_without_database_credentials(cluster):
    tmp, operator, ports = cluster["tmp"], cluster["operator"], cluster["ports"]
    app = tmp / "app.siddhi"
    app.write_text(APP)
    alice, vera, adam = PASSWORDS["ALICE_PW"], PASSWORDS["VERA_PW"], PASSWORDS["ADAM_PW"]
    outputs = []

    def run(user, password, *args):
        result = cli(operator, user, password, *args)
        outputs.extend([result.stdout, result.stderr])
        return result

    # m2 does not lead: it answers 307 with the leader's address, which the CLI follows.
    status, body, headers = get(f"https://127.0.0.1:{ports['m2']}/api/apps", "vera", vera, cluster["cert"])
    assert status == 307 and headers["Location"] == f"https://127.0.0.1:{ports['m1']}/api/apps" and body == {"leader": f"127.0.0.1:{ports['m1']}"}

    deployed = run("alice", alice, "deploy", str(app), "--no-wait")
    assert deployed.returncode == 0, deployed.stderr
    assert deployed.stdout.startswith("deployed ApiApp; topics: ApiApp.In")

    refused = run("vera", vera, "deploy", str(app), "--no-wait")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        f"error: manager API https://127.0.0.1:{ports['m2']}: user 'vera' has role 'viewer'; deploy needs role 'deployer' or above (HTTP 403)"
    ]
    wrong = run("alice", "not-her-password", "status")
    assert wrong.returncode == 1
    assert wrong.stderr.strip().splitlines() == [
        f"error: manager API https://127.0.0.1:{ports['m2']}: wrong user name or password for the manager API (HTTP 401)"
    ]

    untrusting = tmp / "untrusting.yaml"
    untrusting.write_text(operator.read_text().replace(f"    caFile: {cluster['cert']}\n", ""))
    distrust = cli(untrusting, "vera", vera, "apps")
    assert distrust.returncode == 1 and len(distrust.stderr.strip().splitlines()) == 1
    assert "has a certificate this machine does not trust" in distrust.stderr and "deployment.config.api.caFile" in distrust.stderr

    listed = run("vera", vera, "apps")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].startswith("ApiApp: ")
    as_json = json.loads(run("vera", vera, "apps", "--json").stdout)
    assert as_json[0]["app"] == "ApiApp" and "basic.auth.password = '***'" in as_json[0]["plan"]["groups"][0]["instances"][0]["siddhi"]

    status, body, _ = get(f"https://127.0.0.1:{ports['m1']}/api/apps/ApiApp", "vera", vera, cluster["cert"])
    outputs.append(json.dumps(body))
    assert status == 200 and "basic.auth.password='***'" in body["siddhi"]

    shown = run("vera", vera, "status")
    assert shown.returncode == 0, shown.stderr
    assert "app ApiApp: " in shown.stdout and "recent changes (through the manager API)" in shown.stdout
    assert any(line.split()[3:5] == ["alice", "deploy"] for line in shown.stdout.splitlines())

    assert run("alice", alice, "undeploy", "ApiApp", "--drop-state").stderr.strip().endswith("undeploy --drop-state needs role 'admin' or above (HTTP 403)")
    removed = run("alice", alice, "undeploy", "ApiApp")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.splitlines()[0] == "undeployed ApiApp; topics kept"
    assert run("adam", adam, "apps").stdout == "no deployments\n"
    changes = json.loads(run("vera", vera, "status", "--json").stdout)["changes"]
    assert [(c["user"], c["action"], c["app"]) for c in changes] == [("alice", "deploy", "ApiApp"), ("alice", "undeploy", "ApiApp")]

    for proc in cluster["procs"].values():
        proc.stop()
    logs = [(tmp / f"{name}.{kind}").read_text() for name in ("m1", "m2") for kind in ("log", "jsonl")]
    assert "api: alice deployed ApiApp" in logs[0]
    for secret in [*PASSWORDS.values(), APP_SECRET]:
        for text in outputs + logs:
            assert secret not in text


def test_a_manager_refuses_plain_http_off_loopback_in_one_line(tmp_path):
    conf = tmp_path / "manager.yaml"
    api = "  httpsInterface:\n    host: 192.0.2.7\n  api:\n    enabled: true\n    users: [{username: a, password: b, role: viewer}]\n"
    conf.write_text(manager_config(f"sqlite:///{tmp_path / 'cp.db'}").replace("deployment.config:\n", "deployment.config:\n" + api))
    result = subprocess.run([sys.executable, "-m", "sp_dagster.cli", "manager", "--conf", str(conf)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: {conf}: deployment.config.api: plain HTTP on 192.0.2.7 (not a loopback address) would send passwords in clear; "
        "set certFile and keyFile, or allowPlainHttp: true to accept that"
    ]
    assert not (tmp_path / "cp.db").exists()


@pytest.mark.slow
def test_dagster_deploys_rescales_rebalances_and_undeploys_through_the_api_without_database_credentials(cluster, monkeypatch):
    """Dagster's jobs, sensor snapshot and waits with the control_plane resource on the API: the operator conf's
    database does not answer, so any database access would fail the run."""
    import dagster as dg

    from sp_dagster.deploy.steps import DeployError, wait_until_placed
    from sp_dagster.orchestration.assets import control_plane_spec, fetch_deployments
    from sp_dagster.orchestration.autoscaling import build_autoscaling_sensor
    from sp_dagster.orchestration.jobs import deploy_job, rebalance_job, rescale_job, undeploy_job
    from sp_dagster.orchestration.resources import ControlPlaneResource, MessagingResource

    for name in PASSWORDS:
        monkeypatch.delenv(name, raising=False)
    tmp, operator, ports = cluster["tmp"], str(cluster["operator"]), cluster["ports"]
    app = tmp / "app.siddhi"
    app.write_text(APP)
    said: list[str] = []

    def run(job, user: str, password: str, ops: list[str], run_config: dict) -> dg.ExecuteInProcessResult:
        resources = {"control_plane": ControlPlaneResource(conf=operator, user=user, password=password), "messaging": MessagingResource(conf=operator)}
        instance = dg.DagsterInstance.ephemeral()
        result = job.execute_in_process(run_config=run_config, resources=resources, op_selection=ops, raise_on_error=False, instance=instance)
        said.extend(entry.user_message for entry in instance.all_logs(result.run_id))  # the run's log as the UI shows it
        return result

    deploy_ops = ["load_app", "plan_app", "create_topics", "record_deployment"]
    refused = run(deploy_job, "vera", PASSWORDS["VERA_PW"], deploy_ops, {"ops": {"load_app": {"config": {"path": str(app)}}}})
    assert not refused.success
    failure = next(e for e in refused.all_events if e.is_step_failure)
    assert "user 'vera' has role 'viewer'; deploy needs role 'deployer' or above (HTTP 403)" in str(failure.step_failure_data.error)

    deployed = run(deploy_job, "alice", PASSWORDS["ALICE_PW"], deploy_ops, {"ops": {"load_app": {"config": {"path": str(app)}}}})
    assert deployed.success
    assert deployed.output_for_node("record_deployment") == "ApiApp"
    assert any(m.startswith("deployed ApiApp; topics: ApiApp.In") for m in said)

    viewer = ControlPlaneResource(conf=operator, user="vera", password=PASSWORDS["VERA_PW"])
    snapshot = fetch_deployments(viewer)
    assert snapshot["error"] is None and snapshot["control_plane"] == f"https://127.0.0.1:{ports['m2']}"
    (shown,) = snapshot["deployments"]
    assert shown["app"] == "ApiApp" and shown["placement"] == {"ApiApp-g-1": None}
    recent = control_plane_spec(snapshot).metadata["recent_changes"].value  # the control_plane asset shows who changed what
    assert recent.splitlines()[2].endswith("| alice | deploy | ApiApp |"), recent
    assert "basic.auth.password = '***'" in shown["plan"]["groups"][0]["instances"][0]["siddhi"]
    # No worker runs: the wait says why, as the leader recorded it.
    with pytest.raises(DeployError, match="waiting for workers: 0 alive"):
        wait_until_placed(viewer, "ApiApp", timeout=1, poll=0.2)

    rescaled = run(
        rescale_job,
        "alice",
        PASSWORDS["ALICE_PW"],
        ["scale_app", *deploy_ops[1:]],
        {"ops": {"scale_app": {"config": {"app": "ApiApp", "group": "g", "parallel": 2}}}},
    )
    assert rescaled.success, [str(e.step_failure_data.error) for e in rescaled.all_events if e.is_step_failure]
    assert [i.instance for i in viewer.deployment_state("ApiApp").instances] == ["ApiApp-g-1", "ApiApp-g-2"]

    rebalanced = run(
        rebalance_job, "alice", PASSWORDS["ALICE_PW"], ["request_rebalance", "report_rebalance"], {"ops": {"report_rebalance": {"config": {"seconds": 0.5}}}}
    )
    assert rebalanced.success and rebalanced.output_for_node("request_rebalance") == {"ApiApp-g-1": None, "ApiApp-g-2": None}

    # The autoscaling sensor: the leader decides (no worker reports load, so nothing to apply); a viewer may not.
    scaling = tmp / "autoscaling.yaml"
    scaling.write_text(cluster["operator"].read_text().replace("  api:\n", "  autoscaling:\n    enabled: true\n  api:\n"))
    sensor = build_autoscaling_sensor(rescale_job)
    for user, expected in (
        ("alice", "every group runs at its advised parallelism"),
        ("vera", "user 'vera' has role 'viewer'; autoscaling needs role 'deployer'"),
    ):
        resources = {"control_plane": ControlPlaneResource(conf=str(scaling), user=user, password=PASSWORDS[f"{user.upper()}_PW"])}
        with dg.build_sensor_context(resources=resources) as context:
            skipped = sensor(context)
        assert isinstance(skipped, dg.SkipReason) and expected in str(skipped.skip_message), skipped
    assert viewer.advice()["apps"][0]["app"] == "ApiApp"

    removed = run(undeploy_job, "alice", PASSWORDS["ALICE_PW"], ["resolve_app", "undeploy_app"], {"ops": {"resolve_app": {"config": {"app": "ApiApp"}}}})
    assert removed.success and any(m.startswith("undeployed ApiApp") for m in said)
    assert fetch_deployments(viewer)["deployments"] == []
    changes = viewer.status()["changes"]
    assert [(c["user"], c["action"], c["app"]) for c in changes] == [
        ("alice", "deploy", "ApiApp"),
        ("alice", "scale", "ApiApp"),
        ("alice", "rebalance", None),
        ("alice", "undeploy", "ApiApp"),
    ]

    for proc in cluster["procs"].values():
        proc.stop()
    logs = [(tmp / f"{name}.{kind}").read_text() for name in ("m1", "m2") for kind in ("log", "jsonl")]
    for secret in [*PASSWORDS.values(), APP_SECRET]:
        for text in said + logs:
            assert secret not in text
