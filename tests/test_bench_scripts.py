"""Every benchmark script starts as `python bench/NAME.py` runs it (its own folder first on the path)
and explains its options: a script whose name hides a module others import fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_bench_script_starts_and_prints_its_usage(script, tmp_path):
    done = subprocess.run([sys.executable, str(BENCH / script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:"), done.stdout[:500]
