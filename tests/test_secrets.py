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
