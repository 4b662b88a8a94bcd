"""Continuous mode: instances as loops (in threads, then as long-running Spark tasks) on the real broker.

Outputs are checked against the in-process engine; checkpoints, restores, leases and wall-clock
timers are exercised on the loop itself, then the same loop runs as a Spark task under the
driver's control line.
"""

from __future__ import annotations

import collections
import dataclasses
import signal
import time
import uuid

import pytest

from sp_dagster.errors import ProducerFenced
from sp_dagster.messaging import EARLIEST, Partitioned, codec_for
from sp_dagster.siddhi import parse
from sp_dagster.topology import plan
from sp_dagster.worker.instance.checkpoints import Checkpoint, CheckpointError
from sp_dagster.worker.instance.loop import LoopSettings
from sp_dagster.worker.instance.plan import plan_instance
from tests.fixtures.clock import BATCHES, CLOCK_APP, GONE
from tests.fixtures.loops import Running, by_symbol, checkpoints_now, deploy_topics, first_half_through, publish_trades, read_outputs, running_app
from tests.fixtures.trades import APP, reference, trades
from tests.fixtures.waiting import wait_until

pytestmark = [pytest.mark.broker]


@pytest.mark.slow
def test_loops_match_the_engine_and_resume_exactly_from_their_checkpoints(kafka):
    name, topology, plans, running = running_app(kafka, "Cont")
    rows, stamps = trades(4000, seed=5)
    half = first_half_through(kafka, name, topology, rows, stamps, running)
    # Stop every instance with a last checkpoint, start new loops from them, send the rest.
    saved = {n: r.stop(save=True) for n, r in running.items()}
    assert all(saved.values()) and all(r.reason == "stopped" for r in running.values())
    assert any(Checkpoint.decode(c).positions for c in saved.values())
    running = {n: Running(kafka, plans[n], checkpoint=saved[n]) for n in plans}
    publish_trades(kafka, topology, rows[half:], stamps[half:])
    everything = reference(rows, stamps)
    got = read_outputs(kafka, f"{name}.Averages", sum(map(len, everything.values())))
    for r in running.values():
        r.stop()
    assert by_symbol(r for r, _ in got) == dict(everything)  # windows carried over, nothing twice
    metrics = [m for r in running.values() for m in r.line.metrics_seen if m["rows_in_total"]]
    assert metrics and all(m["mode"] == "continuous" and m["latency_ms_p50"] is not None for m in metrics if m["latency_ms_p50"] is not None)
    assert all(0.0 <= m["busy"] <= 1.0 for m in metrics)
    assert any(m["busy"] > 0 for m in metrics if m["rows_per_s"])  # windows that took events in spent time on them
    turns = [m["turn_ms"] for m in metrics if m["turn_ms"]]
    assert turns and all(list(t) == ["read", "engine", "produce", "commit"] and min(t.values()) >= 0 for t in turns)
    assert all(t["commit"] > 0 for t in turns)  # every turn with input waits for its transaction


@pytest.mark.slow
def test_without_transactions_a_restore_from_an_older_checkpoint_replays_with_the_same_origins_and_counts_nothing_twice(kafka):
    """At-least-once (a messaging layer without transactions): replays reach the next group, which drops them by origin."""
    name, topology, plans, running = running_app(kafka, "Replay", interval=3600, transactions=False)
    early = checkpoints_now(running)
    rows, stamps = trades(3000, seed=9)
    publish_trades(kafka, topology, rows, stamps)
    expected = reference(rows, stamps)
    total = sum(map(len, expected.values()))
    assert len(read_outputs(kafka, f"{name}.Averages", total)) == total
    # A crash: the filter group's instances stop without a checkpoint and come back from the early
    # one, so they publish everything again; the average group drops those replays by origin.
    for n in [n for n in plans if "-filter-" in n]:
        running[n].stop(save=False)
        running[n] = Running(kafka, plans[n], checkpoint=early[n], transactions=False)
    averages = [n for n in plans if "-average-" in n]
    replays = sum(1 for r in rows if r[2] >= 10)  # what the filter passed, and now passes again
    dropped = lambda: sum(running[n].loop.runtime.duplicates for n in averages)  # noqa: E731
    wait_until(lambda: dropped() >= replays, timeout=60, interval=0.1, what=lambda: f"{replays} replays dropped by origin (so far {dropped()})")
    got = read_outputs(kafka, f"{name}.Averages", total + 1, timeout=2)
    for r in running.values():
        r.stop()
    assert sum(running[n].loop.runtime.duplicates for n in averages) == replays
    assert by_symbol(r for r, _ in got) == dict(expected)


@pytest.mark.slow
def test_with_transactions_a_crash_and_a_restore_from_an_older_checkpoint_publish_every_output_exactly_once(kafka):
    name, topology, plans, running = running_app(kafka, "Exactly", interval=3600)
    early = checkpoints_now(running)
    filters, averages = [n for n in plans if "-filter-" in n], [n for n in plans if "-average-" in n]
    # The average group writes the app's final topic: transactions. The filter group only feeds it: offsets
    # committed without them (the next group drops by origin what a successor publishes again).
    assert {running[n].loop.delivery for n in averages} == {"exactly-once"}
    assert {running[n].loop.delivery for n in filters} == {"exactly-once by origin"}
    rows, stamps = trades(4000, seed=13)
    half = first_half_through(kafka, name, topology, rows, stamps, running)
    # Every instance crashes (no last checkpoint) and comes back from the checkpoint taken before
    # any event: the averages replay their input without publishing what their predecessors
    # committed; the filters start where theirs committed.
    for n in plans:
        running[n].stop(save=False)
    running = {n: Running(kafka, plans[n], checkpoint=early[n]) for n in plans}
    publish_trades(kafka, topology, rows[half:], stamps[half:])
    everything = reference(rows, stamps)
    total = sum(map(len, everything.values()))
    got = read_outputs(kafka, f"{name}.Averages", total + 1, timeout=20)
    replayed = sum(running[n].loop.stats.replayed for n in averages)
    republished = sum(running[n].loop.runtime.duplicates for n in averages)
    for r in running.values():
        r.stop()
    assert replayed >= sum(1 for r in rows[:half] if r[2] >= 10)  # every event the filters passed before
    assert republished == 0  # the filters' last owners committed all they read before they stopped
    assert len(got) == total and by_symbol(r for r, _ in got) == dict(everything)
    assert len({origin for _, origin in got}) == total


@pytest.mark.slow
def test_a_successor_of_an_instance_that_only_feeds_other_groups_starts_at_its_committed_offsets(kafka):
    """A stateless instance feeding other groups commits its offsets after each flush, without a transaction.
    Its successor starts there; what it publishes again (turns whose commit was lost) the next group drops."""
    name, topology, plans, running = running_app(kafka, "Feed", interval=3600)
    early = checkpoints_now(running)
    filters, averages = [n for n in plans if "-filter-" in n], [n for n in plans if "-average-" in n]
    rows, stamps = trades(4000, seed=29)
    half = first_half_through(kafka, name, topology, rows, stamps, running)
    for n in filters:  # what they read is committed; from now on their commits are lost (as a crash loses those in flight)
        loop = running[n].loop
        assert loop.exactly_once is None and loop.feed is not None
        committed = lambda loop=loop: {p: o for p, (o, _meta) in loop.feed.offsets.committed(list(loop.positions)).items()}  # noqa: E731
        wait_until(lambda loop=loop, committed=committed: committed() == loop.positions, 30, what="the filters' offsets committed")
        loop.feed.commit = lambda positions, now: None
    quarter = half + half // 2
    publish_trades(kafka, topology, rows[half:quarter], stamps[half:quarter])
    first = reference(rows[:quarter], stamps[:quarter])
    assert len(read_outputs(kafka, f"{name}.Averages", sum(map(len, first.values())))) == sum(map(len, first.values()))
    for n in filters:
        running[n].stop(save=False)
        running[n] = Running(kafka, plans[n], checkpoint=early[n])  # a checkpoint from before any event
    publish_trades(kafka, topology, rows[quarter:], stamps[quarter:])
    everything = reference(rows, stamps)
    total = sum(map(len, everything.values()))
    got = read_outputs(kafka, f"{name}.Averages", total + 1, timeout=20)
    dropped = sum(running[n].loop.runtime.duplicates for n in averages)
    for r in running.values():
        r.stop()
    # Started at the committed offsets, not at the checkpoint's: exactly the second quarter came again, and was dropped.
    assert dropped == sum(1 for r in rows[half:quarter] if r[2] >= 10)
    assert len(got) == total and by_symbol(r for r, _ in got) == dict(everything)


class Killed(Exception):
    """A worker killed between publishing a turn and committing it."""


def killed_before_commit(loop) -> None:
    """Fault injection: the loop's next commit of a turn with outputs sends them to the broker, in its
    open transaction, then dies as a SIGKILL would (leaving the transaction open; nothing aborts it)."""
    txn = loop.exactly_once.publisher
    real = txn.commit

    def commit(offsets, metadata="", **kw):
        if not txn.in_transaction:  # nothing published this turn
            return real(offsets, metadata, **kw)
        txn.producer.flush(30)
        txn._open = False  # no abort on close: a killed process ends nothing
        raise Killed

    txn.commit = commit


@pytest.mark.slow
def test_outputs_a_killed_owner_left_in_an_open_transaction_are_published_once(kafka):
    """Kafka aborts a dead owner's open transaction when the next one starts; tansu 0.6 lets its
    messages through instead. Either way the next owner publishes every output exactly once."""
    name, topology, plans, running = running_app(kafka, "Leak")
    rows, stamps = trades(4000, seed=17)
    half = first_half_through(kafka, name, topology, rows, stamps, running)
    victims = [n for n in plans if "-average-" in n]
    for n in victims:
        killed_before_commit(running[n].loop)
    publish_trades(kafka, topology, rows[half:], stamps[half:])
    for n in victims:
        running[n].thread.join(60)
        assert isinstance(running[n].error, Killed), running[n].error
        running[n] = Running(kafka, plans[n], checkpoint=running[n].line.checkpoints[-1])
    everything = reference(rows, stamps)
    total = sum(map(len, everything.values()))
    got = read_outputs(kafka, f"{name}.Averages", total + 1, timeout=20)
    for r in running.values():
        r.stop()
    assert len({origin for _, origin in got}) == total
    assert len(got) == total and by_symbol(r for r, _ in got) == dict(everything)


def test_outputs_an_owner_killed_before_its_first_periodic_checkpoint_left_open_are_published_once(kafka):
    """The owner dies in its first transaction, long before a checkpoint was due: its start
    checkpoint's output marks still let the next owner find what that transaction let through."""
    name, topology, plans, running = running_app(kafka, "EarlyLeak", interval=3600)
    victims = [n for n in plans if "-average-" in n]
    wait_until(lambda: all(running[n].loop.delivery == "exactly-once" for n in victims), timeout=60, what="the averages' transactions begun")
    for n in victims:
        killed_before_commit(running[n].loop)
    rows, stamps = trades(2000, seed=23)
    publish_trades(kafka, topology, rows, stamps)
    for n in victims:
        running[n].thread.join(60)
        assert isinstance(running[n].error, Killed), running[n].error
        assert len(running[n].line.checkpoints) == 1  # the one taken at its start
        running[n] = Running(kafka, plans[n], checkpoint=running[n].line.checkpoints[-1], interval=3600)
    everything = reference(rows, stamps)
    total = sum(map(len, everything.values()))
    got = read_outputs(kafka, f"{name}.Averages", total + 1, timeout=20)
    for r in running.values():
        r.stop()
    assert len(got) == total and by_symbol(r for r, _ in got) == dict(everything)


@pytest.mark.slow
def test_a_second_owner_of_an_instance_fences_the_first(kafka):
    """Two loops of one instance (a worker that lost it but still runs): the newer one's transactions fence the older's."""
    name = f"Zombie{uuid.uuid4().hex[:8]}"
    topology = deploy_topics(kafka, APP.replace("Trades", name))
    instance = topology.group("filter").instances[0]
    # Taken as stateful, so that it runs transactions (a stateless one feeding other groups needs none: see above).
    stateful = dataclasses.replace(plan_instance(instance.name, instance.siddhi), stateless=False)
    rows, stamps = trades(1000, seed=2)
    old = Running(kafka, stateful)
    publish_trades(kafka, topology, rows[:500], stamps[:500])
    wait_until(lambda: old.loop.stats.rows_in_total, timeout=60, what="the first owner reading")
    new = Running(kafka, stateful)
    wait_until(
        lambda: new.loop.delivery == "exactly-once" and new.loop.stats.replayed and not new.loop.exactly_once.replay_until,
        timeout=60,
        what="the new owner replaying what the old one had committed",
    )
    publish_trades(kafka, topology, rows[500:], stamps[500:])
    old.thread.join(60)
    assert not old.thread.is_alive() and isinstance(old.error, ProducerFenced), old.error  # its commit was refused
    assert new.thread.is_alive() and new.error is None
    new.stop()


@pytest.mark.slow
def test_a_loop_cut_off_from_the_broker_mid_turn_stops_as_its_lease_ends_not_as_a_failure(tmp_path):
    # A worker cut off from everything: the turn under way waits on the broker until the lease ends,
    # and the loop stops then as a lost lease (its transaction left to the next owner), not with a broker error.
    from sp_dagster.embedded import EmbeddedBroker
    from sp_dagster.messaging.kafka import KafkaTransport

    with EmbeddedBroker(log_path=tmp_path / "tansu.log") as broker:
        kafka = KafkaTransport(broker.bootstrap_servers, timeout=15)
        try:
            name = f"Cut{uuid.uuid4().hex[:8]}"
            topology = deploy_topics(kafka, APP.replace("Trades", name))
            rows, stamps = trades(20_000, seed=11)
            publish_trades(kafka, topology, rows, stamps)
            ends = kafka.end_offsets(f"{name}.TradeStream")
            instance = topology.group("filter").instances[0]
            # A backlog read a few messages a turn: turns follow each other, each with a commit.
            running = Running(kafka, plan_instance(instance.name, instance.siddhi), interval=3600, max_events=5)
            deadline = time.monotonic() + 30
            while not running.loop.stats.rows_in_total and time.monotonic() < deadline:
                running.line.until = time.monotonic() + 3.0  # renewed, as a driver renews its tasks' leases
                time.sleep(0.01)
            assert broker.process is not None
            broker.process.send_signal(signal.SIGSTOP)  # every request hangs, as across a cut network
            cut, read = time.monotonic(), running.loop.stats.rows_in_total  # renewed no more: the lease ends in 3 s
            running.thread.join(30)
            stopped = time.monotonic() - cut
            broker.process.send_signal(signal.SIGCONT)
        finally:
            kafka.close()
    assert read < ends[0], f"the cut came after all {ends[0]} messages were read: it cut no turn"
    assert not running.thread.is_alive() and running.error is None and running.reason == "lease lost", running.error
    assert stopped < 3.0 + 2.0, f"stopped {stopped:.1f} s after the cut (lease 3 s)"


@pytest.mark.slow
def test_a_loop_whose_lease_runs_out_stops_at_once_without_a_checkpoint(kafka):
    name = f"Lease{uuid.uuid4().hex[:8]}"
    topology = deploy_topics(kafka, APP.replace("Trades", name))
    instance = topology.group("average").instances[0]
    running = Running(kafka, plan_instance(instance.name, instance.siddhi), interval=3600)
    wait_until(lambda: running.line.checkpoints, timeout=30, what="the checkpoint every loop takes at its start")
    txn, left = running.loop.exactly_once.publisher, []
    assert txn is not None
    leave = txn.leave
    txn.leave = lambda: (left.append(True), leave())[1]  # type: ignore[method-assign]
    running.line.lease = False
    running.thread.join(10)
    assert not running.thread.is_alive() and running.reason == "lease lost" and len(running.line.checkpoints) == 1
    # Its open transaction is left to the next owner, not aborted: a late abort could land after that owner took over.
    assert left == [True] and not txn.in_transaction


@pytest.mark.slow
def test_wall_clock_windows_fire_on_time_inside_the_loop_with_no_new_input(kafka):
    name = f"Clock{uuid.uuid4().hex[:8]}"
    (instance,) = plan(parse(CLOCK_APP.format(name=name))).partial_apps
    clock = plan_instance(instance.name, instance.siddhi)
    for topic in (clock.inputs[0].topic, f"{name}.Batches", f"{name}.Gone"):
        kafka.ensure_topic(topic, 1)
    running = Running(kafka, clock)
    readers = {out: kafka.reader(f"{name}.{out}", {0: EARLIEST}, codec_for("json", schema)) for out, schema in (("Batches", BATCHES), ("Gone", GONE))}
    got: dict = {"Batches": [], "Gone": []}
    source = clock.inputs[0]
    publisher = kafka.publisher(source.topic, codec_for(source.codec, source.attributes), Partitioned(0, "symbol"))
    rows = [("IBM", 10.0, 5), ("WSO2", 20.0, 7), ("IBM", 30.0, 11)]
    sent = []
    try:
        for row in rows:
            sent.append(int(time.time() * 1000))
            publisher.send([row], [sent[-1]])
            publisher.flush()
            time.sleep(0.15)
        deadline = time.monotonic() + 30
        # until every event expired and every volume was counted in a batch (one batch, or two when
        # the events straddled a batch's end on a loaded machine)
        while (len(got["Gone"]) < len(rows) or sum(t for (_s, t), _, _ in got["Batches"]) < sum(v for _s, _p, v in rows)) and time.monotonic() < deadline:
            for out, reader in readers.items():
                got[out].extend((e.row, e.timestamp, int(time.time() * 1000)) for e in reader.poll(timeout=0.05).events)
    finally:
        running.stop()
        for reader in readers.values():
            reader.close()
    assert sorted(row for row, _, _ in got["Gone"]) == sorted((s, p) for s, p, _v in rows)
    for (symbol, price), stamp, read_at in got["Gone"]:
        sent_at = sent[[(s, p) for s, p, _v in rows].index((symbol, price))]
        # expired a second after its own time, and read soon after: the loop's timer brought it
        assert sent_at + 1000 <= stamp <= read_at, (symbol, stamp - sent_at)
        assert read_at - stamp < 1000, (symbol, read_at - stamp)
    totals = collections.Counter()
    for (symbol, total), _, _ in got["Batches"]:
        totals[symbol] += total
    assert dict(totals) == {"IBM": 16, "WSO2": 7}


def test_a_checkpoint_of_another_kind_is_refused_with_a_clear_message():
    assert Checkpoint.decode(Checkpoint({("t", 1): 5}, b"snap", 7).encode()) == Checkpoint({("t", 1): 5}, b"snap", 7)
    with pytest.raises(CheckpointError, match="not a continuous-mode checkpoint"):
        Checkpoint.decode(b"\x1f\x8b tar bytes of a micro-batch checkpoint")


@pytest.mark.slow
def test_instances_run_as_long_running_spark_tasks_under_the_control_line(spark, kafka, tmp_path):
    from sp_dagster.config.model import MessagingSettings
    from sp_dagster.worker.spark.continuous import CHECKPOINT_FILE, ContinuousInstance, control_server

    name = f"Task{uuid.uuid4().hex[:8]}"
    topology = deploy_topics(kafka, APP.replace("Trades", name))
    lease = {"seconds": 30.0}
    server = control_server(spark, lambda: lease["seconds"])
    messaging = MessagingSettings("kafka", (kafka.bootstrap_servers,))
    settings = LoopSettings(checkpoint_interval_s=0.5, metrics_interval_s=0.2)
    handles = [
        ContinuousInstance(spark, server, plan_instance(i.name, i.siddhi), messaging, settings, tmp_path / i.name).start() for i in topology.partial_apps
    ]
    try:
        rows, stamps = trades(3000, seed=21)
        publish_trades(kafka, topology, rows, stamps)
        expected = reference(rows, stamps)
        got = read_outputs(kafka, f"{name}.Averages", sum(map(len, expected.values())), timeout=120)
        assert by_symbol(r for r, _ in got) == dict(expected)
        wait_until(lambda: all(h.metrics().get("rows_in_total") for h in handles), timeout=10, interval=0.1, what="every task's metrics counting its input")
        assert all(h.active for h in handles)
        # A stop with save leaves each instance's newest checkpoint where the worker keeps it.
        for handle in handles[:2]:
            handle.stop(save=True)
            assert not handle.active and (handle.checkpoint_dir / CHECKPOINT_FILE).exists()
        # Moved again while its task is still starting: it never runs (its job was not submitted yet), or it is told once
        # it connects and stops after a checkpoint; it is never cancelled mid-turn.
        again = ContinuousInstance(spark, server, handles[0].plan, messaging, settings, handles[0].checkpoint_dir).start()
        again.stop(save=True)
        assert not again.active and again.error is None and again.link.reason in (None, "stopped")
        # Fenced right after it was started (no checkpoint): it ends, whether or not its job was submitted yet.
        fenced = ContinuousInstance(spark, server, handles[1].plan, messaging, settings, handles[1].checkpoint_dir).start()
        fenced.stop(save=False)
        assert not fenced.active
        # The lease lapses (the worker's heartbeat failed): the other tasks stop by themselves.
        lease["seconds"] = 0.0
        wait_until(lambda: not any(h.active for h in handles), timeout=30, interval=0.1, what="every task stopping once its lease lapsed")
        assert all(h.link.reason == "lease lost" for h in handles[2:])
    finally:
        for handle in handles:
            if handle.active:
                handle.stop(save=False)
        server.close()
