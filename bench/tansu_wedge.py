"""The embedded broker's transaction defect, with plain confluent-kafka clients and no sp-dagster code path.

Run: python bench/tansu_wedge.py [--rounds N] [--producers K] [--hogs H]
Each round, K producers (new transactional ids) run three transactions each to one partition, the
last ones ending at the same moment, and close. tansu 0.6 sometimes marks one of those transactions
committed from another's end request before its own end marker is stored; the marker then puts it
back among the partition's transactions, where it blocks every later one from completing: the
partition's last stable offset stays put and read_committed readers see nothing more, for good. It
shows under CPU load (H busy processes beside the broker). Prints one JSON line per round that wedged
the partition (the first held messages name their transactions) and a summary line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sp_dagster.embedded import EmbeddedBroker
from sp_dagster.messaging.kafka import KafkaTransport

TOPIC = "wedge"
SETTLE_S = 10.0  # a healthy partition's committed end reaches its written end well within this


def _busy(until: float) -> None:
    while time.time() < until:
        pass


def _producer(servers: str, name: str, barrier: threading.Barrier) -> None:
    producer = Producer({"bootstrap.servers": servers, "transactional.id": name, "linger.ms": 1, "log_level": 2})
    producer.init_transactions(30)
    for txn in range(3):
        producer.begin_transaction()
        for n in range(5):
            producer.produce(TOPIC, f"{name}/{txn}/{n}".encode(), partition=0)
        if txn == 2:
            barrier.wait()  # the last transactions end together
        producer.commit_transaction(30)


def _held(servers: str, offset: int) -> list[str]:
    """The messages from `offset` on, read uncommitted."""
    consumer = Consumer({"bootstrap.servers": servers, "group.id": uuid.uuid4().hex, "isolation.level": "read_uncommitted", "log_level": 2})
    consumer.assign([TopicPartition(TOPIC, 0, offset)])
    found, deadline = [], time.time() + 3
    while time.time() < deadline and len(found) < 20:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            found.append((message.value() or b"").decode())
    consumer.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--producers", type=int, default=6)
    parser.add_argument("--hogs", type=int, default=3)
    args = parser.parse_args()
    hogs = [multiprocessing.Process(target=_busy, args=(time.time() + 3600,), daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    wedged, started = 0, time.time()
    try:
        with EmbeddedBroker() as broker:
            servers = broker.bootstrap_servers
            admin = AdminClient({"bootstrap.servers": servers})
            for future in admin.create_topics([NewTopic(TOPIC, 1, 1)]).values():
                future.result()
            transport = KafkaTransport(servers)
            for round_ in range(args.rounds):
                barrier = threading.Barrier(args.producers)
                names = [f"r{round_}-p{k}" for k in range(args.producers)]
                threads = [threading.Thread(target=_producer, args=(servers, name, barrier)) for name in names]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                deadline = time.time() + SETTLE_S
                while (committed := transport.end_offsets(TOPIC)[0]) < (written := transport.end_offsets_with_open_transactions(TOPIC)[0]):
                    if time.time() > deadline:
                        wedged += 1
                        print(
                            json.dumps(
                                {
                                    "bench": "tansu_wedge.round",
                                    "round": round_,
                                    "committed_end": committed,
                                    "written_end": written,
                                    "held": _held(servers, committed),
                                }
                            ),
                            flush=True,
                        )
                        break
                    time.sleep(0.2)
                if wedged:
                    break  # nothing after a wedge completes on this partition
            transport.close()
    finally:
        for hog in hogs:
            hog.terminate()
    summary = {"rounds": round_ + 1, "producers": args.producers, "hogs": args.hogs, "wedged": wedged, "seconds": round(time.time() - started, 1)}
    print(json.dumps({"bench": "tansu_wedge", **summary}), flush=True)


if __name__ == "__main__":
    main()
