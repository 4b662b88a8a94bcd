"""Where a command's deployment.yaml comes from: --conf, $SP_DAGSTER_CONF, the stack `up` started, ./conf/, $SP_DAGSTER_HOME/conf/, the packaged defaults."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sp_dagster.config.locate import defaults_root, find_conf

REPO = Path(__file__).resolve().parents[2]


def conf_dir(root: Path) -> Path:
    for role in ("manager", "worker"):
        (root / role).mkdir(parents=True)
        (root / role / "deployment.yaml").write_text("{}\n")
    return root


def test_the_search_order(tmp_path, sp_home, monkeypatch):
    monkeypatch.delenv("SP_DAGSTER_CONF", raising=False)
    monkeypatch.delenv("SP_DAGSTER_WORKER_CONF", raising=False)
    monkeypatch.chdir(tmp_path)
    packaged = find_conf("manager")
    assert (packaged.source, packaged.path) == ("the packaged defaults", defaults_root() / "conf/manager/deployment.yaml")
    assert packaged.path.is_file()

    home = conf_dir(sp_home / "conf")
    assert find_conf("worker").path == home / "worker/deployment.yaml" and find_conf("worker").source == "$SP_DAGSTER_HOME/conf/"
    local = conf_dir(tmp_path / "conf")
    assert (find_conf("manager").path, find_conf("manager").source) == (local / "manager/deployment.yaml", "./conf/")
    env = conf_dir(tmp_path / "env")
    monkeypatch.setenv("SP_DAGSTER_CONF", str(env))
    assert (find_conf("manager").path, find_conf("manager").source) == (env / "manager/deployment.yaml", "$SP_DAGSTER_CONF")
    monkeypatch.setenv("SP_DAGSTER_WORKER_CONF", str(local / "worker/deployment.yaml"))
    assert find_conf("worker").source == "$SP_DAGSTER_WORKER_CONF"
    given = find_conf("worker", "given.yaml")
    assert (given.path, given.source) == (tmp_path / "given.yaml", "--conf")
    assert given.describe().endswith("(from --conf): no such file")


def test_config_where_says_which_file_each_role_reads(tmp_path, sp_home):
    result = subprocess.run(
        [sys.executable, "-m", "sp_dagster.cli", "config", "where", "--conf", str(conf_dir(tmp_path / "c"))],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.stdout.splitlines() == [
        f"manager  {tmp_path}/c/manager/deployment.yaml (from --conf)",
        f"worker   {tmp_path}/c/worker/deployment.yaml (from --conf)",
        "         kafka at localhost:9092",
    ]
