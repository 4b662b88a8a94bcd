"""The chaos suite: a steady stream through a two-group stateful app while a worker is SIGKILLed, a worker is
paused past its heartbeat window, the leader manager is killed, the broker freezes, and the control-plane
database goes away for 30 s; every key's outputs equal the engine's, nothing lost or duplicated. (A broker
killed on durable storage loses outputs of its own about one run in two: `bench/chaos.py --faults broker-restart`.)"""

from __future__ import annotations

import pytest

from sp_dagster.embedded.chaos import FAULTS, SERVER_FAULTS, ChaosRun
from tests.fixtures.chaos import run_exact
from tests.fixtures.trades import APP_PATH

pytestmark = [pytest.mark.slow, pytest.mark.broker]

APP = APP_PATH.read_text().replace("Trades", "TradesChaos")
SERVERS_APP = APP_PATH.read_text().replace("Trades", "TradesServers")  # its own topics on the session's broker


def test_outputs_are_exact_per_key_with_nothing_lost_or_duplicated_across_faults(broker, tmp_path):
    run = ChaosRun(tmp_path, broker.bootstrap_servers, APP)
    run_exact(run, FAULTS, seed=3)


def test_outputs_are_exact_across_a_broker_pause_and_a_database_outage(broker, database_server_factory, tmp_path):
    # The control plane and the persistence table live on a PostgreSQL server of the test's own,
    # stopped for 30 s; the broker (the session's) is frozen for 30 s.
    database = database_server_factory("postgresql")
    run = ChaosRun(tmp_path, broker.bootstrap_servers, SERVERS_APP, broker=broker, database=database, database_url=database.create_database())
    run_exact(run, SERVER_FAULTS, seed=5)
