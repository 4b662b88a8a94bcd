"""Rescaling a keyed group under load (3 -> 2 -> 3 instances; the embedded broker cannot add partitions, so it starts at 3) on real workers: every key's outputs equal the engine's."""

from __future__ import annotations

import pytest

from sp_dagster.embedded.chaos import KEYED_GROUP, ChaosRun
from tests.fixtures.chaos import run_exact
from tests.fixtures.trades import APP_PATH

pytestmark = [pytest.mark.slow, pytest.mark.broker]


def test_per_key_results_are_exact_across_a_rescale_down_and_up_under_load(broker, tmp_path):
    text = APP_PATH.read_text().replace("Trades", "TradesRescale").replace(KEYED_GROUP.format(2), KEYED_GROUP.format(3))
    run = ChaosRun(tmp_path, broker.bootstrap_servers, text)
    run_exact(run, ("rescale-down", "rescale-up"), check_faults=False, seed=5)
