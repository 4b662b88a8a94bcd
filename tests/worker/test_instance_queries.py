"""Partial-app instances as Spark streaming queries reproduce the in-process engine, event for event."""

from __future__ import annotations

import collections
import dataclasses
import json
import random
import time
import uuid

import pytest

from sp_dagster.messaging import EARLIEST, Partitioned, codec_for
from sp_dagster.siddhi import parse
from sp_dagster.topology import plan
from sp_dagster.worker.instance.plan import plan_instance
from sp_dagster.worker.instance.runtime import InstanceRuntime, Message, identity_copy
from sp_dagster.worker.spark.microbatch import QuerySettings, start_query
from tests.fixtures.clock import BATCHES, CLOCK_APP, GONE
from tests.fixtures.trades import APP, reference, trades
from tests.fixtures.waiting import wait_until


def test_instance_runtime_rejects_bad_messages_to_the_dead_letter_topic():
    topology = plan(parse(APP))
    instance = topology.group("filter").instances[0]
    runtime = InstanceRuntime(plan_instance(instance.name, instance.siddhi), "Trades.deadletter")
    source = runtime.plan.inputs[0]
    good = codec_for(source.codec, source.attributes).encode(("IBM", 12.5, 20))
    out = runtime.process([Message(source.topic, 0, 0, 5, None, b"\x00junk"), Message(source.topic, 0, 1, 6, None, good)])
    dead = [m for m in out if m.topic == "Trades.deadletter"]
    published = [m for m in out if m.topic != "Trades.deadletter"]
    assert len(dead) == 1 and b'"offset": 0' in dead[0].value and b"reason" in dead[0].value
    assert len(published) == 1 and published[0].timestamp == 6
    assert (runtime.rows_in, runtime.rows_out, runtime.rejected) == (1, 1, 1)


@pytest.mark.slow
@pytest.mark.broker
def test_instances_on_spark_match_the_in_process_engine(spark, kafka, tmp_path):
    # An app name of its own: other tests deploy "Trades" on the same session broker.
    name = f"TradesOnSpark{uuid.uuid4().hex[:8]}"
    topology = plan(parse(APP.replace("Trades", name)))
    for topic in topology.topics:
        kafka.ensure_topic(topic.name, topic.partitions)
    kafka.ensure_topic(f"{name}.deadletter", 1)
    first = topology.group("filter").instances[0]
    (entry,) = plan_instance(first.name, first.siddhi).inputs
    rows, stamps = trades(3000)
    publisher = kafka.publisher(entry.topic, codec_for(entry.codec, entry.attributes), Partitioned(0, "symbol"))
    publisher.send(rows, stamps)
    publisher.flush()

    queries = []
    try:
        for instance in topology.partial_apps:
            settings = QuerySettings(kafka.bootstrap_servers, str(tmp_path / instance.name), f"{name}.deadletter", trigger_interval="200 milliseconds")
            queries.append(start_query(spark, plan_instance(instance.name, instance.siddhi), settings))
        for query in queries:  # in data-flow order: each drains what the previous ones published
            query.processAllAvailable()
    finally:
        for query in queries:
            query.stop()

    expected = reference(rows, stamps)
    codec = codec_for("json", [("symbol", "string"), ("avgPrice", "double"), ("total", "long")])
    reader = kafka.reader(f"{name}.Averages", {0: EARLIEST}, codec)
    got = collections.defaultdict(list)
    total, deadline = sum(len(v) for v in expected.values()), time.monotonic() + 30
    while sum(len(v) for v in got.values()) < total and time.monotonic() < deadline:
        for event in reader.poll(timeout=0.5).events:
            got[event.row[0]].append(event.row)
    reader.close()
    assert total > 1000
    assert dict(got) == dict(expected)


def _instance(group: str):
    topology = plan(parse(APP))
    instance = topology.group(group).instances[0]
    return plan_instance(instance.name, instance.siddhi)


def test_replayed_events_are_dropped_by_origin_and_outputs_keep_theirs():
    average = _instance("average")
    source = average.inputs[0]
    codec = codec_for(source.codec, source.attributes)
    upstream = [
        Message(source.topic, 0, n, 1000 + n, b"IBM", codec.encode(("IBM", 10.0 * (n + 1), 20)), f"Trades-filter>Trades.TradeStream:0|{n}.1".encode())
        for n in range(4)
    ]
    first = InstanceRuntime(average)
    out = first.process(upstream[:3])
    assert [m.origin for m in out] == [f"Trades-average@{source.topic}:0|{n}.1".encode() for n in range(3)]
    # Upstream replays events 1 and 2 (same origins, new offsets) before event 3: only 3 counts.
    replay = [Message(source.topic, 0, 10 + n, m.timestamp, m.key, m.value, m.origin) for n, m in enumerate(upstream[1:3])]
    out = first.process(replay + [Message(source.topic, 0, 12, 1003, b"IBM", upstream[3].value, upstream[3].origin)])
    assert first.duplicates == 2 and len(out) == 1
    assert codec_for("json", [("symbol", "string"), ("avgPrice", "double"), ("total", "long")]).decode(out[0].value) == [("IBM", 25.0, 80)]
    # A takeover restores the state, origins seen included, and drops the same duplicates again.
    second = InstanceRuntime(average)
    second.restore(first.snapshot())
    assert second.process(replay) == [] and second.duplicates == 2


def test_stateless_instances_pass_origins_on():
    filter_ = _instance("filter")
    source = filter_.inputs[0]
    codec = codec_for(source.codec, source.attributes)
    runtime = InstanceRuntime(filter_)
    out = runtime.process([Message(source.topic, 1, 7, 5, None, codec.encode(("IBM", 1.0, 50)))])
    assert [m.origin for m in out] == [f"Trades-filter>{source.topic}:1|7.1".encode()]
    again = runtime.process([Message(source.topic, 1, 7, 5, None, codec.encode(("IBM", 1.0, 50)))])
    assert again == [] and runtime.duplicates == 1


def _clock_instance(name: str, playback: bool = False):
    text = CLOCK_APP.format(name=name)
    (instance,) = plan(parse(("@app:playback\n" if playback else "") + text)).partial_apps
    return plan_instance(instance.name, instance.siddhi)


def _decoded(messages, name: str) -> dict:
    codecs = {f"{name}.Batches": codec_for("json", BATCHES), f"{name}.Gone": codec_for("json", GONE)}
    out = collections.defaultdict(list)
    for m in messages:
        out[m.topic.rsplit(".", 1)[1]].extend(codecs[m.topic].decode(m.value))
    return dict(out)


DOWNSTREAM = """@App:name('Down')
@source(type = 'kafka', topic.list = 'Twins.Batches', partition.no.list = '0', group.id = 'down', @map(type = 'json'))
define stream BatchStream (symbol string, total long);
@sink(type = 'kafka', topic = 'Down.Totals', @map(type = 'json'))
define stream TotalStream (symbol string, total long);
@dist(execGroup = 'sum')
from BatchStream select symbol, sum(total) as total insert into TotalStream;
"""


def test_two_instances_of_a_group_name_what_their_timers_fire_apart():
    """Timers of two instances may fall due at the same time and their outputs meet on one partition
    downstream: the second must not look like a replay of the first there."""
    one = _clock_instance("Twins")
    two = dataclasses.replace(one, name=one.name.replace("-1", "-2"))
    source = one.inputs[0]
    trade = Message(source.topic, 0, 0, 10_100, None, codec_for(source.codec, source.attributes).encode(("IBM", 1.0, 5)))
    fired = []
    for instance in (one, two):
        runtime = InstanceRuntime(instance, now=10_100)
        runtime.process([trade], now=10_100)
        fired.append([m for m in runtime.advance(11_100) if m.topic == "Twins.Batches"])
    (first,), (second,) = fired
    assert first.origin != second.origin and first.value == second.value
    (down,) = plan(parse(DOWNSTREAM)).partial_apps
    downstream = plan_instance(down.name, down.siddhi)
    later = InstanceRuntime(downstream, now=11_100)
    merged = [Message(downstream.inputs[0].topic, 0, offset, 11_100, None, m.value, m.origin) for offset, m in enumerate((first, second))]
    later.process(merged, now=11_100)
    assert later.duplicates == 0 and later.rows_in == 2


def test_a_replay_on_the_wall_clock_runs_each_message_at_its_own_time():
    """A new owner replays what its predecessor had committed: timers fire between the same messages
    as they did then, so a batch the predecessor published does not leak its events into the next."""
    clock = _clock_instance("Replay")
    source = clock.inputs[0]
    codec = codec_for(source.codec, source.attributes)
    trades = [Message(source.topic, 0, n, ts, None, codec.encode(("IBM", 1.0, v))) for n, (ts, v) in enumerate([(10_000, 5), (10_500, 7), (11_200, 11)])]
    first = InstanceRuntime(clock, now=10_000)
    first.process(trades[:1], now=10_000)
    runtime = InstanceRuntime(clock, now=10_000)
    runtime.restore(first.snapshot())  # its checkpoint holds the first trade; the others were committed after it
    runtime.replay(trades[1:], until=11_300)
    later = runtime.advance(12_100)
    assert _decoded(later, "Replay")["Batches"] == [("IBM", 11)]  # the batch of 5 + 7 was published before the takeover


def test_wall_clock_instances_emit_what_time_brings_when_their_host_advances_them():
    clock = _clock_instance("Clock")
    source = clock.inputs[0]
    codec = codec_for(source.codec, source.attributes)
    trade = lambda offset, ts, row: Message(source.topic, 0, offset, ts, None, codec.encode(row))  # noqa: E731
    runtime = InstanceRuntime(clock, key="k", now=10_000)
    assert runtime.on_wall_clock and runtime.next_wakeup() is None
    assert runtime.process([trade(0, 10_000, ("IBM", 1.0, 5)), trade(1, 10_100, ("IBM", 2.0, 7))], now=10_100) == []
    assert runtime.next_wakeup() == 11_000  # IBM@10_000 leaves the time window before the batch closes at 11_100
    first = runtime.advance(11_000)
    assert _decoded(first, "Clock") == {"Gone": [("IBM", 1.0)]}
    assert [m.origin for m in first] == [b"Clock-clock@clock:k|11000.1"]
    # a takeover between wake-ups carries the armed timers and the clock's naming over
    second = InstanceRuntime(clock, key="k", now=0)
    second.restore(runtime.snapshot())
    assert second.next_wakeup() == 11_100
    later = second.advance(11_250)
    assert _decoded(later, "Clock") == {"Batches": [("IBM", 12)], "Gone": [("IBM", 2.0)]}
    # both fell due at 11_100 and fire at that time, not at 11_250
    assert sorted(m.origin for m in later) == [b"Clock-clock@clock:k|11100.1", b"Clock-clock@clock:k|11100.2"]
    assert [m.timestamp for m in later if m.topic == "Clock.Gone"] == [11_100]
    assert second.advance(11_250) == [] and second.next_wakeup() == 12_100  # timeBatch keeps its beat
    # with @app:playback time stays the events' own: no wake-ups, nothing moves without input
    playback = InstanceRuntime(_clock_instance("Clock", playback=True))
    assert playback.process([trade(0, 10_000, ("IBM", 1.0, 5))], now=99_000) == [] and playback.next_wakeup() is None


@pytest.mark.slow
@pytest.mark.broker
def test_wall_clock_windows_on_spark_emit_when_time_comes_without_new_input(spark, kafka, tmp_path):
    name = f"Clock{uuid.uuid4().hex[:8]}"
    clock = _clock_instance(name)
    for topic in (clock.inputs[0].topic, f"{name}.Batches", f"{name}.Gone"):
        kafka.ensure_topic(topic, 1)
    settings = QuerySettings(kafka.bootstrap_servers, str(tmp_path / clock.name), trigger_interval="200 milliseconds")
    query = start_query(spark, clock, settings)
    readers = {out: kafka.reader(f"{name}.{out}", {0: EARLIEST}, codec_for("json", schema)) for out, schema in (("Batches", BATCHES), ("Gone", GONE))}
    got: dict = {"Batches": [], "Gone": []}  # (row, its timestamp, wall-clock ms it was read at)
    try:
        # With processing-time timers every trigger runs a batch, so processAllAvailable() would
        # never return: wait for the first batch instead, so the events go in while it runs.
        wait_until(lambda: query.lastProgress is not None or not query.isActive, timeout=120, interval=0.1, what="the query's first batch")
        assert query.isActive, f"the query ended before its first batch: {query.exception()}"
        source = clock.inputs[0]
        publisher = kafka.publisher(source.topic, codec_for(source.codec, source.attributes), Partitioned(0, "symbol"))
        rows = [("IBM", 10.0, 5), ("WSO2", 20.0, 7), ("IBM", 30.0, 11)]
        sent = []
        for row in rows:
            sent.append(int(time.time() * 1000))
            publisher.send([row], [sent[-1]])
            publisher.flush()
            time.sleep(0.15)
        # nothing else is sent: only time passing can bring the outputs
        deadline = time.monotonic() + 60
        # until every event expired and every volume was counted in a batch (one batch, or two when
        # the events straddled a batch's end on a loaded machine)
        while (len(got["Gone"]) < len(rows) or sum(t for (_s, t), _, _ in got["Batches"]) < sum(v for _s, _p, v in rows)) and time.monotonic() < deadline:
            for out, reader in readers.items():
                got[out].extend((e.row, e.timestamp, int(time.time() * 1000)) for e in reader.poll(timeout=0.2).events)
    finally:
        query.stop()
        for reader in readers.values():
            reader.close()
    assert sorted(row for row, _, _ in got["Gone"]) == sorted((s, p) for s, p, _v in rows)
    for (symbol, price), stamp, read_at in got["Gone"]:
        # each expires a second after its own timestamp (later only if the engine got it later:
        # a loaded machine), and is read after that: a timer brought it, not a later event
        sent_at = sent[[(s, p) for s, p, _v in rows].index((symbol, price))]
        assert sent_at + 1000 <= stamp <= read_at, (symbol, stamp - sent_at, read_at - sent_at)
    totals = collections.Counter()
    for (symbol, total), _, _ in got["Batches"]:  # one batch, or two if a slow micro-batch straddled its end
        totals[symbol] += total
    assert dict(totals) == {"IBM": 16, "WSO2": 7}
    assert all(read_at >= sent[0] + 1000 for _, _, read_at in got["Batches"])


@pytest.mark.parametrize("group", ["filter", "average"])
def test_a_poll_of_many_messages_gives_what_they_give_one_by_one(group):
    """The worker sends a poll's messages in one engine call (send_each); outputs, their order and
    origins are those of one send per message, including several events in one message."""
    instance = _instance(group)
    source = instance.inputs[0]
    codec = codec_for(source.codec, source.attributes)
    rows, stamps = trades(600, seed=31)
    messages, offset = [], 0
    rng = random.Random(5)
    while rows:
        take = rng.choice([1, 1, 1, 2, 3])  # some messages carry several events (one chunk)
        chunk, rows = rows[:take], rows[take:]
        value = b"[" + b",".join(codec.encode(r) for r in chunk) + b"]" if take > 1 else codec.encode(chunk[0])
        messages.append(Message(source.topic, offset % 2, offset, stamps[offset], chunk[0][0].encode(), value))
        offset += 1
    now = stamps[-1] + 1  # one wall-clock time for both, so their snapshots compare
    one_by_one, batched = InstanceRuntime(instance, now=now), InstanceRuntime(instance, now=now)
    expected = [out for m in messages for out in one_by_one.process([m], now)]
    got = [out for start in range(0, len(messages), 97) for out in batched.process(messages[start : start + 97], now)]
    assert len(expected) > 100 and got == expected
    assert batched.snapshot() == one_by_one.snapshot()


COPY_APP = """@App:name('Copy')
@source(type = 'kafka', topic.list = 'raw', group.id = 'g', bootstrap.servers = 'x:1', @map(type = 'json'))
define stream Readings (deviceID string, power float, `at` long, ok bool);
@dist(execGroup = 'work', parallel = '2')
partition with (deviceID of Readings) begin from Readings[power > 0] select deviceID, sum(power) as total insert into Kept; end;
"""


@pytest.mark.parametrize(
    ("query", "copies"),
    [
        ("from S select * insert into T;", True),
        ("from S select * insert current events into T;", True),
        ("from S[x > 1] select * insert into T;", False),
        ("from S#window.length(2) select * insert into T;", False),
        ("from S select x, y insert into T;", False),
        ("from S select * output every 2 events insert into T;", False),
        ("from S select * insert expired events into T;", False),
        ("from S select * insert into T; from S select * insert into T;", False),
        ("from S select * insert into U;", False),
    ],
)
def test_only_a_plain_copy_of_a_stream_is_a_copy(query, copies):
    other = "define stream U (y double, x int);"
    app = parse(f"define stream S (x int, y double); define stream T (a int, b double); {other} {query}")
    assert identity_copy(app) == (("S", "T") if copies else None)


def test_a_passthrough_instance_publishes_what_the_engine_would():
    """A passthrough's events skip the engine (identity_copy); its messages are those of the same
    partial app run through the engine (a `[true]` filter keeps it there), nulls, floats and runs of
    events in one message included, and a bad message goes to the dead letter either way."""
    (instance,) = plan(parse(COPY_APP)).group("passthrough-Readings").instances
    copied = plan_instance(instance.name, instance.siddhi)
    engine = plan_instance(instance.name, instance.siddhi.replace("from passthroughReadings\n", "from passthroughReadings[true]\n"))
    assert identity_copy(parse(copied.siddhi)) and not identity_copy(parse(engine.siddhi))
    rng = random.Random(3)
    messages, good = [], 0
    for offset in range(300):
        rows = [
            {"deviceID": f"d{rng.randint(0, 9)}", "power": None if rng.random() < 0.1 else rng.uniform(-5, 5), "at": offset, "ok": rng.random() < 0.5}
            for _ in range(rng.choice([1, 1, 2, 3]))
        ]
        value = json.dumps(rows if len(rows) > 1 else {"event": rows[0]}).encode()
        good += len(rows) if offset != 17 else 0
        messages.append(Message("raw", offset % 2, offset // 2, 1_700_000_000_000 + offset, None, b"{junk" if offset == 17 else value))
    now = 1_700_000_001_000
    outputs = []
    for partial in (copied, engine):
        runtime = InstanceRuntime(partial, "Copy.deadletter", now=now)
        outputs.append([m for start in range(0, len(messages), 41) for m in runtime.process(messages[start : start + 41], now)])
        assert (runtime.rows_in, runtime.rows_out, runtime.rejected) == (good, good, 1)
    assert len(outputs[0]) > 500 and outputs[0] == outputs[1]


def test_a_copy_whose_streams_have_more_sinks_feeds_every_sink():
    # `from Readings select * insert into Copied` where Readings is published too and Copied twice.
    text = """@App:name('Sinks')
@source(type = 'kafka', topic.list = 'raw', group.id = 'g', bootstrap.servers = 'x:1', @map(type = 'json'))
@sink(type = 'kafka', topic = 'seen', @map(type = 'json'))
define stream Readings (deviceID string, power double);
@sink(type = 'kafka', topic = 'out', @map(type = 'json'))
@sink(type = 'kafka', topic = 'out2', @map(type = 'json'))
define stream Copied (deviceID string, power double);
@dist(execGroup = 'g1') from Readings select * insert into Copied;
"""
    (instance,) = plan(parse(text)).partial_apps
    runtime = InstanceRuntime(plan_instance(instance.name, instance.siddhi))
    values = [json.dumps({"event": {"deviceID": f"d{n}", "power": n / 2}}).encode() for n in range(5)]
    out = runtime.process([Message("raw", 0, n, 1000 + n, None, value) for n, value in enumerate(values)])
    assert collections.Counter(m.topic for m in out) == {"seen": 5, "out": 5, "out2": 5}
    # Each output is named after the message it stems from, and no two alike.
    assert len({m.origin for m in out}) == 15
    assert all(m.origin.decode().startswith(f"Sinks-g1>raw:0|{json.loads(m.value)['event']['deviceID'][1:]}.") for m in out)


def test_a_stateless_instance_that_forgets_publishes_a_batch_again_alike():
    # What micro-batch mode does before each task: a retried task must publish what the first attempt did.
    (instance,) = plan(parse(COPY_APP)).group("passthrough-Readings").instances
    runtime = InstanceRuntime(
        plan_instance(instance.name, instance.siddhi.replace("strategy = 'partitioned', partitionKey = 'deviceID'", "strategy = 'roundRobin'"))
    )
    messages = [
        Message("raw", 0, n, 1000 + n, None, json.dumps({"event": {"deviceID": f"d{n}", "power": 1.0, "at": n, "ok": True}}).encode()) for n in range(5)
    ]
    first = runtime.process(messages)
    assert runtime.process(messages) == []  # seen: dropped
    runtime.forget()
    assert runtime.process(messages) == first and len({m.partition for m in first}) == 2


def test_only_a_stateless_instance_whose_outputs_all_go_to_other_groups_runs_without_transactions():
    three = """@App:name('Feeds')
define stream In (symbol string, price double);
@sink(type = 'kafka', topic = 'Feeds.Seen', bootstrap.servers = 'localhost:9092', @map(type = 'json'))
define stream Seen (symbol string, price double);

@info(name = 'big') @dist(execGroup = 'filter', parallel = '2')
from In[price > 10] select symbol, price insert into Big;

@info(name = 'seen') @dist(execGroup = 'filter', parallel = '2')
from In[price > 100] select symbol, price insert into Seen;

@info(name = 'pass') @dist(execGroup = 'relay', parallel = '1')
from Big select symbol, price insert into Relayed;

@info(name = 'avg') @dist(execGroup = 'average', parallel = '1')
from Relayed#window.length(3) select symbol, avg(price) as price insert into Averages;
"""
    feeds = {}
    for text in (APP, three):
        for instance in plan(parse(text)).partial_apps:
            feeds[instance.name] = plan_instance(instance.name, instance.siddhi).feeds_groups_only
    assert feeds["Trades-filter-1"] and feeds["Feeds-relay-1"]  # stateless, every output to a group
    assert not feeds["Trades-average-1"] and not feeds["Feeds-average-1"]  # state (and the app's final topics)
    assert not feeds["Feeds-filter-1"]  # one output is a user sink: its turns stay transactions
