"""The Prometheus endpoint nodes serve: what a scrape returns, and what happens when it cannot listen."""

from __future__ import annotations

import logging
import socket
import urllib.request

from sp_dagster.cluster.prometheus import Family, serve_metrics
from sp_dagster.config.model import MetricsConfig


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def test_a_scrape_reads_the_nodes_samples_as_they_are_then():
    state = {"rows": 3}

    def collect():
        return [
            Family("instance_rows_in_total", "Events in.", "counter").add(state["rows"], instance="App-g-1"),
            Family("instance_lag", "Unread.").add(7, instance="App-g-1").add(None, instance="App-g-2"),  # not known yet: left out
        ]

    endpoint = serve_metrics(MetricsConfig(), collect, "worker w1")
    assert endpoint is not None and endpoint.url.startswith("http://127.0.0.1:") and endpoint.url.endswith("/metrics")
    try:
        text = scrape(endpoint.url)
        assert 'sp_dagster_instance_rows_in_total{instance="App-g-1"} 3.0' in text
        assert "# TYPE sp_dagster_instance_rows_in_total counter" in text
        assert 'sp_dagster_instance_lag{instance="App-g-1"} 7.0' in text and "App-g-2" not in text
        state["rows"] = 10
        assert 'sp_dagster_instance_rows_in_total{instance="App-g-1"} 10.0' in scrape(endpoint.url)
    finally:
        endpoint.stop()


def test_a_failing_collection_answers_empty_and_the_next_scrape_works(caplog):
    calls = []

    def collect():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the database went away")
        return [Family("manager_leader", "Leading.").add(True)]

    endpoint = serve_metrics(MetricsConfig(), collect, "manager m1")
    assert endpoint is not None
    try:
        with caplog.at_level(logging.WARNING):
            assert "sp_dagster_manager_leader" not in scrape(endpoint.url)
        assert "metrics: could not collect: the database went away" in caplog.text
        assert "sp_dagster_manager_leader 1.0" in scrape(endpoint.url)
    finally:
        endpoint.stop()


def test_disabled_or_a_taken_port_serves_nothing_and_says_what_to_do(caplog):
    assert serve_metrics(MetricsConfig(enabled=False), list, "worker w1") is None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level(logging.WARNING):
            assert serve_metrics(MetricsConfig(port=port), list, "worker w1") is None
    assert f"worker w1: cannot serve metrics on 127.0.0.1:{port}" in caplog.text
    assert "set metrics.port to a free port, or metrics.enabled: false" in caplog.text
