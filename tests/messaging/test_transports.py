"""What every messaging layer does alike, on Kafka (the embedded broker) and on NATS JetStream (a real nats-server)."""

from __future__ import annotations

import collections
import time

import pytest

from sp_dagster.errors import TopicError
from sp_dagster.messaging import EARLIEST, LATEST, BinaryCodec, Broadcast, JsonCodec, Partitioned, RoundRobin
from sp_dagster.messaging.codecs import RawCodec
from sp_dagster.messaging.strategies import key_string, partition_for_key
from tests.messaging.helpers import SCHEMA, poll_until, publish, read_all


@pytest.fixture(params=[pytest.param("kafka", marks=pytest.mark.broker), pytest.param("nats", marks=pytest.mark.nats)])
def transport(request):
    """The Kafka transport, then the NATS one."""
    return request.getfixturevalue(request.param)


def test_create_topic_and_keep_existing(transport, topic_name):
    assert transport.ensure_topic(topic_name, 3).partitions == 3
    assert transport.topic_info(topic_name).partitions == 3
    # Asking again, or for fewer, changes nothing: topics are never shrunk.
    assert transport.ensure_topic(topic_name, 3).partitions == 3
    assert transport.ensure_topic(topic_name, 1).partitions == 3
    assert transport.list_topics()[topic_name].partitions == 3


def test_round_robin_spreads_evenly(transport, topic_name):
    transport.ensure_topic(topic_name, 3)
    rows = [(f"S{i}", float(i), i) for i in range(9)]
    assert publish(transport, topic_name, RoundRobin(), rows) == 9
    events, _, positions = read_all(transport, topic_name, range(3), JsonCodec(SCHEMA), 9)
    assert collections.Counter(e.partition for e in events) == {0: 3, 1: 3, 2: 3}
    assert sorted(e.row for e in events) == sorted(rows)
    assert positions == transport.end_offsets(topic_name)


def test_partitioned_routes_each_key_to_its_partition_with_the_key(transport, topic_name):
    transport.ensure_topic(topic_name, 4)
    rows = [(symbol, float(i), i) for i in range(40) for symbol in ("IBM", "WSO2", "ORCL", "MSFT", "GOOG")]
    publish(transport, topic_name, Partitioned(key_index=0, key_name="symbol"), rows)
    events, _, _ = read_all(transport, topic_name, range(4), JsonCodec(SCHEMA), len(rows))
    assert len(events) == len(rows)
    seen = collections.defaultdict(set)
    for event in events:
        seen[event.row[0]].add(event.partition)
        assert event.key == event.row[0].encode()
    for symbol, partitions in seen.items():
        assert partitions == {partition_for_key(key_string(symbol).encode(), 4)}  # what Kafka's Java client picks
    # Within one partition, a key's events keep their publishing order.
    ibm = [e.row[2] for e in sorted(events, key=lambda e: e.offset) if e.row[0] == "IBM"]
    assert ibm == sorted(ibm)


def test_broadcast_reaches_every_partition(transport, topic_name):
    transport.ensure_topic(topic_name, 3)
    rows = [("A", 1.0, 1), ("B", 2.0, 2)]
    assert publish(transport, topic_name, Broadcast(), rows) == 6
    events, _, _ = read_all(transport, topic_name, range(3), JsonCodec(SCHEMA), 6)
    for partition in range(3):
        assert [e.row for e in events if e.partition == partition] == rows


def test_raw_messages_round_trip_key_timestamp_and_headers_exactly(transport, topic_name):
    transport.ensure_topic(topic_name, 2)
    origin = bytes(range(256)) + b"\r\n: spaces and = signs "
    raw = transport.raw_publisher()
    raw.produce(topic_name, b"\x00value", b"\xffkey", 1, 1_700_000_000_123, headers=[("sp-origin", origin), ("other", b"x"), ("sp-origin", b"last")])
    raw.produce(topic_name, b"plain", None, 1, None)
    raw.close()
    reader = transport.reader(topic_name, {1: EARLIEST}, RawCodec())
    first, second = poll_until(reader, 2)
    reader.close()
    assert (first.row, first.key, first.timestamp) == ((b"\x00value",), b"\xffkey", 1_700_000_000_123)
    assert first.headers == (("sp-origin", origin), ("other", b"x"), ("sp-origin", b"last")) and first.header("sp-origin") == b"last"
    # Without an event timestamp the broker's time stands in.
    assert (second.row, second.key, second.headers) == ((b"plain",), None, ()) and abs(second.timestamp - time.time() * 1000) < 60_000


def test_a_reader_resumes_exactly_where_another_stopped(transport, topic_name):
    transport.ensure_topic(topic_name, 2)
    codec = BinaryCodec(SCHEMA)
    publish(transport, topic_name, RoundRobin(), [("A", 1.0, i) for i in range(10)], codec)
    reader = transport.reader(topic_name, {0: EARLIEST, 1: EARLIEST}, codec)
    first = poll_until(reader, 4, max_events=1)[:4]
    reader.close()
    # Resume each partition at the position after the last event taken from it.
    taken = {p: max([e.offset for e in first if e.partition == p], default=None) for p in (0, 1)}
    starts = {p: EARLIEST if o is None else o + 1 for p, o in taken.items()}
    resumed = transport.reader(topic_name, starts, codec)
    rest = poll_until(resumed, 6)
    assert resumed.positions() == transport.end_offsets(topic_name)
    resumed.close()
    assert sorted(e.row[2] for e in first + rest) == list(range(10))


def test_a_reader_counts_its_wait_for_input_and_not_its_reading(transport, topic_name):
    """What the busy fraction of an instance rests on: time waiting for a first message is not work."""
    transport.ensure_topic(topic_name, 1)
    codec = BinaryCodec(SCHEMA)
    publish(transport, topic_name, RoundRobin(), [("A", 1.0, i) for i in range(500)], codec)
    reader = transport.reader(topic_name, {0: EARLIEST}, codec)
    poll_until(reader, 500)
    before, started = reader.waited_s, time.monotonic()
    assert not reader.poll(100, 0.5).events  # nothing more to read: the whole poll was a wait
    waited, took = reader.waited_s - before, time.monotonic() - started
    reader.close()
    assert 0.45 <= waited <= took, (waited, took)


def test_latest_reads_only_new_events(transport, topic_name):
    transport.ensure_topic(topic_name, 1)
    codec = JsonCodec(SCHEMA)
    publish(transport, topic_name, RoundRobin(), [("old", 1.0, 1)] * 5)
    reader = transport.reader(topic_name, {0: LATEST}, codec)
    start = reader.positions()[0]
    assert start == transport.end_offsets(topic_name)[0]
    publish(transport, topic_name, RoundRobin(), [("new", 2.0, 2)])
    got = poll_until(reader, 1, timeout=10)
    reader.close()
    assert [(e.offset, e.row[0]) for e in got] == [(start, "new")]


def test_undecodable_events_are_rejected_with_reason_and_nothing_else_is_lost(transport, topic_name):
    transport.ensure_topic(topic_name, 1)
    raw = transport.raw_publisher()
    for payload in [
        b'{"symbol": "A", "price": 1, "volume": 1}',
        b"garbage",
        b'{"symbol": "B", "price": "x", "volume": 2}',
        b'{"symbol": "C", "price": 3, "volume": 3}',
    ]:
        raw.produce(topic_name, payload, None, 0, None)
    raw.close()
    events, rejects, positions = read_all(transport, topic_name, [0], JsonCodec(SCHEMA), 4)
    assert [e.row for e in events] == [("A", 1.0, 1), ("C", 3.0, 3)]
    assert [r.data for r in rejects] == [b"garbage", b'{"symbol": "B", "price": "x", "volume": 2}']
    assert events[0].offset < rejects[0].offset < rejects[1].offset < events[1].offset
    assert "not valid JSON" in rejects[0].reason and "attribute 'price'" in rejects[1].reason
    assert positions == {0: events[1].offset + 1}


def test_many_events_arrive_in_order_per_partition(transport, topic_name):
    transport.ensure_topic(topic_name, 3)
    codec = BinaryCodec(SCHEMA)
    rows = [(f"K{i % 7}", float(i), i) for i in range(20_000)]
    publish(transport, topic_name, Partitioned(0), rows, codec)
    events, _, _ = read_all(transport, topic_name, range(3), codec, len(rows), timeout=60)
    assert len(events) == len(rows)
    for partition in range(3):
        volumes = [e.row[2] for e in events if e.partition == partition]
        assert volumes == sorted(volumes)


def test_missing_topic_is_a_clear_error(transport):
    with pytest.raises(TopicError, match="topic 'no.such.topic' does not exist on .*deploy"):
        transport.publisher("no.such.topic", JsonCodec(SCHEMA), RoundRobin())
    with pytest.raises(TopicError, match="does not exist"):
        transport.reader("no.such.topic", {0: 0}, JsonCodec(SCHEMA))
    with pytest.raises(TopicError, match="does not exist"):
        transport.end_offsets("no.such.topic")


def test_reading_a_partition_the_topic_lacks(transport, topic_name):
    transport.ensure_topic(topic_name, 2)
    with pytest.raises(TopicError, match=r"partitions 0\.\.1; cannot read partition \[5\]"):
        transport.reader(topic_name, {5: 0}, JsonCodec(SCHEMA))
