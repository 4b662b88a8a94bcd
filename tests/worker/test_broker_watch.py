"""A worker's broker probe: it says `unreachable` once the real broker has not answered for the window, and `reachable` again once it does."""

from __future__ import annotations

import time

from sp_dagster.config.model import MessagingSettings
from sp_dagster.embedded import EmbeddedBroker
from sp_dagster.worker.broker_watch import REACHABLE, UNREACHABLE, BrokerWatch
from tests.cluster.helpers import wait_until


def test_the_probe_follows_a_real_broker_going_away_and_coming_back(tmp_path):
    broker = EmbeddedBroker(log_path=tmp_path / "tansu.log").start()
    port = broker.port
    settings = MessagingSettings("kafka", (broker.bootstrap_servers,))
    watch = BrokerWatch(settings, "w1", lambda: 0.2, lambda: 1.0).start()
    try:
        wait_until(lambda: watch.last_ok > time.monotonic() - 0.5, timeout=30, what="a first answer")
        assert watch.state == REACHABLE
        broker.stop()
        gone = time.monotonic()
        wait_until(lambda: watch.state == UNREACHABLE, timeout=30, what="the probe to notice")
        assert time.monotonic() - gone >= 0.9  # not before the window has passed without an answer
        broker = EmbeddedBroker(port=port, log_path=tmp_path / "tansu-again.log").start()
        wait_until(lambda: watch.state == REACHABLE, timeout=60, what="the probe to see the broker back")
    finally:
        watch.stop()
        broker.stop()
