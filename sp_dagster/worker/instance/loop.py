"""One partial-app instance run continuously: read its partitions -> engine -> publish, as events come.

This is what a worker's long-running Spark task does (see `spark/continuous.py` for the Spark side);
it knows nothing of Spark, so it also runs, and is tested, in a plain thread.

    loop = InstanceLoop(plan, transport, LoopSettings(...), checkpoint=blob_or_None, control=control)
    loop.run()   # until the control says stop, or its lease runs out

Each turn polls every input (waiting at most until the engine's next timer), sends the messages
through `InstanceRuntime` (one engine send per message, origins named as in micro-batch mode),
publishes the outputs and waits for the broker's acknowledgement. With no input, wall-clock
timers fire on time (`advance`). Every `checkpoint_interval_s` (and when asked, and when told to
stop with save) the loop hands the control a *checkpoint*: the engine snapshot together with the
input offsets it covers, taken after the outputs of those inputs were acknowledged. Restored, a
checkpoint resumes the engine and re-reads from its offsets; what the instance publishes again
carries the same origins, so the next group drops it (`InstanceRuntime`). A checkpoint whose
offsets belong to other incarnations of the topics, or whose state does not fit the partial
app, is not resumed silently (`checkpoints.py`).

The loop stops at once, without a checkpoint, when its lease runs out: the worker renews the
lease while its own heartbeat holds, so an instance never outlives its worker's claim on it.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

from sp_dagster.errors import MessagingError
from sp_dagster.messaging.codecs import RawCodec
from sp_dagster.messaging.transport import EARLIEST, Reader, TransactionalPublisher, Transport
from sp_dagster.wording import counted
from sp_dagster.worker.instance.batching import batched_inputs, batched_outputs, expand, pack
from sp_dagster.worker.instance.checkpoints import Checkpoint, incarnation_digest, resume, topic_incarnations
from sp_dagster.worker.instance.connections import Connections
from sp_dagster.worker.instance.leaked_outputs import LeakedOutputs, own_prefixes
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
    """Runs one instance until stopped (see the module docstring)."""

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
        self._txn: TransactionalPublisher | None = None  # the transactional publisher (exactly-once), when the layer has transactions
        self._claim_ended = False  # stopping because another owner takes over: its open transaction is left to that owner
        self._txn_topics: set[str] = set()  # inputs whose offsets its transactions commit (this cluster's)
        self._txn_stamp = ""  # the incarnations of those inputs, stamped on every commit
        self.replay_until: dict[tuple[str, int], int] = {}  # inputs whose outputs up to here are already published
        self.replay_clock: int | None = None
        self._marks: dict[tuple[str, int], int] = {}  # where the outputs ended: kept in checkpoints (leaked_outputs.py)
        self._leaked: LeakedOutputs | None = None
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

    def _start_transactions(self, inputs: list[tuple[str, int]], read: list[tuple[str, int]]) -> None:
        """Publish in transactions with the offsets of `inputs` (this cluster's (topic, partition)s read,
        of all those `read`); replay silently up to what the last owner committed (start there, when fresh)."""
        try:
            name = f"sp-dagster.{self.plan.name}"
            self._txn = self.transport.transactional_publisher(name, name, self.settings.abandoned_after_s)
        except MessagingError as exc:
            log.warning("%s: no transactions on this broker (%s): outputs are at-least-once, replays dropped by origin", self.plan.name, exc)
            return
        if self._txn is None:
            return
        self._txn.time_left = self.control.lease_left
        self.connections.use_own(self._txn)
        self._txn_topics = {topic for topic, _p in inputs}
        self._txn_stamp = incarnation_digest({t: i for t, i in self.incarnations.items() if t in self._txn_topics})
        for place, (offset, metadata) in self._txn.committed(inputs).items():
            clock, _, stamp = metadata.partition(":")
            if stamp and stamp != self._txn_stamp:
                continue  # committed while reading other incarnations of these topics: says nothing about these
            if offset > self.positions.get(place, 0):
                if self._fresh:
                    self.positions[place] = offset  # what came before built the state that was dropped
                else:
                    self.replay_until[place] = offset
            if clock.isdigit():
                self.replay_clock = max(self.replay_clock or 0, int(clock))
        if self.replay_until:
            log.info("%s: replaying %s without publishing: their outputs were committed before", self.plan.name, self.replay_until)
        self._find_leaked(inputs, read)

    def _txn_outputs(self) -> list[str]:
        """The output topics on this cluster (what the transactions publish to)."""
        return sorted({t for o in self.plan.outputs if not o.bootstrap and not o.nats for t in (o.topic, *o.topics) if t})

    def _find_leaked(self, inputs: list[tuple[str, int]], read: list[tuple[str, int]]) -> None:
        """Read the outputs from the start checkpoint's marks on for what a dead owner's open transaction
        let through (leaked_outputs.py): `inputs` are this cluster's input partitions, `read` all of them."""
        assert self._txn is not None
        if not self.transport.profile.probe_leaked:
            return  # the broker aborts an open transaction when its next owner starts (Kafka's way)
        outputs = self._txn_outputs()
        marks = {place: mark for place, mark in self._marks.items() if place[0] in outputs}
        if not marks:
            return
        horizon = {(t, p): end for t in {t for t, _p in inputs} for p, end in self.transport.end_offsets(t).items() if (t, p) in inputs}
        prefixes = own_prefixes(self.runtime.group, self.plan.stateless, read, self.runtime.clock_origin)
        self._leaked = LeakedOutputs(self._txn.headers_since(marks, ORIGIN_HEADER), prefixes, horizon, _now_ms())
        if self._leaked:
            log.info("%s: %s published since its checkpoint: none computed again is published twice", self.plan.name, counted(self._leaked.count, "output"))

    @property
    def delivery(self) -> str:
        """exactly-once (transactions) or at-least-once (origins let the next group drop replays)."""
        return "exactly-once" if self._txn is not None else "at-least-once"

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> str:
        """Loop until told to stop (or the lease runs out); returns why it stopped."""
        gc.freeze()  # what exists now lives as long as the loop: keep it out of every collection
        self._open()
        self.control.metrics(self.metrics())  # at once: a state reset is told before the first turn
        if self._txn is not None and not self._marks:
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
        if self.replay_until:
            messages = self._replay(messages, now)
        if messages:
            out = self.runtime.process(messages, now)
        elif not self.replay_until and self.runtime.on_wall_clock and (wakeup := self.runtime.next_wakeup()) is not None and wakeup <= now:
            out = self.runtime.advance(now)
        else:
            return 0
        engine_done = time.perf_counter()
        self._advance_positions(messages)
        produced = self._publish(out, now)
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
        bounds = dict(self.replay_until)
        replayed = [m for m in messages if m.offset < bounds.get((m.topic, m.partition), -1)]
        if replayed:
            self.runtime.replay(replayed, min(now, self.replay_clock or now))
            self._advance_positions(replayed)
            self.stats.replayed += len(replayed)
        for place, end in list(self.replay_until.items()):
            if self.positions.get(place, 0) >= end:
                del self.replay_until[place]
        if not messages and self.replay_until:
            # A committed offset the topic no longer reaches (the topic was recreated): nothing to replay there.
            behind = {(t, p): n for t, r in self.readers for p, n in (r.backlog() or {}).items()}
            for place in [p for p in self.replay_until if behind.get(p) == 0]:
                log.warning("%s: %s:%d ends before its committed offset %d; replay there is over", self.plan.name, *place, self.replay_until.pop(place))
        if bounds and not self.replay_until:
            log.info("%s: replay done (%d messages); publishing again", self.plan.name, self.stats.replayed)
        return [m for m in messages if m.offset >= bounds.get((m.topic, m.partition), -1)] if replayed else messages

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
            messages = expand(topic, reader.poll_raw(max(1, self.settings.max_events // BATCHES_PER_EVENTS), wait, ORIGIN_HEADER))
        else:
            messages = [Message(topic, *raw) for raw in reader.poll_raw(self.settings.max_events, wait, ORIGIN_HEADER)]
        self.stats.window_waited_s += reader.waited_s - waited
        return messages

    def _publish(self, out: list[Message], now: int) -> float:
        """Produce the outputs and wait for them: in one transaction with the input offsets, or flushed;
        returns when (perf_counter) producing ended and the wait began."""
        if self._leaked:
            out = self._leaked.drop(out)
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
            if publisher is not self._txn and publisher in groups:
                publisher.flush(max(1.0, min(self.settings.flush_timeout_s, self.control.lease_left())))
        if self._txn is not None:
            offsets = {place: o for place, o in self.positions.items() if place[0] in self._txn_topics}
            self._txn.commit(offsets, f"{now}:{self._txn_stamp}", retry_while=self.control.lease_ok)
        return produced

    def _checkpoint(self) -> None:
        """Hand the control the engine's snapshot and the offsets it covers (outputs already acknowledged)."""
        self._last_checkpoint = time.monotonic()
        self._mark_outputs()
        checkpoint = Checkpoint(dict(self.positions), self.runtime.snapshot(), _now_ms(), self.incarnations, self._set_aside, dict(self._marks))
        self.control.checkpoint(checkpoint.encode())
        self._set_aside = None

    def _mark_outputs(self) -> None:
        """Note where the outputs end now (between turns: nothing of this loop's is open), unless
        outputs a dead owner let through may still be met: the old marks then stay."""
        clock = self.runtime.engine.clock.now() if self.runtime.on_wall_clock else None
        if self._txn is None or (self._leaked is not None and self._leaked.pending(self.positions, clock)):
            return
        if self._leaked is not None and self._leaked.dropped:
            log.warning(
                "%s: found %s on the output topics already, let through from the open transaction of an owner "
                "that died (the broker did not abort it): not published again",
                self.plan.name,
                counted(self._leaked.dropped, "output"),
            )
        self._leaked = None
        try:
            self._marks = self._txn.marks(self._txn_outputs())
        except MessagingError as exc:  # the earlier marks stay right (only older)
            log.warning("%s: could not list where the output topics end (%s)", self.plan.name, exc)

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
        for exc in self.connections.close(leave=self._txn if self._claim_ended else None):
            log.debug("%s: closing a publisher: %s", self.plan.name, exc)
        if self.http_sinks is not None:
            self.http_sinks.close()
        self.runtime.close()


def _now_ms() -> int:
    return int(time.time() * 1000)
