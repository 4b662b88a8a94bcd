"""Events/s one HTTP receiver accepts, against the raw Kafka produce rate on the same broker.

Run: python bench/receiver.py [--seconds S] [--concurrency 1,16,64] [--batch 1,100] [--clients P] [--bootstrap host:port]
Starts the embedded broker (unless --bootstrap), then measures:
  1. kafka.raw_produce: one plain confluent-kafka producer sending the receiver's message bodies
     to a 1-partition topic as fast as it can, flushed at the end: the ceiling a receiver publishes under;
  2. http.receiver: one receiver partial app (the workers' ReceiverLoop, hosted on a thread as the
     micro-batch driver hosts it; basic auth on) in front of that broker, POSTed to by P client
     processes (C keep-alive connections in all, one request in flight on each, each request one
     event or a JSON array of B events, each answered 200 only once its events are in the entry
     topic): events/s accepted, request latency p50/p99 (ms), and `vs_raw_produce`, the events/s
     as a fraction of the raw produce rate. The entry topic is checked to hold at least the events
     accepted (`in_topic`).
The client is a minimal HTTP/1.1 client on asyncio (uvloop when installed) so that it costs little;
each figure says what each side cost: `cpu_receiver`, `cpu_clients`, `cpu_broker` are CPU seconds
per second of the run (1.0 = one core busy; this process hosts the receiver and does nothing else
meanwhile), and `receiver_us_per_event` the receiver's CPU per event accepted (what the figure
would be on a core of its own: 1e6 / it). Every line carries the 1-minute load average when its figure was taken. One JSON
line per figure.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import multiprocessing
import os
import resource
import socket
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer  # noqa: E402

from sp_dagster.config.model import MessagingSettings  # noqa: E402
from sp_dagster.embedded import EmbeddedBroker  # noqa: E402
from sp_dagster.messaging.kafka import KafkaTransport  # noqa: E402
from sp_dagster.siddhi import parse  # noqa: E402
from sp_dagster.topology import plan  # noqa: E402
from sp_dagster.worker.instance.loop import LoopSettings  # noqa: E402
from sp_dagster.worker.instance.plan import plan_instance  # noqa: E402
from sp_dagster.worker.receivers.http import HostedReceiver  # noqa: E402

APP = """@App:name('{name}')
@source(type='http', receiver.url='http://127.0.0.1:{port}/readings', basic.auth.enabled='true', worker.count='{workers}', @map(type='json'))
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


def cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds (user + system) this process, or process `pid`, has used."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection of the load generator: a request, its whole answer, the next."""

    def __init__(self):
        self.buffer = bytearray()
        self.answer: asyncio.Future | None = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        length = 0
        for line in bytes(self.buffer[:end]).split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(self.buffer) < end + 4 + length:
            return
        status = int(self.buffer[9:12])
        del self.buffer[: end + 4 + length]
        if self.answer is not None and not self.answer.done():
            self.answer.set_result(status)

    def connection_lost(self, exc) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(ConnectionError("the receiver closed the connection"))


def client(port: int, connections: int, batch: int, seconds: float, first: int, start_at: float, out) -> None:
    """One load-generating process: `connections` keep-alive connections POSTing until `start_at + seconds`."""
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    authorization = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

    def request(n: int) -> bytes:
        content = body(n, batch)
        head = (
            f"POST /readings HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Basic {authorization}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(content)}\r\n\r\n"
        )
        return head.encode() + content

    async def main():
        loop = asyncio.get_running_loop()
        latencies: list[float] = []
        failures = 0
        pool = [request(first + n * batch) for n in range(max(64, connections * 4))]
        opened = [await loop.create_connection(_Connection, "127.0.0.1", port) for _ in range(connections)]
        await asyncio.sleep(max(0.0, start_at - time.time()))
        deadline = time.perf_counter() + seconds

        async def drive(index: int, transport, connection: _Connection):
            nonlocal failures
            n = index
            while time.perf_counter() < deadline:
                connection.answer = loop.create_future()
                start = time.perf_counter()
                transport.write(pool[n % len(pool)])
                status = await connection.answer
                if status == 200:
                    latencies.append((time.perf_counter() - start) * 1000)
                else:
                    failures += 1
                n += connections
            transport.close()

        cpu, start = cpu_seconds(), time.perf_counter()
        await asyncio.gather(*(drive(i, t, c) for i, (t, c) in enumerate(opened)))
        return latencies, failures, time.perf_counter() - start, cpu_seconds() - cpu

    out.put(asyncio.run(main()))


def receiver_run(bootstrap: str, concurrency: int, batch: int, seconds: float, raw_rate: float, clients: int, broker_pid: int | None, workers: int = 1) -> None:
    """One receiver (with worker.count `workers`), loaded by client processes; prints its figure."""
    name = f"BenchHttp{uuid.uuid4().hex[:6]}"
    port = free_port()
    topology = plan(parse(APP.format(name=name, port=port, workers=workers)))
    transport = KafkaTransport(bootstrap, timeout=30)
    for topic in topology.topics:
        transport.ensure_topic(topic.name, topic.partitions)
    instance = next(i for g in topology.groups if g.receiver for i in g.instances)
    instance_plan = plan_instance(instance.name, instance.siddhi)
    settings = LoopSettings(None, metrics_interval_s=0.5, idle_wait_s=0.05)
    messaging = MessagingSettings("kafka", tuple(bootstrap.split(",")))
    receiver = HostedReceiver(instance_plan, transport, settings, users={USER: PASSWORD}, messaging=messaging).start()
    helpers = receiver.loop.helper_pids
    receiver_cpu = lambda: cpu_seconds() + sum(cpu_seconds(pid) for pid in helpers)  # noqa: E731
    processes = min(clients, concurrency)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    start_at = time.time() + 3.0  # every client connected and ready by then
    loads = [
        context.Process(target=client, args=(port, concurrency // processes + (p < concurrency % processes), batch, seconds, p * 10_000_000, start_at, results))
        for p in range(processes)
    ]
    try:
        for load in loads:
            load.start()
        time.sleep(max(0.0, start_at - time.time()))
        cpu, broker_cpu = receiver_cpu(), cpu_seconds(broker_pid) if broker_pid else None
        answers = [results.get(timeout=seconds + 120) for _ in loads]
        cpu, broker_cpu = receiver_cpu() - cpu, cpu_seconds(broker_pid) - broker_cpu if broker_pid else None
        for load in loads:
            load.join(30)
    finally:
        receiver.stop()
    latencies = [latency for answer in answers for latency in answer[0]]
    failures = sum(answer[1] for answer in answers)
    elapsed = max(answer[2] for answer in answers)
    events = len(latencies) * batch
    in_topic = sum(sum(transport.end_offsets(output.topic).values()) for output in instance_plan.outputs)
    transport.close()
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) >= 2 else [0.0] * 99
    emit(
        {
            "bench": "http.receiver",
            "concurrency": concurrency,
            "receiver_processes": workers,
            "client_processes": processes,
            "events_per_request": batch,
            "requests": len(latencies),
            "failed": failures,
            "seconds": round(elapsed, 2),
            "requests_per_s": round(len(latencies) / elapsed),
            "events_per_s": round(events / elapsed),
            "latency_ms_p50": round(quantiles[49], 2),
            "latency_ms_p99": round(quantiles[98], 2),
            "vs_raw_produce": round(events / elapsed / raw_rate, 3),
            "in_topic": in_topic,
            "cpu_receiver": round(cpu / elapsed, 2),
            "receiver_us_per_event": round(cpu / events * 1e6, 1) if events else None,
            "cpu_clients": round(sum(answer[3] for answer in answers) / elapsed, 2),
            "cpu_broker": round(broker_cpu / elapsed, 2) if broker_cpu is not None else None,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each figure runs")
    parser.add_argument("--concurrency", default="1,16,64", help="client connections, one figure each")
    parser.add_argument("--batch", default="1,100", help="events per request, one figure each")
    parser.add_argument("--clients", type=int, default=1, help="client processes the connections are spread over")
    parser.add_argument("--raw-seconds", type=float, help="how long the raw produce figure runs (default: --seconds)")
    parser.add_argument("--bootstrap", help="an existing Kafka broker (default: start the embedded one)")
    parser.add_argument("--workers", default="1", help="the receiver's worker.count (processes serving its URL), one figure each")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        broker = None if args.bootstrap else stack.enter_context(EmbeddedBroker())
        bootstrap = args.bootstrap or broker.bootstrap_servers
        broker_pid = broker.process.pid if broker is not None and broker.process is not None else None
        raw_rate = raw_produce(bootstrap, args.raw_seconds or args.seconds)
        for workers in (int(w) for w in args.workers.split(",")):
            for batch in (int(b) for b in args.batch.split(",")):
                for concurrency in (int(c) for c in args.concurrency.split(",")):
                    receiver_run(bootstrap, concurrency, batch, args.seconds, raw_rate, args.clients, broker_pid, workers)


if __name__ == "__main__":
    main()
