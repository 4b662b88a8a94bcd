"""The chaos suite: a steady stream through a two-group stateful app while a worker is SIGKILLed, a worker is
paused past its heartbeat window, and the leader manager is killed; every key's outputs equal the engine's."""

from __future__ import annotations

import json

import pytest

from sp_dagster.embedded.chaos import FAULTS, ChaosRun
from tests.worker.test_end_to_end import APP_PATH

pytestmark = [pytest.mark.slow, pytest.mark.broker]


def test_outputs_are_exact_per_key_with_nothing_lost_or_duplicated_across_faults(broker, tmp_path):
    run = ChaosRun(tmp_path, broker.bootstrap_servers, APP_PATH.read_text().replace("Trades", "TradesChaos"))
    report = run.run(FAULTS, seed=3)
    for line in report.lines():
        print(json.dumps(line))
    assert report.events_in > 0 and report.outputs > 0
    assert (report.lost, report.duplicated) == (0, 0), run.cluster.logs()
    assert report.exact_per_key and report.outputs == report.expected
    assert [f.kind for f in report.faults] == list(FAULTS)
