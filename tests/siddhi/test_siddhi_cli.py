"""`sp-dagster validate FILE...`: OK per valid file; every error with file:line:col; exit 1."""

from __future__ import annotations

import subprocess
import sys

from sp_dagster.cli import main

VALID = "@app:name('Orders')\ndefine stream Orders (id string, amount double);\nfrom Orders[amount > 10.0] select id insert into Big;\n"
INVALID = "define stream Orders (id string, amount double);\nfrom Orders select total insert into Big;\nfrom Nope select id insert into Other;\n"


def test_a_valid_file_prints_ok_and_exits_0(tmp_path, capsys):
    path = tmp_path / "orders.siddhi"
    path.write_text(VALID)
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"OK   {path}") and "1 definitions, 1 queries" in out


def test_an_invalid_file_prints_every_error_with_its_place_and_exits_1(tmp_path, capsys):
    good, bad = tmp_path / "good.siddhi", tmp_path / "bad.siddhi"
    good.write_text(VALID)
    bad.write_text(INVALID)
    assert main(["validate", str(good), str(bad)]) == 1
    captured = capsys.readouterr()
    assert f"OK   {good}" in captured.out
    assert f"{bad}:2:20: No input of this query has an attribute 'total'." in captured.err
    assert f"{bad}:3:6: Stream 'Nope' is not defined." in captured.err
    assert "   2 | from Orders select total insert into Big;" in captured.err


def test_a_syntax_error_is_reported_the_same_way(tmp_path, capsys):
    path = tmp_path / "broken.siddhi"
    path.write_text("define stream S (a int)\nfrom S select a insert into T;\n")
    assert main(["validate", str(path)]) == 1
    assert f"{path}:2:1: Missing ';' before 'from'." in capsys.readouterr().err


def test_a_missing_file_is_an_error_not_a_traceback(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "absent.siddhi")]) == 1
    err = capsys.readouterr().err
    assert "absent.siddhi: cannot be read" in err and "Traceback" not in err


def test_the_installed_command_runs(tmp_path):
    path = tmp_path / "orders.siddhi"
    path.write_text(VALID)
    done = subprocess.run([sys.executable, "-m", "sp_dagster.cli", "validate", str(path)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("OK")
