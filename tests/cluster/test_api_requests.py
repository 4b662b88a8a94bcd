"""The manager API's users, roles, settings checks and request handling, without sockets (a SQLite control plane)."""

from __future__ import annotations

import dataclasses

import pytest

from sp_dagster.cluster.api_users import ApiRefused, Caller, Users, basic_authorization
from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.store.events import record_change
from sp_dagster.config.loader import load_config
from sp_dagster.config.model import ApiUser
from sp_dagster.deploy.api import Api, check_settings
from sp_dagster.errors import ConfigError

SECRET = "Planted-Unit-7q2w"
USERS = [ApiUser("vera", "view-pw", "viewer"), ApiUser("alice", SECRET, "deployer"), ApiUser("adam", "admin-pw", "admin")]


def test_passwords_are_kept_only_hashed_and_checked():
    users = Users(USERS)
    assert SECRET not in repr(vars(users)) and SECRET.encode() not in b"".join(d for _, d, _ in users._users.values())
    assert users.check("alice", SECRET) == Caller("alice", "deployer")
    assert users.check("alice", "wrong") is None and users.check("nobody", SECRET) is None
    assert users.authenticate(basic_authorization("vera", "view-pw")) == Caller("vera", "viewer")
    for header in (None, "Bearer x", "Basic !!!", basic_authorization("alice", "wrong"), "Basic " + "YWxpY2U="):  # the last: no colon
        with pytest.raises(ApiRefused) as refused:
            users.authenticate(header)
        assert refused.value.status == 401 and SECRET not in str(refused.value)


def test_roles_rank_viewer_deployer_admin():
    Caller("adam", "admin").require("deployer", "deploy")
    Caller("alice", "deployer").require("viewer", "status")
    with pytest.raises(ApiRefused) as refused:
        Caller("alice", "deployer").require("admin", "undeploy --drop-state")
    assert refused.value.status == 403
    assert str(refused.value) == "user 'alice' has role 'deployer'; undeploy --drop-state needs role 'admin' or above"


def conf(tmp_path, api: str, host: str = "127.0.0.1"):
    path = tmp_path / "manager.yaml"
    path.write_text(f"deployment.config:\n  type: distributed\n  httpsInterface: {{host: {host}, port: 9443}}\n  api:\n{api}")
    return load_config(path, role="manager")


USER_LINE = "    users: [{username: alice, password: pw, role: deployer}]\n"


def test_settings_refuse_plain_http_off_loopback_and_no_users(tmp_path):
    check_settings(conf(tmp_path, "    enabled: true\n" + USER_LINE))  # loopback: plain HTTP is fine
    with pytest.raises(ConfigError, match=r"plain HTTP on 192\.0\.2\.7 \(not a loopback address\) would send passwords in clear; set certFile and keyFile"):
        check_settings(conf(tmp_path, "    enabled: true\n" + USER_LINE, host="192.0.2.7"))
    check_settings(conf(tmp_path, "    enabled: true\n    allowPlainHttp: true\n" + USER_LINE, host="192.0.2.7"))
    check_settings(conf(tmp_path, "    enabled: true\n    certFile: c.pem\n    keyFile: k.pem\n" + USER_LINE, host="192.0.2.7"))
    with pytest.raises(ConfigError, match="certFile and keyFile go together"):
        check_settings(conf(tmp_path, "    enabled: true\n    certFile: c.pem\n" + USER_LINE))
    with pytest.raises(ConfigError, match="no users are configured"):
        check_settings(conf(tmp_path, "    enabled: true\n"))


@pytest.fixture
def api(tmp_path):
    config = conf(tmp_path, "    enabled: true\n" + USER_LINE)
    config = dataclasses.replace(config, deployment=dataclasses.replace(config.deployment, api=dataclasses.replace(config.deployment.api, users=tuple(USERS))))
    plane = ControlPlane(f"sqlite:///{tmp_path / 'cp.db'}")
    plane.migrate()
    state = {"leading": True, "leader": "10.0.0.9:9443"}
    yield Api(config, plane, leading=lambda: state["leading"], leader_address=lambda: state["leader"]), state, plane
    plane.close()


def ask(api, method, target, user=None, password=None, body=b""):
    headers = {"Authorization": basic_authorization(user, password)} if user else {}
    return api.handle(method, target, headers, body)


def test_requests_are_authenticated_then_routed_by_role(api):
    api, state, plane = api
    assert ask(api, "GET", "/api/apps").status == 401
    assert ask(api, "GET", "/api/apps", "vera", "nope").headers["WWW-Authenticate"].startswith("Basic")
    listed = ask(api, "GET", "/api/apps", "vera", "view-pw")
    assert (listed.status, listed.body) == (200, {"apps": []})
    refused = ask(api, "POST", "/api/apps", "vera", "view-pw", b"define stream S (x int);")
    assert refused.status == 403 and refused.body == {"error": "user 'vera' has role 'viewer'; deploy needs role 'deployer' or above"}
    assert ask(api, "DELETE", "/api/apps/X?dropState=1", "alice", SECRET).status == 403
    missing = ask(api, "DELETE", "/api/apps/X", "alice", SECRET)
    assert missing.status == 404 and "no deployment named 'X'" in missing.body["error"]
    assert ask(api, "GET", "/api/apps/X", "vera", "view-pw").status == 404
    bad = ask(api, "POST", "/api/apps", "alice", SECRET, f"@App:name('A') define stream S (x int, password='{SECRET}'".encode())
    assert bad.status == 400 and SECRET not in bad.body["error"]
    assert ask(api, "GET", "/api/nothing", "vera", "view-pw").status == 404
    record_change(plane, "alice", "deploy", "A")
    status = ask(api, "GET", "/api/status", "vera", "view-pw")
    assert status.status == 200 and [(c["user"], c["action"], c["app"]) for c in status.body["changes"]] == [("alice", "deploy", "A")]


def test_a_manager_that_does_not_lead_points_at_the_leader(api):
    api, state, _ = api
    state["leading"] = False
    moved = ask(api, "GET", "/api/apps?x=1", "vera", "view-pw")
    assert (moved.status, moved.headers["Location"], moved.body) == (307, "http://10.0.0.9:9443/api/apps?x=1", {"leader": "10.0.0.9:9443"})
    assert ask(api, "GET", "/api/apps", "vera", "wrong").status == 401  # credentials are checked first, wherever they arrive
    state["leader"] = None
    assert ask(api, "GET", "/api/apps", "vera", "view-pw").status == 503
