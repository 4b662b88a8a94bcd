"""A wheel built from the repository, installed in a fresh venv and run from an empty directory: up, status, deploy, produce, consume, down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sp_dagster.embedded.broker import free_port

REPO = Path(__file__).resolve().parents[1]
APP = """@App:name('Echo')
define stream In (id int, msg string);
@sink(type = 'kafka', topic = 'Echo.Out', @map(type = 'json'))
define stream Out (id int, msg string);

@info(name = 'pass') @dist(execGroup = 'pass', parallel = '1')
from In select id, msg insert into Out;
"""


@pytest.mark.slow
@pytest.mark.broker
def test_a_wheel_runs_from_an_empty_directory(tmp_path, sp_home):
    # Only the build backend is fetched (PyPI or pip's local wheel links); the venv reuses the installed dependencies.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(REPO)], check=True, cwd=tmp_path, capture_output=True
    )
    [wheel] = (tmp_path / "dist").glob("sp_dagster-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--force-reinstall", str(wheel)], check=True, capture_output=True
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SP_DAGSTER_CONF", "SP_DAGSTER_WORKER_CONF", "SP_KAFKA_BOOTSTRAP")}
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", SP_DAGSTER_HOME=str(sp_home))  # the commands find the stack through its record

    def cli(*args: str, stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        result = subprocess.run(["sp-dagster", *args], cwd=empty, env=env, input=stdin, capture_output=True, text=True, timeout=timeout)
        assert result.returncode == 0, f"sp-dagster {' '.join(args)}: {result.stdout}{result.stderr}"
        return result

    code = "import sp_dagster, sp_dagster.dagster; print(sp_dagster.__version__, sp_dagster.__file__)"
    imported = subprocess.run(["python", "-c", code], cwd=empty, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert imported == [tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"], str(venv / "lib" / imported[1].split("/lib/", 1)[1])]
    where = cli("config", "where").stdout
    assert f"{venv}/lib/" in where and "sp_dagster/_defaults/conf/manager/deployment.yaml (from the packaged defaults)" in where
    app = tmp_path / "echo.siddhi"
    app.write_text(APP)
    try:
        assert "sp-dagster is up" in cli("up", "--no-ui", "--no-demo", "--workers", "1", "--broker-port", str(port)).stdout
        assert "worker-1" in cli("status").stdout
        assert "Echo: 1/1 instances running" in cli("deploy", str(app), "--timeout", "240").stdout
        events = "\n".join(json.dumps({"data": [i, f"m{i}"], "timestamp": 1000 + i}) for i in range(3))
        assert "sent 3 events" in cli("produce", "Echo:In", stdin=events).stderr
        out = cli("consume", "Echo:Out", "--from-beginning", "--count", "3", "--timeout", "120").stdout
        assert [json.loads(line)["data"] for line in out.splitlines()] == [[i, f"m{i}"] for i in range(3)]
    finally:
        down = cli("down")
    assert "sp-dagster is down" in down.stdout
    assert not list(empty.iterdir())  # nothing written where the commands ran
