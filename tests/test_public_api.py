"""The public API: `import sp_dagster` is cheap, every export resolves, and every docstring example runs."""

from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

import pytest

import sp_dagster

REPO = Path(__file__).resolve().parents[1]


def test_import_is_cheap_and_names_resolve_on_use():
    code = "import sys, sp_dagster; print(sorted(m for m in ('dagster', 'pyarrow', 'sqlalchemy', 'lark', 'pyspark') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert result.stdout.strip() == "[]"
    assert sp_dagster.__version__ and sp_dagster.__version__[0].isdigit()
    assert all(issubclass(getattr(sp_dagster, n), sp_dagster.SpDagsterError) for n in sp_dagster.__all__ if n.endswith("Error"))
    with pytest.raises(AttributeError):
        sp_dagster.nothing_here  # noqa: B018


@pytest.mark.parametrize("name", ["AppRuntime", "parse", "plan", "deploy", "load_config", "SpDagsterError"])
def test_docstring_examples_run(name, sp_home, monkeypatch):
    monkeypatch.delenv("SP_DAGSTER_CONF", raising=False)
    monkeypatch.delenv("SP_DAGSTER_WORKER_CONF", raising=False)
    tests = doctest.DocTestFinder(recurse=False).find(getattr(sp_dagster, name), name, globs={})
    assert sum(len(t.examples) for t in tests) >= 2
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in tests:
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
