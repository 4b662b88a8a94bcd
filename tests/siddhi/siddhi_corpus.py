"""The shared SiddhiQL corpora the language tests run over (conformance and topology cases)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

SHARED = Path(os.environ.get("SP_DAGSTER_SHARED", Path(__file__).resolve().parents[3] / "shared"))
CONFORMANCE_FILES = sorted((SHARED / "conformance").glob("*.jsonl"))
TOPOLOGY_FILE = SHARED / "reference" / "wso2_topology_cases.jsonl"
SEEDS = SHARED / "seeds"

needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"the shared corpus is not at {SHARED}")


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def conformance_cases() -> list[dict]:
    """Every conformance case, in file order."""
    return [case for path in CONFORMANCE_FILES for case in _read_jsonl(path)]


def topology_cases() -> list[dict]:
    """Every WSO2 job-manager test case (distributed apps with @dist)."""
    return _read_jsonl(TOPOLOGY_FILE) if TOPOLOGY_FILE.exists() else []


def corpus_apps() -> list:
    """pytest params (app text, id) for every app of both corpora."""
    params = [pytest.param(c["app"], id=f"conformance:{c['id']}") for c in conformance_cases()]
    params += [pytest.param(c["app"], id=f"topology:{c['id']}:{c['line']}") for c in topology_cases()]
    return params
