"""`sp-dagster conformance` and `sp-dagster run` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

APP = "define stream S (symbol string, price float);\n@info(name = 'q') from S[price > 10] select symbol, price insert into O;"


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sp_dagster.cli", *args], capture_output=True, text=True, timeout=120, cwd=ROOT, input=stdin)


def case(case_id: str, expected_rows: list) -> dict:
    return {
        "id": case_id,
        "category": "filter",
        "app": APP,
        "inputs": [
            {"stream": "S", "data": ["A", 55.6], "timestamp": None},
            {"stream": "S", "data": ["B", 5.0], "timestamp": None},
        ],
        "expected": {
            "callback": "query:q",
            "in_events": expected_rows,
            "remove_events": [],
            "ordered": True,
            "types": ["String", "Float"],
            "remove_types": None,
            "callback_invocations": 1,
        },
    }


def write_cases(tmp_path: Path) -> Path:
    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join(json.dumps(c) for c in (case("good", [["A", 55.6]]), case("bad", [["A", 55.7]]))) + "\n")
    return path


def test_conformance_reports_each_case_and_a_summary(tmp_path):
    result = cli("conformance", str(write_cases(tmp_path)))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == "PASS good"
    assert lines[1] == "FAIL bad"
    assert "in_events[0]: expected ['A', 55.7]" in lines[2]
    assert lines[-1] == "1 passed, 1 failed"


def test_conformance_json_and_only(tmp_path):
    result = cli("conformance", str(write_cases(tmp_path)), "--json", "--only", "good")
    assert result.returncode == 0
    (line,) = result.stdout.splitlines()
    outcome = json.loads(line)
    assert outcome["id"] == "good" and outcome["passed"] and outcome["error"] is None
    assert outcome["actual"]["in_events"] == [["A", 55.599998474121094]]
    assert outcome["actual"]["types"] == ["String", "Float"]
    missing = cli("conformance", str(write_cases(tmp_path)), "--only", "nope")
    assert missing.returncode == 1 and missing.stderr.startswith("error: ") and "Traceback" not in missing.stderr


def test_run_prints_what_output_streams_receive(tmp_path):
    app = tmp_path / "app.siddhi"
    app.write_text("@app:playback\n" + APP.replace("insert into O", "insert into O; from S#window.lengthBatch(2) select count() as n insert into Counts"))
    events = tmp_path / "events.jsonl"
    events.write_text('{"stream": "S", "data": ["A", 55.6], "timestamp": 1000}\n{"stream": "S", "data": {"symbol": "B", "price": 5}, "timestamp": 2000}\n')
    result = cli("run", str(app), "--input", str(events))
    assert result.returncode == 0, result.stderr
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        {"stream": "O", "data": ["A", 55.6], "timestamp": 1000},
        {"stream": "Counts", "data": [2], "timestamp": 2000},
    ]


def test_run_reports_bad_input_and_bad_apps_in_one_line(tmp_path):
    app = tmp_path / "app.siddhi"
    app.write_text(APP)
    result = cli("run", str(app), "--input", "-", stdin='{"stream": "S", "data": ["A", "cheap"]}\n')
    assert result.returncode == 1
    assert result.stderr.strip() == "error: -:1: attribute 'price': expected float, got str 'cheap'"
    app.write_text("define stream S (a int);\nfrom S[a > 'x'] select a insert into O;")
    result = cli("run", str(app), "--input", "-", stdin="")
    assert result.returncode == 1 and f"{app}:2:" in result.stderr and "Traceback" not in result.stderr


def test_run_fires_start_triggers_and_prints_no_named_window(tmp_path):
    app = tmp_path / "app.siddhi"
    app.write_text(
        "@app:playback\ndefine stream S (x int);\ndefine trigger Boot at 'start';\n"
        "define window W (x int) length(1);\nfrom S select x insert into W;\n"
        "from W select x insert all events into Moved;\nfrom Boot select triggered_time insert into Booted;"
    )
    result = cli("run", str(app), "--input", "-", stdin="")  # no input: the start trigger fires all the same
    assert result.returncode == 0, result.stderr
    assert [json.loads(line) for line in result.stdout.splitlines()] == [{"stream": "Booted", "data": [0], "timestamp": 0}]
    events = '{"stream": "S", "data": [1], "timestamp": 1000}\n{"stream": "S", "data": [2], "timestamp": 2000}\n'
    result = cli("run", str(app), "--input", "-", stdin=events)
    assert [json.loads(line)["data"] for line in result.stdout.splitlines()] == [[0], [1], [1], [2]]
