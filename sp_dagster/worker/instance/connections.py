"""An instance's connections: which messaging client each input and output uses, the partitions it
reads, and its publishers. Most inputs and outputs are on the cluster's own messaging layer; a user
source or sink may name a Kafka cluster of its own or a NATS server, with one client per such endpoint.
"""

from __future__ import annotations

from collections.abc import Iterable

from sp_dagster.messaging.transport import RawPublisher, Transport
from sp_dagster.siddhi.secrets import resolved_properties
from sp_dagster.worker.instance.plan import InstancePlan

OWN = ""  # the key of the cluster's own publisher


class Connections:
    """The clients and publishers of one instance.

    A user source or sink may name a Kafka cluster of its own (`bootstrap.servers`,
    `optional.configuration`) or a NATS server: one client per such endpoint, made on first use; one
    publisher per client (the cluster's own may be the instance's transactional one), closed with the
    instance."""

    def __init__(self, plan: InstancePlan, transport: Transport, others: dict | None = None):
        self.plan = plan
        self.own = transport
        self.others = dict(others or {})  # endpoint -> the client of another Kafka cluster or NATS server
        self.output_cluster = {t: (o.bootstrap, o.nats) for o in plan.outputs if o.bootstrap or o.nats for t in (o.topic, *o.topics)}
        self._publishers: dict[object, RawPublisher] = {}  # OWN: the cluster's own (or its transactions), else per client
        self._publisher_of: dict[str, RawPublisher] = {}  # topic -> its publisher

    def of(self, bootstrap: str | None = None, properties: tuple = (), nats=None) -> Transport:
        """The cluster's client, a Kafka client of another cluster or with a user source's own properties,
        or the NATS client of a user nats source/sink (`nats`, a NatsEndpoint)."""
        if nats is not None:
            return self._nats(nats)
        if not bootstrap and not properties:
            return self.own
        name = f"{bootstrap or ''}|{properties}" if properties else bootstrap
        if name not in self.others:
            from sp_dagster.messaging.kafka import KafkaTransport

            servers = bootstrap or getattr(self.own, "bootstrap_servers", None)
            if servers is None:
                raise ValueError(f"{self.plan.name}: optional.configuration needs a Kafka messaging layer")
            own = dict(resolved_properties(properties, f"{self.plan.name}: optional.configuration"))  # ${VAR}s from this node
            self.others[name] = KafkaTransport(servers, {**getattr(self.own, "properties", {}), **own})
        return self.others[name]

    def of_source(self, source) -> Transport:
        """The client an input is read with."""
        return self.of(source.bootstrap, source.properties, source.nats)

    def of_output(self, topic: str) -> Transport:
        """The client an output topic is published with."""
        bootstrap, nats = self.output_cluster.get(topic, (None, None))
        return self.of(bootstrap, nats=nats)

    def _nats(self, endpoint) -> Transport:
        """The cluster's own client when the endpoint resolves to it, else one NATS client per server and cluster id."""
        from sp_dagster.messaging.nats import NatsTransport

        own = self.own if isinstance(self.own, NatsTransport) else None
        servers, cluster_id = endpoint.resolve(own and own.address, own and own.cluster_id)
        candidate = NatsTransport(servers, cluster_id, setting=f"bootstrap.servers of the nats @source/@sink in {self.plan.name}")
        if own is not None and (candidate.servers, candidate.cluster_id) == (own.servers, own.cluster_id):
            return own
        return self.others.setdefault(("nats", candidate.servers, candidate.cluster_id), candidate)

    def output_partitions(self, topic: str) -> int:
        """How many partitions an output topic has (user sinks that spread over all of them)."""
        return self.of_output(topic).require_topic(topic).partitions

    def partitions_read(self, source) -> tuple[int, ...]:
        """The partitions of an input the instance reads: those the plan names, else this instance's
        share of all of them (a user kafka source read by N instances), else all of them."""
        if source.partitions:
            return source.partitions
        transport = self.of_source(source)
        if source.nats is not None:  # made (or grown) to one partition per instance that shares it
            count = transport.ensure_topic(source.topic, (source.share or (1, 1))[1]).partitions
        else:
            count = transport.require_topic(source.topic).partitions
        return share_of(count, *(source.share or (1, 1)))

    def use_own(self, publisher: RawPublisher) -> None:
        """Publish to the cluster's own topics with `publisher` (the instance's transactions)."""
        self._publishers[OWN] = publisher

    def publisher(self, topic: str) -> RawPublisher:
        """The publisher of an output topic (one per client, made on first use)."""
        publisher = self._publisher_of.get(topic)
        if publisher is None:
            transport = self.of_output(topic)
            key = OWN if transport is self.own else id(transport)
            if key not in self._publishers:
                self._publishers[key] = transport.raw_publisher()
            publisher = self._publisher_of[topic] = self._publishers[key]
        return publisher

    @property
    def publishers(self) -> Iterable[RawPublisher]:
        """Every publisher made so far."""
        return list(self._publishers.values())

    def close(self, leave: bool = False) -> list[Exception]:
        """Close every publisher (`leave`: the claim ended, so each is left instead: what it holds its next owner
        publishes again or resolves) and every client of another endpoint; the errors met, for the log (closing
        after a broker outage)."""
        errors: list[Exception] = []
        for publisher in self._publishers.values():
            try:
                if leave:
                    publisher.leave()
                else:
                    publisher.close()
            except Exception as exc:  # noqa: BLE001 - closing after a broker outage
                errors.append(exc)
        self._publishers, self._publisher_of = {}, {}
        for transport in self.others.values():
            transport.close()
        return errors


def share_of(partitions: int, index: int, count: int) -> tuple[int, ...]:
    """The partitions instance `index` (1-based) of `count` reads of a topic's `partitions`: every
    count-th one from its own, so each partition is read by exactly one instance."""
    return tuple(range(index - 1, partitions, count))
