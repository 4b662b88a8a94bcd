"""Messaging-layer throughput on the embedded broker: publish and read, per codec and strategy.

Run: python bench/messaging.py [--events N] [--bootstrap host:port]
Prints one JSON line per figure. Without --bootstrap it starts the embedded broker.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

from sp_dagster.messaging import EARLIEST, Broadcast, Partitioned, RoundRobin, codec_for
from sp_dagster.messaging.kafka import KafkaTransport

SCHEMA = [("symbol", "string"), ("price", "double"), ("volume", "long"), ("ts", "long")]
PARTITIONS = 4


def run(transport: KafkaTransport, events: int, codec_name: str, strategy_name: str) -> None:
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
    common = {"codec": codec_name, "strategy": strategy_name, "events": events, "messages": sent, "partitions": PARTITIONS}
    print(json.dumps({"bench": "messaging.publish", **common, "seconds": round(publish_s, 3), "messages_per_s": round(sent / publish_s)}), flush=True)
    print(json.dumps({"bench": "messaging.read", **common, "seconds": round(read_s, 3), "messages_per_s": round(sent / read_s)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--bootstrap", help="an existing broker (default: start the embedded one)")
    args = parser.parse_args()
    broker = None
    if not args.bootstrap:
        from sp_dagster.embedded import EmbeddedBroker

        broker = EmbeddedBroker().start()
    try:
        transport = KafkaTransport(args.bootstrap or broker.bootstrap_servers, timeout=30)
        for codec_name in ("json", "binary"):
            run(transport, args.events, codec_name, "round_robin")
        run(transport, args.events, "binary", "partitioned")
        run(transport, args.events // PARTITIONS, "binary", "broadcast")
    finally:
        if broker:
            broker.stop()


if __name__ == "__main__":
    main()
