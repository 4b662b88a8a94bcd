"""A chaos run: a steady stream through a two-group stateful app on a local cluster while processes fail.
`ChaosRun(home, bootstrap, app_text).run(faults=[...], seed=1)` strikes the faults one after another and
reports events in, outputs, lost and duplicated against the in-process engine, with each fault's longest
output gap; the fault kinds are under "Fault kinds" in docs/operations/failover.md.
"""

from __future__ import annotations

import collections
import random
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sp_dagster.embedded.local_cluster import LocalCluster
from sp_dagster.messaging.skips import WRITER_HEADER

FAULTS = ("worker-kill", "worker-pause", "leader-kill")  # those every cluster can take; more need handles (below)
SERVER_FAULTS = ("broker-pause", "db-outage")
DURABLE_FAULTS = ("broker-restart",)  # a broker whose data outlives its process
BROKER_DOWN_S = 5.0  # how long a restarted broker stays away
SYMBOLS = [f"SYM{i:02d}" for i in range(20)]
OUTPUT = [("symbol", "string"), ("avgPrice", "double"), ("total", "long")]
FLOW_WAIT_S = 120.0  # the longest wait for every key's outputs after a fault before the next strikes anyway
STALLED_S = 60.0  # no new output for this long after the stream stopped: the rest is not coming (longer than any recovery)
KEYED_GROUP = "@dist(execGroup = 'average', parallel = '{}'"  # how the app's keyed group begins, rescaled by `rescale-*` and `scale-*`


class BrokerWedged(RuntimeError):
    """A run stopped by a partition the embedded broker holds (`wedge_evidence`): its defect, not the cluster's."""


@dataclass
class Fault:
    """One fault: what, on which process, when (monotonic s) and the longest output gap after it (s)."""

    kind: str
    target: str
    at: float
    gap_s: float = 0.0


@dataclass
class Report:
    """What a chaos run saw."""

    events_in: int
    outputs: int
    expected: int
    lost: int
    duplicated: int
    exact_per_key: bool
    faults: list[Fault] = field(default_factory=list)
    missing: list[tuple] = field(default_factory=list)  # a few of the lost outputs (row, event time)
    extra: list[tuple] = field(default_factory=list)  # a few of the duplicated (or wrong) ones
    live_missed: int = 0  # outputs in the topic that the reader following the stream never saw (a broker's doing)
    live_only: int = 0  # outputs that reader saw which the topic, read afresh at the end, no longer holds
    # A few of those: where the reader saw each (offset, writer token) and whether the fresh read found anything at
    # that offset (no: skipped as aborted or gone; yes: another output stands there now).
    live_only_seen: list[dict] = field(default_factory=list)

    def lines(self) -> list[dict]:
        """The report as JSON-ready dicts: one per fault, then the totals."""
        rows = [{"fault": f.kind, "target": f.target, "longest_output_gap_s": round(f.gap_s, 2)} for f in self.faults]
        totals = {k: getattr(self, k) for k in ("events_in", "outputs", "expected", "lost", "duplicated", "exact_per_key", "live_missed", "live_only")}
        samples = {k: getattr(self, k) for k in ("missing", "extra", "live_only_seen") if getattr(self, k)}
        return rows + [{"figure": "chaos", **totals, **samples}]


def _stream_transport(messaging: str, servers: str, cluster_id: str):
    """The client the stream's producer and reader use, on the cluster's messaging layer."""
    if messaging == "nats":
        from sp_dagster.messaging.nats import NatsTransport

        return NatsTransport(servers, cluster_id, timeout=15)
    from sp_dagster.messaging.kafka import KafkaTransport

    # Only critical errors: a broker restart is expected here, and "connect failed" lines would bury a failure's report.
    return KafkaTransport(servers, {"log_level": "2"}, timeout=15)


class ChaosRun:
    """A local cluster (2 managers, 2 workers) running one app on `bootstrap` (Kafka's servers, or the NATS server with
    `messaging="nats"`), and the stream through it.

        run = ChaosRun(home, bootstrap, app_text)   # 2 managers, 2 workers (LocalCluster)
        report = run.run(faults=["worker-kill", "worker-pause", "leader-kill"], seed=1)

    A producer sends keyed trades at a steady rate, and a read_committed consumer collects the app's
    outputs with their arrival times. `broker-pause` and `broker-restart` need `broker` (an EmbeddedBroker;
    for `broker-restart` one on durable storage, an EmbeddedS3's broker()); `db-outage` needs `database`,
    the handle of the server the cluster runs on (`database_url`); `broker-pause` and `db-outage` last
    `outage_s`. At the end the output topic is read afresh from its start (read_committed) and every key's
    outputs are compared with the in-process engine's over the same input; `live_missed` counts outputs the
    reader that followed the stream never saw (a broker showing a transaction after readers passed it).
    `tests/chaos/` asserts the report; `bench/chaos.py` prints it as JSON lines.
    """

    def __init__(
        self,
        home: Path,
        bootstrap: str,
        app_text: str,
        *,
        rate: int = 200,
        workers: int = 2,
        broker=None,
        database=None,
        database_url: str | None = None,
        outage_s: float = 30.0,
        messaging: str = "kafka",
        cluster_id: str = "sp-dagster",
    ):
        from sp_dagster.deploy import load_app, plan_app
        from sp_dagster.worker.instance.plan import plan_instance

        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.app_path = self.home / "app.siddhi"
        self.app_path.write_text(app_text)
        self.app_text = app_text
        declared = re.search(re.escape(KEYED_GROUP).replace(re.escape("{}"), r"(\d+)"), app_text)
        if declared is None:
            raise ValueError(f"the chaos app must declare its keyed group as {KEYED_GROUP.format('N')}")
        self.parallel = self.initial = int(declared.group(1))
        self.loaded = load_app(self.app_path)
        group = plan_app(self.loaded).group("filter")
        assert group is not None  # the chaos app's filter query has its own group
        first = group.instances[0]
        (self.entry,) = plan_instance(first.name, first.siddhi).inputs
        self.output_topic = f"{self.loaded.name}.Averages"
        self.cluster = LocalCluster(
            self.home / "cluster", bootstrap, workers=workers, managers=2, slots=4, database=database_url, messaging=messaging, cluster_id=cluster_id
        )
        self.broker, self.database, self.outage_s = broker, database, outage_s
        self._layer = (messaging, bootstrap, cluster_id)
        self.transport = self.client()
        self.rate = rate
        self.rows: list[tuple] = []
        self.stamps: list[int] = []
        self.got: list[tuple[tuple, float]] = []  # (output row, arrival time), as a reader following the stream saw them
        self.got_at: dict[tuple, tuple[int, str]] = {}  # output row -> (offset, writer token) where that reader last saw it
        self.final: list[tuple] = []  # what the output topic holds at the end, read afresh: the verdict
        self.final_offsets: set[int] = set()  # the offsets that fresh read delivered
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.harness_errors: list[str] = []  # the stream's own producer or consumer failing is not the cluster's fault
        self.final_status = ""  # `sp-dagster status` as the run ended (placements, lag, replay): for failure messages
        self.held: dict[tuple[str, int], tuple[int, dict]] = {}  # (topic, partition) -> where an open transaction holds it, its first message's headers

    def client(self):
        """A new client of the cluster's messaging layer (the caller closes it)."""
        return _stream_transport(*self._layer)

    # -- the stream --------------------------------------------------------------------------

    def _guarded(self, target, *args) -> None:
        try:
            target(*args)
        except Exception as exc:  # noqa: BLE001 - reported by run()
            self.harness_errors.append(f"{target.__name__}: {exc!r}")

    def _produce(self, seed: int) -> None:
        from sp_dagster.messaging import Partitioned, codec_for

        rng = random.Random(seed)
        publisher = self.transport.publisher(self.entry.topic, codec_for(self.entry.codec, self.entry.attributes), Partitioned(0, "symbol"))
        chunk = max(1, self.rate // 10)
        while not self._stop.is_set():
            rows = [(rng.choice(SYMBOLS), round(rng.uniform(10, 200), 2), rng.randint(1, 40)) for _ in range(chunk)]
            stamps = [1_700_000_000_000 + len(self.stamps) + i for i in range(chunk)]
            publisher.send(rows, stamps)
            publisher.flush(60)
            self.rows += rows
            self.stamps += stamps
            self._stop.wait(0.1)
        publisher.close()

    def _consume(self) -> None:
        from sp_dagster.messaging import EARLIEST, codec_for

        reader = self.transport.reader(self.output_topic, {0: EARLIEST}, codec_for("json", OUTPUT))
        try:
            while not self._consumed.is_set():
                for event in reader.poll(max_events=10_000, timeout=0.2).events:
                    row = (*event.row, event.timestamp)
                    self.got.append((row, time.monotonic()))
                    self.got_at[row] = (event.offset, (event.header(WRITER_HEADER) or b"").decode("utf-8", "replace"))
        finally:
            reader.close()

    def _read_outputs(self, timeout_s: float = 120.0) -> list[tuple]:
        """Every output the topic holds now, read afresh from its start to its end (read_committed)."""
        from sp_dagster.errors import BrokerUnavailable
        from sp_dagster.messaging import EARLIEST, codec_for

        # To the end as the broker has it now, never "until quiet": a busy broker can leave a poll empty.
        # A transaction left open (its owner dead or stuck, not yet replaced) hides that end from a
        # read_committed reader until the owner's successor starts: wait for it.
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                end = self.transport.end_offsets(self.output_topic)[0]
                break
            except BrokerUnavailable:
                if time.monotonic() > deadline:
                    raise
        reader = self.transport.reader(self.output_topic, {0: EARLIEST}, codec_for("json", OUTPUT))
        rows = []
        try:
            while reader.fetched_to().get(0, 0) < end:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not read {self.output_topic} to its end ({end}) in {timeout_s:.0f} s")
                for event in reader.poll(max_events=50_000, timeout=0.5).events:
                    rows.append((*event.row, event.timestamp))
                    self.final_offsets.add(event.offset)
        finally:
            reader.close()
        return rows

    def expected(self) -> list[tuple]:
        """What the in-process engine gives over everything produced."""
        from sp_dagster.engine import AppRuntime
        from sp_dagster.engine.clock import PlaybackClock

        out: list[tuple] = []
        with AppRuntime(self.loaded.text, clock=PlaybackClock()) as runtime:
            runtime.add_callback("AverageStream", lambda events: out.extend((*e.data, e.timestamp) for e in events if not e.is_expired))
            runtime.send("TradeStream", self.rows, self.stamps)
        return out

    # -- faults ------------------------------------------------------------------------------

    def _instances_on(self, node: str) -> list[str]:
        from sp_dagster.cluster.store.deployments import list_instances

        with self.cluster.plane() as plane:
            return [i.instance_id for i in list_instances(plane, self.loaded.name) if i.node_id == node]

    def _leader(self) -> str:
        from sp_dagster.cluster.election import current_leader

        with self.cluster.plane() as plane:
            lease = current_leader(plane)
        holder = lease.holder if lease is not None and lease.holder is not None else "manager-1"
        return "manager" if holder == "manager-1" else holder

    def _strike(self, kind: str, rng: random.Random) -> Fault:
        """Cause one fault and bring the process back; returns it (its gap is measured later)."""
        if kind == "leader-kill":
            target = self._leader()
        elif kind.startswith(("rescale-", "scale-")):
            target = "deploy"
        elif kind in SERVER_FAULTS or kind in DURABLE_FAULTS:
            target = "database" if kind == "db-outage" else "broker"
            server = getattr(self, target)
            if server is None:
                raise ValueError(f"the fault {kind!r} needs a handle on the {target} (ChaosRun(..., {target}=...))")
            if kind in DURABLE_FAULTS and server.storage.startswith("memory:"):
                raise ValueError(f"the fault {kind!r} needs a broker on durable storage (EmbeddedS3().broker())")
        else:
            busy = [w for w in self.cluster.worker_ids if self._instances_on(w)]
            target = rng.choice(busy or self.cluster.worker_ids)
        fault = Fault(kind, target, time.monotonic())
        if kind.startswith("rescale-"):
            self.parallel += 1 if kind == "rescale-up" else -1
            self.app_path.write_text(self.app_text.replace(KEYED_GROUP.format(self.initial), KEYED_GROUP.format(self.parallel)))
            self.cluster.deploy(self.app_path, timeout=240)
        elif kind.startswith("scale-"):
            self.parallel += 1 if kind == "scale-up" else -1
            self.cluster.cli("scale", self.loaded.name, "average", str(self.parallel), "--timeout", "240")
        elif kind == "broker-pause":
            server.process.send_signal(signal.SIGSTOP)
            time.sleep(self.outage_s)
            server.process.send_signal(signal.SIGCONT)
        elif kind == "broker-restart":
            server.crash()
            time.sleep(BROKER_DOWN_S)
            server.start()
        elif kind == "db-outage":
            server.stop(immediate=True)
            time.sleep(self.outage_s)
            server.start()
        elif kind == "worker-pause":
            self.cluster.signal(target, signal.SIGSTOP)
            time.sleep(12)  # past heartbeatInterval x heartbeatMaxRetry (2 s x 4)
            self.cluster.signal(target, signal.SIGCONT)
        else:
            self.cluster.kill(target)
            time.sleep(3)
            self.cluster.restart(target)
        return fault

    # -- the run -----------------------------------------------------------------------------

    def run(self, faults=FAULTS, *, seed: int = 1, settle_s: tuple[float, float] = (2.0, 6.0), drain_timeout: float = 240.0) -> Report:
        """Deploy, stream, strike each fault at a random moment once every key's outputs flow (`settle_s` later), stop
        the stream once they flow again after the last, wait for every output; the report."""
        rng = random.Random(seed)
        self._consumed = threading.Event()
        self.cluster.start()
        try:
            self.cluster.deploy(self.app_path, timeout=240)
            self._threads = [
                threading.Thread(target=self._guarded, args=(self._produce, seed), daemon=True),
                threading.Thread(target=self._guarded, args=(self._consume,), daemon=True),
            ]
            for thread in self._threads:
                thread.start()
            struck, mark = [], 0
            for kind in faults:
                self._await_flow(mark)
                time.sleep(rng.uniform(*settle_s))
                struck.append(self._strike(kind, rng))
                mark = len(self.got)
            self._await_flow(mark)
            time.sleep(settle_s[1])
            self._stop.set()
            self._threads[0].join(60)
            expected = self.expected()
            # Done when the topic, read afresh, holds as many outputs as expected; the live reader
            # only says when to look (it can skip what shows later, or see a message twice).
            # Given up sooner when the topic's committed outputs stop growing for STALLED_S: what is missing
            # then is lost (or held by a transaction nobody resolves), and waiting longer only costs time.
            deadline, looked = time.monotonic() + drain_timeout, time.monotonic()
            count, grew = -1, time.monotonic()
            while time.monotonic() < deadline and time.monotonic() - grew < STALLED_S:
                if time.monotonic() - looked > (2 if len(self.got) >= len(expected) else 10):
                    found = len(self._read_outputs())
                    if found >= len(expected):
                        break
                    count, grew = found, (time.monotonic() if found > count else grew)
                    looked = time.monotonic()
                time.sleep(0.5)
            time.sleep(3)  # anything beyond (a duplicate would come now)
            self.final = self._read_outputs()
            self.final_status = self._status()
            self._consumed.set()
            self._threads[1].join(30)
            if self.harness_errors:
                raise RuntimeError(f"the chaos stream itself failed (not the cluster): {self.harness_errors}")
        except Exception as exc:  # a deploy or fault that failed: the cluster's state and logs say why
            self.final_status = self._status()
            text = f"{exc.__class__.__name__}: {exc}\n{self.final_status}\n{self.cluster.logs()}"
            # An instance that must read its outputs to their end before it runs cannot start past a wedged partition.
            wedge = self.broker_wedge(any_topic=True)
            raise (BrokerWedged(f"{wedge}\n{text}") if wedge else RuntimeError(text)) from exc
        finally:
            self.cluster.stop()
            self.transport.close()
        return self.verdict(expected, struck)

    def _await_flow(self, mark: int, timeout_s: float = FLOW_WAIT_S) -> None:
        """Wait until every symbol has an output among those the reader got after the first `mark`: the whole
        pipeline, every partition of both groups, moves (again). After `timeout_s` the run goes on (its verdict tells)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len({row[0] for row, _at in self.got[mark:]}) < len(SYMBOLS):
            time.sleep(0.25)

    def _status(self) -> str:
        from sp_dagster.cluster.status import cluster_status, render_status

        try:
            with self.cluster.plane() as plane:
                text = render_status(cluster_status(plane))
            return text + "\n" + self._open_transactions()
        except Exception as exc:  # noqa: BLE001 - only for a failure message
            return f"(no status: {exc})"

    def _open_transactions(self) -> str:
        """Where the app's topics end for a read_committed reader and with open transactions: a
        difference is a transaction left open, which hides everything after it from every reader."""
        from sp_dagster.messaging.kafka import KafkaTransport

        if not isinstance(self.transport, KafkaTransport):
            return ""
        topics = sorted(t for t in self.transport.list_topics() if t.startswith(f"{self.loaded.name}."))
        self.held = held_transactions(self.transport, topics)
        lines = []
        for topic in topics:
            lines.append(f"{topic}: ends {self.transport.end_offsets_with_open_transactions(topic)}")
            lines += [
                f"  held from offset {start} by an open transaction; its first message's headers: {headers}"
                for (t, _p), (start, headers) in self.held.items()
                if t == topic
            ]
        return "\n".join(lines)

    def broker_wedge(self, *, any_topic: bool = False) -> str | None:
        """Why the output topic (`any_topic`: any of the app's) is held, when the broker is to blame (`wedge_evidence`); None otherwise."""
        return wedge_evidence(self.held, None if any_topic else self.output_topic, self.cluster.grep(WRITER_LINE), self.final_status)

    def verdict(self, expected: list[tuple], struck: list[Fault]) -> Report:
        """What the final read holds against `expected` (lost, duplicated, seen live only), with the faults `struck`."""
        rows = self.final
        wanted, have = collections.Counter(expected), collections.Counter(rows)
        seen_live = collections.Counter(row for row, _at in self.got)
        seen_only = seen_live - have
        live_missed, live_only = sum((have - seen_live).values()), sum(seen_only.values())
        per_key = lambda items: {s: [r for r in items if r[0] == s] for s in SYMBOLS}  # noqa: E731
        arrivals = [at for _row, at in self.got]
        for index, fault in enumerate(struck):
            end = struck[index + 1].at if index + 1 < len(struck) else (arrivals[-1] if arrivals else fault.at)
            times = [fault.at] + [t for t in arrivals if fault.at < t <= end]
            fault.gap_s = max((b - a for a, b in zip(times, times[1:])), default=0.0)
        missing, extra = wanted - have, have - wanted
        where = [(row, *self.got_at.get(row, (-1, ""))) for row in sorted(seen_only, key=lambda r: r[-1])[:20]]
        live_only_seen = [{"row": list(r), "offset": o, "writer": w, "offset_in_final": o in self.final_offsets} for r, o, w in where]
        return Report(
            len(self.rows),
            len(rows),
            len(expected),
            sum(missing.values()),
            sum(extra.values()),
            per_key(rows) == per_key(expected),
            struck,
            sorted(missing, key=lambda r: r[-1])[:20],
            sorted(extra, key=lambda r: r[-1])[:20],
            live_missed,
            live_only,
            live_only_seen,
        )


WRITER_LINE = r"^(\S+ \S+) .*transactions as '([^']+)' \(writer (\w+)\)"  # what a transactional publisher logs as it starts


def held_transactions(transport, topics) -> dict[tuple[str, int], tuple[int, dict]]:
    """(topic, partition) -> (offset, headers of the message there) for every partition of `topics` whose
    read_committed end stops before its written end: an open transaction holds what follows from every reader."""
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    held = {}
    for topic in topics:
        committed, written = transport.end_offsets(topic), transport.end_offsets_with_open_transactions(topic)
        for partition, end in written.items():
            start = committed.get(partition, 0)
            if start == end:
                continue
            settings = {"group.id": f"sp-held-{uuid.uuid4().hex[:8]}", "isolation.level": "read_uncommitted", "auto.offset.reset": "earliest"}
            consumer, headers = Consumer(transport.client_config(**settings)), {}
            try:
                consumer.assign([TopicPartition(topic, partition, start)])
                deadline = time.monotonic() + 10
                while not headers and time.monotonic() < deadline:
                    message = consumer.poll(0.5)
                    if message is not None and message.error() is None and (message.offset() or 0) >= start:
                        headers = {k: v.decode(errors="replace") if isinstance(v, bytes) else str(v or "") for k, v in message.headers() or ()}
            finally:
                consumer.close()
            held[(topic, partition)] = (start, headers)
    return held


def wedge_evidence(held: dict[tuple[str, int], tuple[int, dict]], topic: str | None, writer_lines, status: str) -> str | None:
    """Why `topic` (None: any of `held`) is held, when the embedded broker is to blame: the writer of its first held message (named by
    the publishers' start lines, `writer_lines`) was followed by a new owner of its transactional id, whose
    start resolves whatever it left open, or its instance ran to the end (`status`: `sp-dagster status`)."""
    from sp_dagster.messaging.skips import WRITER_HEADER, parse_stamp

    started = sorted((m.group(1), m.group(2), m.group(3)) for line in writer_lines if (m := re.search(WRITER_LINE, line)))
    for (held_topic, partition), (start, headers) in held.items():
        stamp = parse_stamp(headers.get(WRITER_HEADER, "").encode())
        found = [(at, name) for at, name, token in started if stamp is not None and token == stamp[0].decode()]
        if (topic is not None and held_topic != topic) or not found:
            continue
        at, name = found[0]
        succeeded = any(other == name and later > at for later, other, _token in started)
        instance = name.removeprefix("sp-dagster.")
        running = re.search(rf"^\s*{re.escape(instance)}\s+\S+\s+\d+\s+running\b", status, re.MULTILINE) is not None
        if succeeded or running:
            why = "a new owner of its id started after it (which resolves what it left open)" if succeeded else "it kept committing to the end"
            return (
                f"{held_topic}[{partition}] is held from offset {start} by a transaction of '{name}', yet {why}: the broker holds it "
                "(tansu 0.6 can wedge a partition when transactions on it end at once; bench/tansu_wedge.py shows it with plain clients)"
            )
    return None
