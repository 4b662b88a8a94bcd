"""The Prometheus endpoint of a manager or worker: `/metrics`, read at each scrape from what the node already knows.
A node hands `serve_metrics` a function returning its samples now, so nothing is counted twice; where the
endpoint listens is deployment.yaml's `metrics` section (docs/configuration.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

PREFIX = "sp_dagster_"


@dataclass
class Family:
    """One metric: its name (without the prefix), help text, kind (gauge or counter) and samples ({labels} -> value)."""

    name: str
    help: str
    kind: str = "gauge"
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, value: float | None, **labels: str) -> Family:
        """Add a sample (a None value is left out: not known yet)."""
        if value is not None:
            self.samples.append((labels, float(value)))
        return self


class _Collector:
    def __init__(self, collect: Callable[[], Iterable[Family]]):
        self._collect = collect

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        try:
            families = list(self._collect())
        except Exception as exc:  # a scrape never takes the node down; the next one tries again
            log.warning("metrics: could not collect: %s", exc)
            return
        for family in families:
            names = sorted({key for labels, _ in family.samples for key in labels})
            kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
            metric = kind(PREFIX + family.name, family.help, labels=names)
            for labels, value in family.samples:
                metric.add_metric([labels.get(n, "") for n in names], value)
            yield metric


class MetricsEndpoint:
    """A running `/metrics` endpoint; `url` is where it answers."""

    def __init__(self, server, thread, url: str):
        self._server, self._thread, self.url = server, thread, url

    def stop(self) -> None:
        """Stop answering and release the port."""
        self._server.shutdown()
        self._server.server_close()


def serve_metrics(settings, collect: Callable[[], Iterable[Family]], node: str, shown_host: str = "127.0.0.1") -> MetricsEndpoint | None:
    """Serve `collect()`'s samples at http://host:port/metrics (`settings`: deployment.yaml's `metrics`; a wildcard host
    is shown as `shown_host`, the node's address); None when disabled or when the port cannot be had (said in the log:
    the node runs on without metrics)."""
    if not settings.enabled:
        return None
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(collect))
    try:
        server, thread = start_http_server(settings.port, settings.host, registry=registry)
    except OSError as exc:
        log.warning(
            "%s: cannot serve metrics on %s:%d (%s); set metrics.port to a free port, or metrics.enabled: false", node, settings.host, settings.port, exc
        )
        return None
    host = settings.host if settings.host not in ("0.0.0.0", "::", "") else shown_host
    url = f"http://{host}:{server.server_port}/metrics"
    log.info("%s: Prometheus metrics at %s", node, url)
    return MetricsEndpoint(server, thread, url)
