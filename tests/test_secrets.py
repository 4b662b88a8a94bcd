"""Secrets written in SiddhiQL stay out of every display: `plan` (text and JSON), Dagster metadata, status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sp_dagster.siddhi.secrets import mask_secrets

SECRET = "S3cr3t-XYZ"
APP = f"""@App:name('Vault')
@source(type='kafka', topic.list='vault.in', bootstrap.servers='127.0.0.1:9092', group.id='g',
        optional.configuration='sasl.mechanism:PLAIN,sasl.password:{SECRET}', @map(type='json'))
define stream In (k string, v int);
@sink(type='http', publisher.url='http://127.0.0.1:9/hook', basic.auth.username='ops', basic.auth.password='{SECRET}', @map(type='json'))
define stream Out (k string, v int);
@sink(type='http', publisher.url='http://127.0.0.1:9/other', basic.auth.username='ops', basic.auth.password='${{HOOK_PASSWORD}}', @map(type='json'))
define stream Kept (k string, v int);
@dist(execGroup='work', parallel='2') from In[v > 0] select k, v insert into Out;
@dist(execGroup='keep') from In select k, v insert into Kept;
"""


def test_literal_secrets_are_masked_and_placeholders_and_queries_kept():
    shown = mask_secrets(APP)
    assert SECRET not in shown and shown.count("***") == 3  # sasl.* and ssl.* options are secret-bearing as a whole
    assert "basic.auth.password='${HOOK_PASSWORD}'" in shown  # a placeholder names no secret
    assert "sasl.mechanism:***" in shown and "basic.auth.username='ops'" in shown
    assert "from In[v > 0] select k, v insert into Out;" in shown
    assert mask_secrets("@store(type='rdbms', password = \"p'w\")") == "@store(type='rdbms', password = \"***\")"


def test_plan_and_the_dagster_metadata_never_show_a_literal_secret(tmp_path):
    from sp_dagster.orchestration.app_assets import build_partial_app_specs

    app = tmp_path / "vault.siddhi"
    app.write_text(APP)
    root = Path(__file__).resolve().parents[1]
    for form in ("text", "json"):
        run = subprocess.run([sys.executable, "-m", "sp_dagster.cli", "plan", str(app), "--format", form], cwd=root, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert SECRET not in run.stdout + run.stderr and "***" in run.stdout, form
    planned = json.loads(run.stdout)  # the JSON form, the last one run
    [keep] = [g for g in planned["groups"] if g["name"].endswith("-keep")]
    assert "${HOOK_PASSWORD}" in keep["instances"][0]["siddhi"]
    specs = build_partial_app_specs(app)
    shown = json.dumps([{k: str(getattr(v, "value", v)) for k, v in spec.metadata.items()} for spec in specs] + [spec.description for spec in specs])
    assert SECRET not in shown and "***" in shown


def test_an_error_on_a_line_with_a_secret_shows_the_line_masked():
    from sp_dagster.siddhi import SiddhiQLError, parse

    try:
        parse(f"@App:name('E')\n@sink(type='http', basic.auth.password='{SECRET}', @map(type='json')) define stream Out (k string,);\n")
    except SiddhiQLError as exc:
        assert SECRET not in str(exc) and "   2 | @sink(type='http', basic.auth.password='***'" in str(exc), str(exc)
    else:
        raise AssertionError("the app parsed")


def test_placeholders_resolve_from_the_environment_of_the_node_or_say_which_variable(monkeypatch):
    import pytest

    from sp_dagster.errors import ConfigError
    from sp_dagster.siddhi.secrets import resolve_placeholders, resolved_properties

    monkeypatch.setenv("HOOK_PASSWORD", "from-env")
    assert resolve_placeholders("${HOOK_PASSWORD}", "here") == "from-env"
    assert resolve_placeholders("plain", "here") == "plain" and resolve_placeholders(None, "here") is None
    assert resolved_properties((("sasl.password", "${HOOK_PASSWORD}"), ("a", "b")), "X-1") == (("sasl.password", "from-env"), ("a", "b"))
    monkeypatch.delenv("HOOK_PASSWORD")
    with pytest.raises(ConfigError, match=r"^X-1: sasl.password: environment variable HOOK_PASSWORD is not set; export it"):
        resolved_properties((("sasl.password", "${HOOK_PASSWORD}"),), "X-1")


def test_an_http_sink_sends_the_password_its_node_has_in_the_environment(monkeypatch):
    import base64
    import http.server
    import threading

    from sp_dagster.worker.instance.plan import plan_instance
    from sp_dagster.worker.instance.runtime import Message
    from sp_dagster.worker.instance.sinks import HTTP_PREFIX, HttpSinks

    seen: list[str] = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802  (the handler's name)
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(self.headers.get("Authorization", ""))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HOOK_PASSWORD", "from-env")
    text = f"""@App:name('Hooked')
@source(type='kafka', topic.list='Hooked.In', @map(type='json'))
define stream In (k string);
@sink(type='http', publisher.url='http://127.0.0.1:{server.server_port}/hook', basic.auth.username='ops', basic.auth.password='${{HOOK_PASSWORD}}', @map(type='json'))
define stream Out (k string);
from In select k insert into Out;
"""
    plan = plan_instance("Hooked-1", text)
    sinks = HttpSinks(plan.http_outputs, "Hooked-1")
    try:
        sinks.produce(Message(f"{HTTP_PREFIX}Out", 0, -1, None, None, b'{"event": {"k": "a"}}', None))
        assert sinks.flush(30) == []
    finally:
        sinks.close()
        server.shutdown()
    assert seen == ["Basic " + base64.b64encode(b"ops:from-env").decode()]


def test_a_store_password_placeholder_resolves_where_the_app_runs(monkeypatch):
    from sqlalchemy.engine import make_url

    from sp_dagster.engine.store.options import parse_store
    from sp_dagster.siddhi import parse

    app = parse("@App:name('S')\n@store(type='rdbms', jdbc.url='jdbc:mysql://db:3306/sp', username='sp', password='${DB_PASS}')\ndefine table T (k string);\n")
    [table] = app.definitions
    monkeypatch.setenv("DB_PASS", "from-env")
    options = parse_store(table, table.annotation("store"), None)
    assert make_url(options.url).password == "from-env" and "from-env" not in options.shown
