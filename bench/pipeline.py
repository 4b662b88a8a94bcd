"""End-to-end throughput and latency of a deployed app, beside a raw passthrough and a raw chain on the same broker.

Run: python bench/pipeline.py [--events N] [--rate R] [--seconds S] [--modes continuous,microbatch] [--no-scaling]
                              [--messaging kafka|nats] [--broker-profile auto|kafka|tansu]
Starts the embedded broker, then measures, in one run:
  1. passthrough: a plain consume-and-produce loop (one thread of this process, confluent-kafka)
     between two topics: the floor any pipeline on this broker pays for one hop;
  2. chain: the app's shape with nothing in it: bench.chain.in -> bench.chain.mid -> bench.chain.out,
     2 partitions each, one process per partition per hop (4 processes, spawned before measuring),
     each a confluent-kafka consumer assigned its one partition (no group) that forwards every
     message's bytes untouched (value, key, partition, timestamp) to the next topic with a plain
     producer (linger.ms 5, acks all), flushing after each poll: the floor for two hops at parallel 2;
  3. app.<mode>: tests' two-group app (filter, parallel 2 -> partitioned length-window average,
     parallel 2) deployed on a local cluster (a manager, two Spark workers, SQLite), once per
     execution mode (continuous tasks with transactions, and without: at-least-once; micro-batch queries);
  4. scaling.<n>w: the same app with both groups at parallel 4 (4-partition topics), on one
     worker and then on two (continuous mode; throughput only).
With --messaging nats the groups are wired through an embedded nats-server (JetStream) instead
(the passthrough and the chain stay on Kafka: the floor figures). For each: events/s with every
event published at once, and latency p50/p99 (ms from an event's publication to the output it
causes) at a paced rate. Beside an app's figures, `vs_passthrough` and `vs_chain` are its events/s
as a fraction of the passthrough's and the chain's in the same run, and `p99_vs_chain` its p99
latency over the chain's. `cpu_us_per_event_per_hop` (chain and apps, throughput figures) is the
CPU time (user + system, from /proc) used from just before publishing until the last output
arrived, divided by the events and by the 2 hops: for the chain by its 4 processes, for an app by
the cluster's worker processes and all their descendants (Spark's JVM and its Python workers; the
manager and this process are not counted). One JSON line per figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_NOT_AVAILABLE, Consumer, Producer, TopicPartition  # noqa: E402

from sp_dagster.deploy import load_app, plan_app  # noqa: E402
from sp_dagster.embedded import EmbeddedBroker  # noqa: E402
from sp_dagster.embedded.local_cluster import LocalCluster  # noqa: E402
from sp_dagster.messaging import EARLIEST, LATEST, Partitioned, RowPublisher, codec_for  # noqa: E402
from sp_dagster.messaging.kafka import KafkaTransport  # noqa: E402
from sp_dagster.worker.instance.plan import plan_instance  # noqa: E402

APP = ROOT / "tests" / "worker" / "apps" / "trades.siddhi"
INPUT = [("symbol", "string"), ("price", "double"), ("volume", "long")]
OUTPUT = [("symbol", "string"), ("avgPrice", "double"), ("total", "long")]
SYMBOLS = [f"SYM{i:02d}" for i in range(50)]
HOPS = 2  # the app's (and the chain's) hops from input topic to output topic
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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
CHAIN: dict[str, float] = {}  # the chain's events/s and p99 latency (ms) in this run
PEERS = ("passthrough", "chain")  # the raw figures, beside which the apps' are given


def chain_hop(config: dict, source: str, sink: str, partition: int, ready, stop) -> None:
    """One hop of the chain, in a process of its own: forwards `source`'s `partition` to the same
    partition of `sink`, bytes untouched, until `stop` is set; sets `ready` once connected."""
    consumer = Consumer(
        {
            **config,
            "group.id": f"bench-chain-{source}-{partition}",  # never joined: the partition is assigned
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "fetch.wait.max.ms": 20,
        }
    )
    consumer.assign([TopicPartition(source, partition, OFFSET_BEGINNING)])
    producer = Producer({**config, "linger.ms": 5, "acks": "all"})
    consumer.get_watermark_offsets(TopicPartition(source, partition), timeout=30)  # connected to the broker
    producer.list_topics(sink, timeout=30)
    ready.set()
    while not stop.is_set():
        # Wait for the first message only, then take what has already arrived (as the transport's reader does).
        first = consumer.poll(0.1)
        messages = [] if first is None else [first, *consumer.consume(num_messages=10_000, timeout=0)]
        forwarded = 0
        for message in messages:
            if message.error() is not None:
                continue
            kind, timestamp = message.timestamp()
            while True:
                try:
                    producer.produce(
                        sink,
                        value=message.value(),
                        key=message.key(),
                        partition=partition,
                        timestamp=timestamp if kind != TIMESTAMP_NOT_AVAILABLE else 0,
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            forwarded += 1
        if forwarded and producer.flush(60):
            raise RuntimeError(f"the broker did not acknowledge every event forwarded to {sink}")
    consumer.close()
    producer.flush(10)


def chain(transport, events: int, rate: float, seconds: float) -> None:
    """Raw consume -> produce processes with the app's hops and partitions: its floor."""
    topics = ["bench.chain.in", "bench.chain.mid", "bench.chain.out"]
    for topic in topics:
        transport.ensure_topic(topic, 2)
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    hops = []
    try:
        for hop, (source, sink) in enumerate(zip(topics, topics[1:]), 1):
            for partition in range(2):
                ready = context.Event()
                process = context.Process(
                    target=chain_hop,
                    args=(transport.client_config(), source, sink, partition, ready, stop),
                    name=f"chain-hop{hop}-p{partition}",
                    daemon=True,
                )
                process.start()
                hops.append((process, ready))
        for process, ready in hops:
            if not ready.wait(120):
                raise RuntimeError(f"{process.name} did not start (exit code {process.exitcode})")
        codec = codec_for("binary", INPUT)
        measure("chain", transport, topics[0], topics[-1], codec, codec, events, events, rate, seconds, pids=[p.pid for p, _ in hops])
    finally:
        stop.set()
        for process, _ in hops:
            process.join(15)
            if process.is_alive():
                process.terminate()
                process.join(5)


def _proc_stat(pid: str) -> tuple[int, float] | None:
    """A process's parent pid and CPU seconds (user + system, its own and its reaped children's), or None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ... utime at 11
    return int(fields[1]), sum(int(f) for f in fields[11:15]) / CLOCK_TICKS  # utime stime cutime cstime


def tree_cpu(roots: Sequence[int]) -> float:
    """CPU seconds used so far by the processes `roots` and all their descendants (found through
    /proc/*/stat's parent links); a descendant that ended counts in its parent's reaped children."""
    stats = {int(e.name): s for e in os.scandir("/proc") if e.name.isdigit() and (s := _proc_stat(e.name)) is not None}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo, seen = 0.0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        total += stats[pid][1]
        todo.extend(children.get(pid, ()))
    return total


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


def measure(name, transport, source, sink, in_codec, out_codec, events, expected_out, rate, seconds, *, pids: Sequence[int] = (), paced=None) -> None:
    """Throughput (all at once) then, when `seconds`, latency (paced) from `source` to `sink`;
    with `pids`, the CPU time of those processes' trees during the throughput run too; `paced()`
    is called as the paced run ends."""
    info = transport.require_topic(sink)
    publisher = load_publisher(transport, source, in_codec)
    collector = Collector(transport, sink, out_codec, info.partitions)
    collector.start()
    data = rows(events)
    cpu_before = tree_cpu(pids) if pids else 0.0
    started = publish_all(publisher, data)
    done = collector.wait_for(expected_out, timeout=600)
    cpu = tree_cpu(pids) - cpu_before if pids else None
    elapsed = collector.last_at - started
    per_s = round(events / elapsed) if elapsed > 0 else None
    if name == "passthrough" and per_s:
        FLOOR["events_per_s"] = per_s
    if name == "chain" and per_s:
        CHAIN["events_per_s"] = per_s
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
    if name not in PEERS and per_s and "events_per_s" in CHAIN:
        figure["vs_chain"] = round(per_s / CHAIN["events_per_s"], 3)
    if cpu is not None:
        figure["cpu_us_per_event_per_hop"] = round(cpu * 1e6 / events / HOPS, 1)
    emit(figure)
    if not seconds:
        collector.stop_flag.set()
        collector.join(5)
        return
    collector.latencies.clear()
    before = collector.count
    data = rows(int(rate * seconds), seed=4)
    publish_all(publisher, data, paced_rate=rate)
    if paced is not None:
        paced()
    time.sleep(5)
    collector.stop_flag.set()
    collector.join(5)
    lat = sorted(collector.latencies)
    if lat:
        p99 = round(lat[int(0.99 * (len(lat) - 1))], 1)
        figure = {
            "bench": f"pipeline.{name}.latency",
            "rate_per_s": rate,
            "events": len(data),
            "outputs": collector.count - before,
            "p50_ms": round(statistics.median(lat), 1),
            "p99_ms": p99,
        }
        if name == "chain":
            CHAIN["p99_ms"] = p99
        if name not in PEERS and CHAIN.get("p99_ms"):
            figure["p99_vs_chain"] = round(p99 / CHAIN["p99_ms"], 2)
        emit(figure)


def turns(cluster: LocalCluster, name: str, app: str) -> None:
    """Emit each instance's last reported turn (ms per phase, and its p50/p99 from poll to acknowledgement)."""
    from sp_dagster.cluster.store.deployments import list_instances

    plane = cluster.plane()
    try:
        for instance in list_instances(plane, app):
            m = instance.metrics
            if m.get("turn_ms"):
                emit(
                    {
                        "bench": f"pipeline.{name}.turn",
                        "instance": instance.instance_id,
                        "turn_ms": m["turn_ms"],
                        "p50_ms": m.get("latency_ms_p50"),
                        "p99_ms": m.get("latency_ms_p99"),
                    }
                )
    finally:
        plane.close()


def pipeline(
    transport, name: str, text: str, events: int, rate: float, seconds: float, *, mode: str, workers: int = 2, address: str | None = None, profile: str = "auto"
) -> None:
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
            broker_profile=profile,
            **layer,
        ).start()
        try:
            cluster.deploy(path, timeout=300)
            first = topology.group("filter").instances[0]
            (entry,) = plan_instance(first.name, first.siddhi).inputs
            in_codec = codec_for(entry.codec, entry.attributes)
            # volume >= 10 always holds here, so every input gives one output
            out = f"{loaded.name}.Averages"
            workers_pids = [cluster.processes[w].pid for w in cluster.worker_ids]  # each with its JVM and Python workers below
            measure(
                name,
                transport,
                entry.topic,
                out,
                in_codec,
                codec_for("json", OUTPUT),
                events,
                events,
                rate,
                seconds,
                pids=workers_pids,
                paced=lambda: turns(cluster, name, loaded.name),
            )
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
    parser.add_argument(
        "--broker-profile", choices=("auto", "kafka", "tansu"), default="auto", help="the workers' deployment.config.brokerProfile (kafka: no second reads)"
    )
    args = parser.parse_args()
    text = APP.read_text()
    with EmbeddedBroker() as broker, contextlib.ExitStack() as stack:
        transport = KafkaTransport(broker.bootstrap_servers, timeout=30)
        passthrough(transport, args.events, args.rate, args.seconds)
        chain(transport, args.events, args.rate, args.seconds)
        address, prefix = None, ""
        if args.messaging == "nats":
            from sp_dagster.embedded import EmbeddedNatsServer
            from sp_dagster.messaging.nats import NatsTransport

            server = stack.enter_context(EmbeddedNatsServer(store_dir=Path(stack.enter_context(tempfile.TemporaryDirectory()))))
            transport, address, prefix = NatsTransport(server.url, "bench", timeout=30), server.url, "nats."
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            pipeline(transport, f"{prefix}app.{mode}", text, args.events, args.rate, args.seconds, mode=mode, address=address, profile=args.broker_profile)
        if not args.no_scaling:
            wide = text.replace("parallel = '2'", "parallel = '4'")
            for workers in (1, 2):
                pipeline(transport, f"{prefix}scaling.{workers}w", wide, args.events, args.rate, 0, mode="continuous", workers=workers, address=address)


if __name__ == "__main__":
    main()
