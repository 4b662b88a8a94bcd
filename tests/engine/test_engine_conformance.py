"""Every conformance case, replayed through the runner; and once more through a snapshot.

Every case must pass; a case the parser cannot read would be a strict xfail naming why.
"""

from __future__ import annotations

import pytest

from sp_dagster.engine.conformance import load_cases, run_case
from sp_dagster.siddhi import SiddhiQLError, parse
from tests.fixtures.conformance import FILES, SHARED


def _params(snapshot: bool):
    params = []
    for path in FILES:
        for case in load_cases(path):
            marks = []
            try:
                parse(case.app)
            except SiddhiQLError as exc:
                marks.append(pytest.mark.xfail(strict=True, reason=f"parser: {exc.message}"))
            if snapshot and (marks or len(case.inputs) < 2):
                continue
            params.append(pytest.param(case, id=f"{path.stem}:{case.id}", marks=marks))
    return params


def _explain(outcome) -> str:
    return "\n".join([outcome.error] if outcome.error else outcome.differences)


@pytest.mark.skipif(not FILES, reason=f"no conformance files under {SHARED}")
@pytest.mark.parametrize("case", _params(snapshot=False))
def test_case(case):
    outcome = run_case(case)
    assert outcome.passed, _explain(outcome)


@pytest.mark.skipif(not FILES, reason=f"no conformance files under {SHARED}")
@pytest.mark.parametrize("case", _params(snapshot=True))
def test_case_survives_snapshot_and_restore_halfway(case):
    """Snapshot before the middle input, restore into a fresh runtime: same output."""
    outcome = run_case(case, restore_at=len(case.inputs) // 2)
    assert outcome.passed, _explain(outcome)
