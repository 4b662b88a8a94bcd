"""Events/s one HTTP receiver accepts, against the raw Kafka produce rate on the same broker.

Run: python bench/http.py [--seconds S] [--concurrency 1,16,64] [--batch 1,100] [--bootstrap host:port]
Starts the embedded broker (unless --bootstrap), then measures:
  1. kafka.raw_produce: one plain confluent-kafka producer sending the receiver's message bodies
     to a 1-partition topic as fast as it can, flushed at the end: the ceiling a receiver publishes under;
  2. http.receiver: one receiver partial app (the workers' ReceiverLoop, hosted on a thread as the
     micro-batch driver hosts it; basic auth on) in front of that broker, POSTed to by a client in a
     process of its own (aiohttp, C connections, each request one event or a JSON array of B events,
     each answered 200 only once its events are in the entry topic): events/s accepted, request
     latency p50/p99 (ms), and `vs_raw_produce`, the events/s as a fraction of the raw produce rate.
Every line carries the 1-minute load average when its figure was taken. One JSON line per figure.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named like the standard library's `http` (which aiohttp imports): keep its folder off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import socket
import statistics
import time
import uuid

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer  # noqa: E402

from sp_dagster.embedded import EmbeddedBroker  # noqa: E402
from sp_dagster.messaging.kafka import KafkaTransport  # noqa: E402
from sp_dagster.siddhi import parse  # noqa: E402
from sp_dagster.topology import plan  # noqa: E402
from sp_dagster.worker.http_receiver import HostedReceiver  # noqa: E402
from sp_dagster.worker.instance_loop import LoopSettings  # noqa: E402
from sp_dagster.worker.instance_plan import plan_instance  # noqa: E402

APP = """@App:name('{name}')
@source(type='http', receiver.url='http://127.0.0.1:{port}/readings', basic.auth.enabled='true', @map(type='json'))
define stream Readings (deviceID string, roomID string, power int, at long);
@dist(execGroup='work') from Readings[power > 0] select * insert into Kept;
"""
USER, PASSWORD = "bench", "bench-secret"


def emit(figure: dict) -> None:
    print(json.dumps({**figure, "load_1m": round(os.getloadavg()[0], 2)}), flush=True)


def event(n: int) -> dict:
    return {"event": {"deviceID": f"dev{n % 64}", "roomID": f"room{n % 8}", "power": 100 + n % 50, "at": 1_700_000_000_000 + n}}


def body(n: int, batch: int) -> bytes:
    return json.dumps(event(n) if batch == 1 else [event(n + i) for i in range(batch)]).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raw_produce(bootstrap: str, seconds: float) -> float:
    """Messages/s one plain producer sends (and has acknowledged) to a fresh 1-partition topic."""
    transport = KafkaTransport(bootstrap, timeout=30)
    topic = f"bench.http.raw.{uuid.uuid4().hex[:8]}"
    transport.ensure_topic(topic, 1)
    transport.close()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "queue.buffering.max.messages": 1_000_000})
    values = [body(n, 1) for n in range(10_000)]
    sent, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for value in values:
            while True:
                try:
                    producer.produce(topic, value, partition=0)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
        sent += len(values)
    producer.flush(120)
    elapsed = time.perf_counter() - start
    emit({"bench": "kafka.raw_produce", "messages": sent, "seconds": round(elapsed, 2), "events_per_s": round(sent / elapsed)})
    return sent / elapsed


def client(url: str, concurrency: int, batch: int, seconds: float, out) -> None:
    """The load generator (its own process): `concurrency` connections POSTing for `seconds`."""
    import aiohttp

    async def main():
        latencies, failures = [], 0
        auth = aiohttp.BasicAuth(USER, PASSWORD)
        deadline = time.perf_counter() + seconds
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

            async def worker(offset: int):
                nonlocal failures
                n = offset
                while time.perf_counter() < deadline:
                    start = time.perf_counter()
                    async with session.post(url, data=body(n, batch), auth=auth, headers={"Content-Type": "application/json"}) as response:
                        await response.read()
                        if response.status == 200:
                            latencies.append((time.perf_counter() - start) * 1000)
                        else:
                            failures += 1
                    n += concurrency * batch

            start = time.perf_counter()
            await asyncio.gather(*(worker(i * batch) for i in range(concurrency)))
            return latencies, failures, time.perf_counter() - start

    out.put(asyncio.run(main()))


def receiver_run(bootstrap: str, concurrency: int, batch: int, seconds: float, raw_rate: float) -> None:
    """One receiver, loaded by a client process; prints its figure."""
    name = f"BenchHttp{uuid.uuid4().hex[:6]}"
    port = free_port()
    topology = plan(parse(APP.format(name=name, port=port)))
    transport = KafkaTransport(bootstrap, timeout=30)
    for topic in topology.topics:
        transport.ensure_topic(topic.name, topic.partitions)
    instance = next(i for g in topology.groups if g.receiver for i in g.instances)
    settings = LoopSettings(None, metrics_interval_s=0.5, idle_wait_s=0.05)
    receiver = HostedReceiver(plan_instance(instance.name, instance.siddhi), transport, settings, users={USER: PASSWORD}, own_transport=True).start()
    try:
        results = multiprocessing.get_context("spawn").Queue()
        load = multiprocessing.get_context("spawn").Process(target=client, args=(f"http://127.0.0.1:{port}/readings", concurrency, batch, seconds, results))
        load.start()
        latencies, failures, elapsed = results.get(timeout=seconds + 120)
        load.join(30)
    finally:
        receiver.stop()
    events = len(latencies) * batch
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) >= 2 else [0.0] * 99
    emit(
        {
            "bench": "http.receiver",
            "concurrency": concurrency,
            "events_per_request": batch,
            "requests": len(latencies),
            "failed": failures,
            "seconds": round(elapsed, 2),
            "requests_per_s": round(len(latencies) / elapsed),
            "events_per_s": round(events / elapsed),
            "latency_ms_p50": round(quantiles[49], 2),
            "latency_ms_p99": round(quantiles[98], 2),
            "vs_raw_produce": round(events / elapsed / raw_rate, 3),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each figure runs")
    parser.add_argument("--concurrency", default="1,16,64", help="client connections, one figure each")
    parser.add_argument("--batch", default="1,100", help="events per request, one figure each")
    parser.add_argument("--bootstrap", help="an existing Kafka broker (default: start the embedded one)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(EmbeddedBroker()).bootstrap_servers
        raw_rate = raw_produce(bootstrap, args.seconds)
        for batch in (int(b) for b in args.batch.split(",")):
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                receiver_run(bootstrap, concurrency, batch, args.seconds, raw_rate)


if __name__ == "__main__":
    main()
