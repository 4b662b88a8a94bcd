"""End-to-end throughput and latency of a deployed app, beside a raw passthrough on the same broker.

Run: python bench/pipeline.py [--events N] [--rate R] [--seconds S] [--modes continuous,microbatch] [--no-scaling]
                              [--messaging kafka|nats]
Starts the embedded broker, then measures, in one run:
  1. passthrough: a plain consume-and-produce loop (one process, confluent-kafka) between two
     topics: the floor any pipeline on this broker pays;
  2. app.<mode>: tests' two-group app (filter, parallel 2 -> partitioned length-window average,
     parallel 2) deployed on a local cluster (a manager, two Spark workers, SQLite), once per
     execution mode (continuous tasks with transactions, and without: at-least-once; micro-batch queries);
  3. scaling.<n>w: the same app with both groups at parallel 4 (4-partition topics), on one
     worker and then on two (continuous mode; throughput only).
With --messaging nats the groups are wired through an embedded nats-server (JetStream) instead
(the passthrough stays on Kafka: the floor figure). For each: events/s with every event published at once, and latency p50/p99 (ms from an event's
publication to the output it causes) at a paced rate; `vs_passthrough` is the app's events/s as
a fraction of the passthrough's in the same run. One JSON line per figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer  # noqa: E402

from sp_dagster.deploy import load_app, plan_app  # noqa: E402
from sp_dagster.embedded import EmbeddedBroker  # noqa: E402
from sp_dagster.embedded.local_cluster import LocalCluster  # noqa: E402
from sp_dagster.messaging import EARLIEST, LATEST, Partitioned, RowPublisher, codec_for  # noqa: E402
from sp_dagster.messaging.kafka import KafkaTransport  # noqa: E402
from sp_dagster.worker.instance_plan import plan_instance  # noqa: E402

APP = ROOT / "tests" / "worker" / "apps" / "trades.siddhi"
INPUT = [("symbol", "string"), ("price", "double"), ("volume", "long")]
OUTPUT = [("symbol", "string"), ("avgPrice", "double"), ("total", "long")]
SYMBOLS = [f"SYM{i:02d}" for i in range(50)]


def rows(count: int, seed: int = 3):
    rng = random.Random(seed)
    return [(rng.choice(SYMBOLS), round(rng.uniform(10, 200), 2), rng.randint(10, 40)) for _ in range(count)]


def emit(figure: dict) -> None:
    print(json.dumps(figure), flush=True)


class Collector(threading.Thread):
    """Reads an output topic and records, per event, now - its timestamp (ms)."""

    def __init__(self, transport, topic: str, codec, partitions: int):
        super().__init__(daemon=True)
        self.reader = transport.reader(topic, {p: LATEST for p in range(partitions)}, codec)
        self.latencies: list[float] = []
        self.count = 0
        self.last_at = 0.0
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            batch = self.reader.poll(max_events=50_000, timeout=0.2)
            now = time.time() * 1000
            for event in batch.events:
                self.latencies.append(now - event.timestamp)
            if batch.events:
                self.count += len(batch.events)
                self.last_at = time.monotonic()
        self.reader.close()

    def wait_for(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.count < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.count >= count


def publish_all(publisher, data, paced_rate: float | None = None) -> float:
    """Publish rows stamped with the wall clock; returns when publishing started."""
    started = time.monotonic()
    if paced_rate is None:
        now = int(time.time() * 1000)
        publisher.send(data, [now] * len(data))
    else:
        for index, row in enumerate(data):
            due = started + index / paced_rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            publisher.send([row], [int(time.time() * 1000)])
    publisher.flush(120)
    return started


def passthrough(transport, events: int, rate: float, seconds: float) -> None:
    """A consume-and-produce loop between two topics: the broker's floor."""
    source, sink = "bench.passthrough.in", "bench.passthrough.out"
    for topic in (source, sink):
        transport.ensure_topic(topic, 2)
    codec = codec_for("binary", INPUT)
    stop = threading.Event()

    def loop() -> None:
        reader = transport.reader(source, {0: EARLIEST, 1: EARLIEST}, codec_for("raw", [("value", "object")]))
        out = PlainProducer(transport)  # the floor: librdkafka's defaults
        while not stop.is_set():
            batch = reader.poll(max_events=50_000, timeout=0.1)
            for event in batch.events:
                out.produce(sink, event.row[0], event.key, event.partition, event.timestamp)
            if batch.events:
                out.flush(60)
        reader.close()

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    measure("passthrough", transport, source, sink, codec, codec, events, events, rate, seconds)
    stop.set()
    worker.join(10)


FLOOR: dict[str, float] = {}  # the passthrough's events/s in this run


class PlainProducer:
    """The load generator's raw side on Kafka: librdkafka's defaults (not the workers' idempotent
    producer), so publishing the input never limits a figure."""

    def __init__(self, transport):
        self.producer = Producer(transport.client_config(**{"linger.ms": 5, "acks": "all"}))

    def produce(self, topic, value, key, partition, timestamp, headers=None) -> None:
        while True:
            try:
                self.producer.produce(topic, value=value, key=key, partition=partition, timestamp=timestamp or 0)
                return
            except BufferError:
                self.producer.poll(0.05)

    def serve(self) -> None:
        self.producer.poll(0)

    def flush(self, timeout: float = 30.0) -> None:
        if self.producer.flush(timeout):
            raise RuntimeError("the broker did not acknowledge every input event")

    def close(self) -> None:
        self.flush()


def load_publisher(transport, topic: str, codec):
    """A publisher of input rows keyed by symbol: a plain producer on Kafka, the transport's own otherwise."""
    if transport.kind != "kafka":
        return transport.publisher(topic, codec, Partitioned(0, "symbol"))
    return RowPublisher(PlainProducer(transport), transport.require_topic(topic), codec, Partitioned(0, "symbol"))


def measure(name, transport, source, sink, in_codec, out_codec, events, expected_out, rate, seconds) -> None:
    """Throughput (all at once) then, when `seconds`, latency (paced) from `source` to `sink`."""
    info = transport.require_topic(sink)
    publisher = load_publisher(transport, source, in_codec)
    collector = Collector(transport, sink, out_codec, info.partitions)
    collector.start()
    data = rows(events)
    started = publish_all(publisher, data)
    done = collector.wait_for(expected_out, timeout=600)
    elapsed = collector.last_at - started
    per_s = round(events / elapsed) if elapsed > 0 else None
    if name == "passthrough" and per_s:
        FLOOR["events_per_s"] = per_s
    figure = {
        "bench": f"pipeline.{name}.throughput",
        "events": events,
        "outputs": collector.count,
        "complete": done,
        "seconds": round(elapsed, 2),
        "events_per_s": per_s,
    }
    if name != "passthrough" and per_s and FLOOR:
        figure["vs_passthrough"] = round(per_s / FLOOR["events_per_s"], 3)
    emit(figure)
    if not seconds:
        collector.stop_flag.set()
        collector.join(5)
        return
    collector.latencies.clear()
    before = collector.count
    paced = rows(int(rate * seconds), seed=4)
    publish_all(publisher, paced, paced_rate=rate)
    time.sleep(5)
    collector.stop_flag.set()
    collector.join(5)
    lat = sorted(collector.latencies)
    if lat:
        emit(
            {
                "bench": f"pipeline.{name}.latency",
                "rate_per_s": rate,
                "events": len(paced),
                "outputs": collector.count - before,
                "p50_ms": round(statistics.median(lat), 1),
                "p99_ms": round(lat[int(0.99 * (len(lat) - 1))], 1),
            }
        )


def pipeline(transport, name: str, text: str, events: int, rate: float, seconds: float, *, mode: str, workers: int = 2, address: str | None = None) -> None:
    """An app on a local cluster of `workers` workers in `mode` over `transport`; `name` names its figures."""
    app = text.replace("Trades", f"Bench{name.replace('.', '').title()}")
    with tempfile.TemporaryDirectory() as home:
        path = Path(home) / "app.siddhi"
        path.write_text(app)
        loaded = load_app(path)
        topology = plan_app(loaded)
        slots = sum(len(g.instances) for g in topology.groups) if mode.startswith("continuous") else 1
        layer = {"messaging": "nats", "cluster_id": transport.cluster_id} if transport.kind == "nats" else {}
        mode, _, delivery = mode.partition("-")  # continuous-at-least-once: no transactions
        cluster = LocalCluster(
            Path(home),
            address or transport.bootstrap_servers,
            workers=workers,
            persist_every_min=1,
            mode=mode,
            slots=slots,
            exactly_once=delivery != "at-least-once",
            **layer,
        ).start()
        try:
            cluster.deploy(path, timeout=300)
            first = topology.group("filter").instances[0]
            (entry,) = plan_instance(first.name, first.siddhi).inputs
            in_codec = codec_for(entry.codec, entry.attributes)
            # volume >= 10 always holds here, so every input gives one output
            out = f"{loaded.name}.Averages"
            measure(name, transport, entry.topic, out, in_codec, codec_for("json", OUTPUT), events, events, rate, seconds)
        finally:
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000, help="events for the throughput figure")
    parser.add_argument("--rate", type=float, default=500.0, help="events/s for the latency figure")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the paced latency run lasts")
    parser.add_argument(
        "--modes",
        default="continuous,continuous-at-least-once,microbatch",
        help="execution modes to measure, separated by commas (continuous-at-least-once: without transactions)",
    )
    parser.add_argument("--no-scaling", action="store_true", help="skip the 1 -> 2 workers figures")
    parser.add_argument("--messaging", choices=("kafka", "nats"), default="kafka", help="the layer between the app's groups")
    args = parser.parse_args()
    text = APP.read_text()
    with EmbeddedBroker() as broker, contextlib.ExitStack() as stack:
        transport = KafkaTransport(broker.bootstrap_servers, timeout=30)
        passthrough(transport, args.events, args.rate, args.seconds)
        address, prefix = None, ""
        if args.messaging == "nats":
            from sp_dagster.embedded import EmbeddedNatsServer
            from sp_dagster.messaging.nats import NatsTransport

            server = stack.enter_context(EmbeddedNatsServer(store_dir=Path(stack.enter_context(tempfile.TemporaryDirectory()))))
            transport, address, prefix = NatsTransport(server.url, "bench", timeout=30), server.url, "nats."
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            pipeline(transport, f"{prefix}app.{mode}", text, args.events, args.rate, args.seconds, mode=mode, address=address)
        if not args.no_scaling:
            wide = text.replace("parallel = '2'", "parallel = '4'")
            for workers in (1, 2):
                pipeline(transport, f"{prefix}scaling.{workers}w", wide, args.events, args.rate, 0, mode="continuous", workers=workers, address=address)


if __name__ == "__main__":
    main()
