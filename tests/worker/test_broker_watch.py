"""A worker's broker probe: it says `unreachable` once the real broker has not answered for the window, and `reachable` again once it does."""

from __future__ import annotations

import time

from sp_dagster.config.model import MessagingSettings
from sp_dagster.embedded import EmbeddedBroker
from sp_dagster.worker.broker_watch import REACHABLE, UNREACHABLE, BrokerWatch
from tests.fixtures.waiting import wait_until


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


def test_the_window_counts_from_the_start_of_probing_not_from_construction():
    # A worker builds its watch, then starts Spark (often longer than the fence window), then starts
    # probing: it must not say `unreachable` before a single probe ran (that moved its instances away).
    now = [100.0]
    watch = BrokerWatch(MessagingSettings("kafka", ("127.0.0.1:1",)), "w1", lambda: 60.0, lambda: 8.0, clock=lambda: now[0])
    now[0] += 30.0  # Spark starting
    watch.stop()  # the thread's first probe runs at once; stopped, it probes no more
    watch.start()
    assert watch.state == REACHABLE
    now[0] += 8.5
    assert watch.state == UNREACHABLE  # no answer (nothing listens at port 1) for the whole window since the start
