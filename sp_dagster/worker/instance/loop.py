"""One partial-app instance run continuously: read its partitions -> engine -> publish, as events come.
This is what a worker's long-running Spark task runs (`spark/continuous.py` is the Spark side), but
it knows nothing of Spark, so it also runs, and is tested, in a plain thread. Its turns, checkpoints
and lease are described in docs/concepts/workers.md (Continuous mode, inside a task).
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

from sp_dagster.errors import MessagingError
from sp_dagster.messaging.codecs import RawCodec
from sp_dagster.messaging.transport import EARLIEST, Reader, Transport
from sp_dagster.wording import counted
from sp_dagster.worker.instance.batching import batched_inputs, batched_outputs, expand, pack
from sp_dagster.worker.instance.checkpoints import Checkpoint, resume, topic_incarnations
from sp_dagster.worker.instance.connections import Connections
from sp_dagster.worker.instance.exactly_once import ExactlyOnce, FeedOffsets
from sp_dagster.worker.instance.plan import InstancePlan
from sp_dagster.worker.instance.runtime import ORIGIN_HEADER, InstanceRuntime, Message
from sp_dagster.worker.instance.sinks import HttpSinks
from sp_dagster.worker.instance.stuck import StuckWatch

log = logging.getLogger(__name__)

_LATENCY_WINDOW = 4096
PHASES = ("read", "engine", "produce", "commit")  # a turn with input, in order (metrics' turn_ms)
BATCHES_PER_EVENTS = 50  # a poll takes max_events messages, or this many times fewer batches
DRAIN_TIMEOUT_S = 20.0  # within the driver's wait for a stopping task (continuous.STOP_TIMEOUT_S)


class Control(Protocol):
    """The loop's line to whoever runs it (the worker's driver, or a test)."""

    def commands(self) -> list[tuple]:
        """Commands received since the last call: ("stop", save), ("checkpoint",)."""
        ...

    def lease_ok(self) -> bool:
        """False once the worker's claim on this instance may have lapsed: stop now."""
        ...

    def lease_left(self) -> float:
        """Seconds the claim still runs: no broker call waits much past it."""
        ...

    def checkpoint(self, data: bytes) -> None:
        """Keep this checkpoint (it supersedes earlier ones)."""

    def metrics(self, values: dict) -> None:
        """The instance's current metrics."""


@dataclass(frozen=True)
class LoopSettings:
    """How an instance's loop runs."""

    dead_letter_topic: str | None = None
    transactions: bool = True  # exactly-once through Kafka transactions where the messaging layer has them
    checkpoint_interval_s: float = 5.0
    metrics_interval_s: float = 1.0
    max_events: int = 5_000  # messages taken per poll
    idle_wait_s: float = 0.2  # the longest a poll waits when nothing is due
    flush_timeout_s: float = 60.0
    receiver_users: tuple = ()  # (username, password) pairs HTTP receivers with basic auth accept
    receiver_tls: tuple[str, str] | None = None  # (certificate, key) PEM files of https:// receivers
    # The broker aborts a transaction left open this long (the worker's fence window): a cut-off
    # owner's open transaction then stops hiding later outputs of its partitions from every reader.
    abandoned_after_s: float | None = None


@dataclass
class _Stats:
    rows_in_total: int = 0
    rows_out_total: int = 0
    replayed: int = 0
    latencies: list[tuple[float, int]] = field(default_factory=list)  # (ms, messages) per turn, since the last report
    window_start: float = field(default_factory=time.monotonic)
    window_in: int = 0
    window_waited_s: float = 0.0  # time the window's polls spent waiting for input
    window_turns: int = 0  # turns with input since the last report
    window_phases: list[float] = field(default_factory=lambda: [0.0] * len(PHASES))  # their seconds per phase


def _percentile(samples: list[tuple[float, int]], fraction: float) -> float | None:
    """The weighted percentile of (value, weight) samples."""
    total = sum(weight for _value, weight in samples)
    if not total:
        return None
    target, seen = fraction * total, 0
    for value, weight in sorted(samples):
        seen += weight
        if seen >= target:
            return round(value, 2)
    return round(samples[-1][0], 2)


class InstanceLoop:
    """Runs one instance until stopped.

        loop = InstanceLoop(plan, transport, LoopSettings(...), checkpoint=blob_or_None, control=control)
        loop.run()   # until the control says stop, or its lease runs out

    Each turn polls every input (waiting at most until the engine's next timer), sends the messages
    through `InstanceRuntime` (one engine send per message, origins named as in micro-batch mode),
    publishes the outputs and waits for the broker's acknowledgement. With no input, wall-clock
    timers fire on time (`advance`). Every `checkpoint_interval_s` (and when asked, and when told to
    stop with save) the loop hands the control a *checkpoint*: the engine snapshot together with the
    input offsets it covers, taken after the outputs of those inputs were acknowledged. Restored, a
    checkpoint resumes the engine and re-reads from its offsets; what the instance publishes again
    carries the same origins, so the next group drops it (`InstanceRuntime`); with transactions, what its
    predecessor committed is run again without publishing, and a stateless instance that only feeds other
    groups starts at the offsets its predecessor committed (`exactly_once.py`). A checkpoint whose
    offsets belong to other incarnations of the topics, or whose state does not fit the partial
    app, is not resumed silently (`checkpoints.py`).

    The loop stops at once, without a checkpoint, when its lease runs out: the worker renews the
    lease while its own heartbeat holds, so an instance never outlives its worker's claim on it."""

    def __init__(
        self, plan: InstancePlan, transport: Transport, settings: LoopSettings, *, checkpoint: bytes | None, control: Control, transports: dict | None = None
    ):
        self.plan = plan
        self.transport = transport
        self.settings = settings
        self.control = control
        self.connections = Connections(plan, transport, transports)
        self.runtime = self._new_runtime()
        self.http_sinks = HttpSinks(plan.http_outputs, plan.name) if plan.http_outputs else None
        self.positions: dict[tuple[str, int], int] = {}
        self._start_checkpoint = checkpoint  # restored in _open(), once the topics it read are checked
        self.incarnations: dict[str, str] = {}  # input topic -> its incarnation (checkpoints.py)
        self.state_note: str | None = None  # what the user should know about the state it started with
        self._set_aside: str | None = None
        self._fresh = False  # start empty at the committed offsets (see _resume)
        self.readers: list[tuple[str, Reader]] = []
        self.exactly_once: ExactlyOnce | None = None  # transactions, when asked for and the layer has them
        self.feed: FeedOffsets | None = None  # or, feeding other groups only, offsets committed without them
        self._claim_ended = False  # stopping because another owner takes over: its open transaction is left to that owner
        self._marks: dict[tuple[str, int], int] = {}  # where the outputs ended: kept in checkpoints (leaked_outputs.py)
        self._batched_in, self._batched_out = batched_inputs(plan), batched_outputs(plan)
        self.stats = _Stats()
        self.draining = False  # read the inputs to their end before the last checkpoint (a rescale)
        self._last_checkpoint = self._last_metrics = time.monotonic()

    def _new_runtime(self) -> InstanceRuntime:
        return InstanceRuntime(self.plan, self.settings.dead_letter_topic, now=_now_ms(), partitions_of=self.connections.output_partitions)

    def _resume(self) -> None:
        """Restore the start checkpoint when it fits the input topics and the app (checkpoints.py); else start empty, and say so."""
        data, self._start_checkpoint = self._start_checkpoint, None
        for source in self.plan.inputs:
            self.incarnations.update(topic_incarnations(self.connections.of(source.bootstrap, source.properties), [source.topic]))
        clusters = {s.topic: self.connections.of(s.bootstrap, s.properties) for s in self.plan.inputs}
        ends = lambda topic: clusters[topic].end_offsets(topic)  # noqa: E731
        resumed = resume(self.runtime, data, self.incarnations, ends, fresh_since=self.plan.extras.get("fresh_since"))
        if resumed.set_aside and resumed.restored:  # a restore that failed half-way: start from a clean engine
            self.runtime.close()
            self.runtime = self._new_runtime()
        self.positions, self.state_note, self._set_aside = dict(resumed.positions), resumed.note, resumed.set_aside
        # Asked to start empty (deploy --fresh, undeploy --drop-state) and no checkpoint since: from the committed offsets on.
        self._fresh = bool(self.plan.extras.get("fresh_since")) and not resumed.restored
        self._marks = resumed.marks
        if self.state_note:
            log.warning("%s: %s", self.plan.name, self.state_note)
        elif resumed.positions:
            log.info("%s: resumed from a checkpoint of %s", self.plan.name, counted(len(self.positions), "input partition"))

    def _open(self) -> None:
        self._resume()
        raw = RawCodec()
        read = [(source, self.connections.partitions_read(source)) for source in self.plan.inputs]  # (input, the partitions this instance reads of it)
        if self.settings.transactions:
            cluster_inputs = [(s.topic, p) for s, partitions in read if not s.bootstrap and not s.nats for p in partitions]
            if self.plan.feeds_groups_only:
                self._keep_offsets(cluster_inputs)
            else:
                self._start_transactions(cluster_inputs, [(s.topic, p) for s, partitions in read for p in partitions])
        for source, partitions in read:
            transport = self.connections.of_source(source)
            first = EARLIEST if source.start is None else source.start
            start = {p: self.positions.get((source.topic, p), first) for p in partitions}
            self.readers.append((source.topic, transport.reader(source.topic, start, raw)))
        for output in self.plan.outputs:
            if output.nats is not None:  # a missing topic is made, as NATS Streaming makes a channel on first use
                for topic in {output.topic, *output.topics}:
                    self.connections.of(None, nats=output.nats).ensure_topic(topic, 1)
        own = self.plan.cluster_output_topics
        if own:  # connected, with the topics' layout, before the first turn: a burst right after a start does not wait for it
            self.connections.publisher(own[0]).prepare(own)

    def _start_transactions(self, inputs: list[tuple[str, int]], read: list[tuple[str, int]]) -> None:
        """Publish in transactions with the offsets of `inputs` (this cluster's (topic, partition)s read,
        of all those `read`); replay silently up to what the last owner committed (start there, when fresh)."""
        eo = ExactlyOnce.start(self.plan, self.transport, self.settings.abandoned_after_s, self.control.lease_left, self.incarnations, inputs)
        if eo is None:
            return
        self.exactly_once = eo
        self.connections.use_own(eo.publisher)
        self.positions.update(eo.take_over(inputs, self.positions, fresh=self._fresh))
        runtime = self.runtime
        eo.find_leaked(self.transport, self._marks, inputs, read, runtime.group, self.plan.stateless, runtime.clock_origin, _now_ms())

    def _keep_offsets(self, inputs: list[tuple[str, int]]) -> None:
        """Commit the offsets of `inputs` (this cluster's) after each turn, without transactions; start past
        the checkpoint's where the last owner committed further."""
        self.feed = FeedOffsets.start(self.plan, self.transport, self.incarnations, inputs)
        if self.feed is not None:
            self.positions.update(self.feed.take_over(inputs, self.positions))

    @property
    def delivery(self) -> str:
        """exactly-once (transactions), exactly-once by origin (no transactions needed: the next group drops
        replays, and a successor starts at the committed offsets) or at-least-once (origins let the next
        group drop replays; a successor starts at the checkpoint)."""
        if self.exactly_once is not None:
            return "exactly-once"
        return "exactly-once by origin" if self.feed is not None else "at-least-once"

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> str:
        """Loop until told to stop (or the lease runs out); returns why it stopped."""
        gc.freeze()  # what exists now lives as long as the loop: keep it out of every collection
        self._open()
        self.control.metrics(self.metrics())  # at once: a state reset is told before the first turn
        if self.exactly_once is not None and not self._marks:
            self._checkpoint()  # output marks from the start: a successor finds what a first open transaction let through
        watch = StuckWatch(self.plan.name)
        try:
            while True:
                watch.beat()
                save, asked = None, False
                for command in self.control.commands():
                    if command[0] == "stop":
                        save = bool(command[1])
                    elif command[0] == "checkpoint":
                        asked = True
                    elif command[0] == "drain":
                        self.draining = True
                if save is not None:
                    if save and self.draining:
                        self.drain()
                    if save:
                        self._checkpoint()
                    self._claim_ended = not save  # a fenced worker's stop: another owner takes over
                    return "stopped"
                if not self.control.lease_ok():
                    return self._lease_lost()
                try:
                    self.turn()
                except MessagingError as exc:
                    if self.control.lease_ok():
                        raise
                    return self._lease_lost(exc)  # cut off from everything: the broker's error is the lease's doing
                now = time.monotonic()
                if asked or now - self._last_checkpoint >= self.settings.checkpoint_interval_s:
                    self._checkpoint()
                if now - self._last_metrics >= self.settings.metrics_interval_s:
                    self.control.metrics(self.metrics())
        finally:
            watch.stop()
            self.close()

    def _lease_lost(self, cause: Exception | None = None) -> str:
        because = " (the messaging layer stopped answering too)" if cause is not None else ""
        log.debug("%s: the broker's error after the lease ran out: %s", self.plan.name, cause)
        log.warning("%s: the worker's lease on this instance ran out%s: stopping without a checkpoint", self.plan.name, because)
        self._claim_ended = True  # closed without aborting: the next owner resolves what is open
        return "lease lost"

    def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> bool:
        """Read every input to its end as it is now (nothing publishes to them any more: a rescale holds the
        upstream), so the last checkpoint covers all of it; False when time ran out first."""
        ends = {(topic, p): end for topic, reader in self.readers for p, end in self._transport_of(topic).end_offsets(topic).items()}
        deadline, behind = time.monotonic() + timeout_s, ends
        while time.monotonic() < deadline and self.control.lease_ok():
            behind = {(t, p): ends[(t, p)] - o for t, r in self.readers for p, o in r.fetched_to().items() if o < ends.get((t, p), 0)}
            if not behind and not any([reader.read_again() for _topic, reader in self.readers]):  # what a fetch stepped over, too
                log.info("%s: drained its inputs to %s", self.plan.name, ends)
                return True
            self.turn()
        log.error("%s: could not drain its inputs in %.0f s (still behind: %s)", self.plan.name, timeout_s, behind)
        return False

    def _transport_of(self, topic: str) -> Transport:
        return self.connections.of_source(next(s for s in self.plan.inputs if s.topic == topic))

    def turn(self) -> int:
        """One poll of every input, the engine, the outputs published and acknowledged; returns messages read."""
        waited, polled = self.stats.window_waited_s, time.perf_counter()
        messages = self._poll(self._wait_s())
        processed = time.perf_counter()
        now = _now_ms()
        replaying = self.exactly_once is not None and self.exactly_once.replay_until
        if replaying:
            messages = self._replay(messages, now)
        if messages:
            out = self.runtime.process(messages, now)
        elif not replaying and self.runtime.on_wall_clock and (wakeup := self.runtime.next_wakeup()) is not None and wakeup <= now:
            out = self.runtime.advance(now)
        else:
            return 0
        engine_done = time.perf_counter()
        self._advance_positions(messages)
        produced = self._publish(out, now, read=bool(messages))
        if messages:
            done, phases = time.perf_counter(), self.stats.window_phases
            phases[0] += max(0.0, processed - polled - (self.stats.window_waited_s - waited))  # waits are timed on another clock
            phases[1] += engine_done - processed
            phases[2] += produced - engine_done
            phases[3] += done - produced
            self.stats.window_turns += 1
            self.stats.latencies.append(((done - processed) * 1000, len(messages)))
            del self.stats.latencies[:-_LATENCY_WINDOW]
            self.stats.rows_in_total += len(messages)
            self.stats.window_in += len(messages)
        self.stats.rows_out_total += len(out)
        return len(messages)

    def _advance_positions(self, messages: list[Message]) -> None:
        for message in messages:
            place = (message.topic, message.partition)
            if message.offset + 1 > self.positions.get(place, -1):
                self.positions[place] = message.offset + 1

    def _replay(self, messages: list[Message], now: int) -> list[Message]:
        """Run the messages whose outputs the last owner already committed, dropping those outputs; return the rest.

        Wall-clock time moves with the replayed messages' own times, only as far as the last committed
        turn had seen (where the broker keeps it with the offsets), so what timers fired by then is
        dropped too and what they fire later is published."""
        eo = self.exactly_once
        assert eo is not None
        replayed, rest = eo.split_replay(messages)
        if replayed:
            self.runtime.replay(replayed, min(now, eo.replay_clock or now))
            self._advance_positions(replayed)
            self.stats.replayed += len(replayed)
        eo.replay_done(self.positions, self._backlog, idle=not messages, replayed=self.stats.replayed)
        return rest

    def _backlog(self) -> dict[tuple[str, int], int]:
        return {(t, p): n for t, r in self.readers for p, n in (r.backlog() or {}).items()}

    def _wait_s(self) -> float:
        wait = self.settings.idle_wait_s
        if self.runtime.on_wall_clock and (wakeup := self.runtime.next_wakeup()) is not None:
            wait = min(wait, max(0.0, (wakeup - _now_ms()) / 1000))
        return wait

    def _poll(self, wait: float) -> list[Message]:
        if len(self.readers) == 1:
            return self._read(*self.readers[0], wait)
        messages: list[Message] = []
        for topic, reader in self.readers:
            messages += self._read(topic, reader, 0.0)
        if not messages and wait > 0:
            # Several inputs: wait on the first briefly, then look at all again.
            topic, reader = self.readers[0]
            messages = self._read(topic, reader, min(wait, 0.01))
            for topic, reader in self.readers[1:]:
                messages += self._read(topic, reader, 0.0)
        return messages

    def _read(self, topic: str, reader: Reader, wait: float) -> list[Message]:
        waited = reader.waited_s
        if topic in self._batched_in:  # a batch holds up to a turn of the writer's: take fewer at once
            messages = expand(topic, reader.poll_raw(max(1, self.settings.max_events // BATCHES_PER_EVENTS), wait, ORIGIN_HEADER), self._batched_in[topic])
        else:
            messages = [Message(topic, *raw) for raw in reader.poll_raw(self.settings.max_events, wait, ORIGIN_HEADER)]
        self.stats.window_waited_s += reader.waited_s - waited
        return messages

    def _publish(self, out: list[Message], now: int, *, read: bool) -> float:
        """Produce the outputs and wait for them: in one transaction with the input offsets, or flushed (then
        the offsets committed, when the turn `read` some); returns when (perf_counter) producing ended and the wait began."""
        if self.exactly_once is not None:
            out = self.exactly_once.drop_leaked(out)
        if self.http_sinks is not None:
            # HTTP first: a turn's offsets are committed only once its requests ended (or went to dead letters).
            out = self.http_sinks.deliver(out, self.settings.dead_letter_topic, self.settings.flush_timeout_s)
        out = pack(out, self._batched_out)
        if self.connections.output_cluster:
            groups: dict = {}
            for message in out:
                groups.setdefault(self.connections.publisher(message.topic), []).append(message)
        else:
            groups = {self.connections.publisher(out[0].topic): out} if out else {}  # every topic on the cluster's layer
        for publisher, messages in groups.items():
            publisher.produce_all(((m.topic, m.value, m.key, m.partition, m.timestamp, m.origin) for m in messages), ORIGIN_HEADER)
        produced = time.perf_counter()
        for publisher in self.connections.publishers:  # other layers first: the transaction commits the inputs as done
            if (self.exactly_once is None or publisher is not self.exactly_once.publisher) and publisher in groups:
                publisher.flush(max(1.0, min(self.settings.flush_timeout_s, self.control.lease_left())))
        if self.exactly_once is not None:
            self.exactly_once.commit(self.positions, now, self.control.lease_ok)
        elif self.feed is not None and read:
            self.feed.commit(self.positions, now)
        return produced

    def _checkpoint(self) -> None:
        """Hand the control the engine's snapshot and the offsets it covers (outputs already acknowledged)."""
        self._last_checkpoint = time.monotonic()
        self._mark_outputs()
        checkpoint = Checkpoint(dict(self.positions), self.runtime.snapshot(), _now_ms(), self.incarnations, self._set_aside, dict(self._marks))
        self.control.checkpoint(checkpoint.encode())
        self._set_aside = None

    def _mark_outputs(self) -> None:
        """Note where the outputs end now, unless outputs a dead owner let through may still be met."""
        if self.exactly_once is not None:
            clock = self.runtime.engine.clock.now() if self.runtime.on_wall_clock else None
            marks = self.exactly_once.mark_outputs(self.positions, clock)
            if marks is not None:
                self._marks = marks

    def metrics(self) -> dict:
        """Rows in/out, events/s, lag, processing latency (ms from a poll's return to its outputs' acknowledgement)
        and busy (the fraction of the window's wall time not spent waiting for input: reading what had arrived,
        processing, publishing and checkpointing all count, so a saturated instance shows near 1); turn_ms: the mean
        milliseconds a turn with input spent in each of PHASES (commit: the transaction's, or the flush's, wait)."""
        now = time.monotonic()
        elapsed = max(now - self.stats.window_start, 1e-6)
        lag: dict[str, int] = {}
        for topic, reader in self.readers:
            for partition, behind in (reader.backlog() or {}).items():
                lag[f"{topic}:{partition}"] = behind
        values = {
            "mode": "continuous",
            "rows_in_total": self.stats.rows_in_total,
            "rows_out_total": self.stats.rows_out_total,
            "rows_per_s": round(self.stats.window_in / elapsed, 1),
            "busy": round(max(0.0, 1.0 - self.stats.window_waited_s / elapsed), 3),
            "latency_ms_p50": _percentile(self.stats.latencies, 0.5),
            "latency_ms_p99": _percentile(self.stats.latencies, 0.99),
            "turn_ms": {name: round(seconds * 1000 / turns, 3) for name, seconds in zip(PHASES, self.stats.window_phases, strict=True)}
            if (turns := self.stats.window_turns)
            else {},
            "lag": sum(lag.values()),
            "lag_by_partition": lag,
            "delivery": self.delivery,
            "replayed": self.stats.replayed,
            "duplicates_dropped": self.runtime.duplicates,
            "rejected": self.runtime.rejected,
            **({"state_note": self.state_note} if self.state_note else {}),
        }
        self.stats.latencies.clear()
        self.stats.window_start, self.stats.window_in, self.stats.window_waited_s = now, 0, 0.0
        self.stats.window_turns, self.stats.window_phases = 0, [0.0] * len(PHASES)
        self._last_metrics = now
        return values

    def close(self) -> None:
        """Release the readers, publishers and the engine."""
        for _topic, reader in self.readers:
            try:
                reader.close()
            except Exception as exc:  # closing after a broker outage
                log.debug("%s: closing a reader: %s", self.plan.name, exc)
        self.readers = []
        for exc in self.connections.close(leave=self._claim_ended):
            log.debug("%s: closing a publisher: %s", self.plan.name, exc)
        if self.feed is not None:
            self.feed.close(wait=not self._claim_ended)
        if self.http_sinks is not None:
            self.http_sinks.close()
        self.runtime.close()


def _now_ms() -> int:
    return int(time.time() * 1000)
