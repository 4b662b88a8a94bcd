"""Messaging-layer throughput, Kafka (embedded tansu broker) and NATS JetStream (embedded nats-server): publish and read, per codec and strategy.

Run: python bench/messaging.py [--events N] [--layer kafka|nats|both] [--bootstrap host:port] [--nats nats://host:port]
Prints one JSON line per figure, each naming its layer. Without --bootstrap / --nats it starts
the embedded broker / NATS server (JetStream on, file storage in a temporary directory).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
import uuid

from sp_dagster.messaging import EARLIEST, Broadcast, Partitioned, RoundRobin, Transport, codec_for
from sp_dagster.messaging.kafka import KafkaTransport

SCHEMA = [("symbol", "string"), ("price", "double"), ("volume", "long"), ("ts", "long")]
PARTITIONS = 4


def run(transport: Transport, events: int, codec_name: str, strategy_name: str) -> None:
    codec = codec_for(codec_name, SCHEMA)
    strategy = {"round_robin": RoundRobin(), "partitioned": Partitioned(0, "symbol"), "broadcast": Broadcast()}[strategy_name]
    topic = f"bench.{uuid.uuid4().hex[:8]}"
    transport.ensure_topic(topic, PARTITIONS)
    rows = [(f"SYM{i % 100}", 100.0 + i % 50, i, 1_700_000_000_000 + i) for i in range(events)]
    publisher = transport.publisher(topic, codec, strategy)
    start = time.perf_counter()
    sent = publisher.send(rows, [r[3] for r in rows])
    publisher.flush(120)
    publish_s = time.perf_counter() - start
    reader = transport.reader(topic, {p: EARLIEST for p in range(PARTITIONS)}, codec)
    start, got = time.perf_counter(), 0
    while got < sent:
        got += len(reader.poll(max_events=50_000, timeout=1.0).events)
    read_s = time.perf_counter() - start
    reader.close()
    transport.delete_topic(topic)
    common = {"layer": transport.kind, "codec": codec_name, "strategy": strategy_name, "events": events, "messages": sent, "partitions": PARTITIONS}
    print(json.dumps({"bench": "messaging.publish", **common, "seconds": round(publish_s, 3), "messages_per_s": round(sent / publish_s)}), flush=True)
    print(json.dumps({"bench": "messaging.read", **common, "seconds": round(read_s, 3), "messages_per_s": round(sent / read_s)}), flush=True)


@contextlib.contextmanager
def kafka_transport(bootstrap: str | None):
    """A KafkaTransport on the given broker, or on an embedded one started for the run."""
    from sp_dagster.embedded import EmbeddedBroker

    with contextlib.ExitStack() as stack:
        if not bootstrap:
            bootstrap = stack.enter_context(EmbeddedBroker()).bootstrap_servers
        transport = KafkaTransport(bootstrap, timeout=30)
        stack.callback(transport.close)
        yield transport


@contextlib.contextmanager
def nats_transport(url: str | None):
    """A NatsTransport on the given server, or on an embedded one (JetStream in a temporary directory) started for the run."""
    from sp_dagster.embedded import EmbeddedNatsServer
    from sp_dagster.messaging.nats import NatsTransport

    with contextlib.ExitStack() as stack:
        if not url:
            store = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-nats-"))
            url = stack.enter_context(EmbeddedNatsServer(store_dir=store)).url
        transport = NatsTransport(url, "bench", timeout=30)
        stack.callback(transport.close)
        yield transport


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--layer", choices=("kafka", "nats", "both"), default="both")
    parser.add_argument("--bootstrap", help="an existing Kafka broker (default: start the embedded one)")
    parser.add_argument("--nats", help="an existing NATS server with JetStream (default: start the embedded one)")
    args = parser.parse_args()
    layers = [("kafka", lambda: kafka_transport(args.bootstrap)), ("nats", lambda: nats_transport(args.nats))]
    for name, open_transport in layers:
        if args.layer not in (name, "both"):
            continue
        with open_transport() as transport:
            for codec_name in ("json", "binary"):
                run(transport, args.events, codec_name, "round_robin")
            run(transport, args.events, "binary", "partitioned")
            run(transport, args.events // PARTITIONS, "binary", "broadcast")


if __name__ == "__main__":
    main()
