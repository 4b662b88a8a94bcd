"""The Kafka transport against the real embedded broker: topics, strategies, offsets, failures."""

from __future__ import annotations

import collections
import time

import pytest

from sp_dagster.errors import BrokerUnavailable, TopicError
from sp_dagster.messaging import EARLIEST, LATEST, Broadcast, JsonCodec, BinaryCodec, Partitioned, RoundRobin
from sp_dagster.messaging.kafka import KafkaTransport
from sp_dagster.messaging.strategies import key_string, partition_for_key

pytestmark = pytest.mark.broker

SCHEMA = [("symbol", "string"), ("price", "double"), ("volume", "long")]


def read_all(transport, topic, partitions, codec, expected, timeout=15.0):
    """Read the given partitions from the start until `expected` events (and rejects) arrived."""
    reader = transport.reader(topic, {p: EARLIEST for p in partitions}, codec)
    events, rejects = [], []
    deadline = time.monotonic() + timeout
    try:
        while len(events) + len(rejects) < expected and time.monotonic() < deadline:
            batch = reader.poll(timeout=0.5)
            events += batch.events
            rejects += batch.rejects
        # Nothing more than expected may arrive.
        extra = reader.poll(timeout=0.5)
        events += extra.events
        rejects += extra.rejects
        return events, rejects, reader.positions()
    finally:
        reader.close()


def publish(transport, topic, strategy, rows, codec=None, timestamps=None):
    publisher = transport.publisher(topic, codec or JsonCodec(SCHEMA), strategy)
    sent = publisher.send(rows, timestamps)
    publisher.flush()
    return sent


def test_create_topic_and_keep_existing(kafka, topic_name):
    assert kafka.ensure_topic(topic_name, 3).partitions == 3
    assert kafka.topic_info(topic_name).partitions == 3
    # Asking again, or for fewer, changes nothing: topics are never shrunk.
    assert kafka.ensure_topic(topic_name, 3).partitions == 3
    assert kafka.ensure_topic(topic_name, 1).partitions == 3
    assert topic_name in kafka.list_topics()


def test_grow_an_empty_topic(kafka, topic_name):
    kafka.ensure_topic(topic_name, 1)
    assert kafka.ensure_topic(topic_name, 4).partitions == 4
    assert kafka.topic_info(topic_name).partitions == 4


def test_growing_a_topic_that_holds_events_never_loses_them(kafka, topic_name):
    kafka.ensure_topic(topic_name, 1)
    publish(kafka, topic_name, RoundRobin(), [("A", 1.0, 1), ("B", 2.0, 2)])
    try:
        info = kafka.ensure_topic(topic_name, 3)
    except TopicError as exc:  # the broker cannot add partitions (tansu): say so, keep the data
        assert "cannot add partitions" in str(exc) and topic_name in str(exc) and "holds 2 events" in str(exc)
        assert kafka.topic_info(topic_name).partitions == 1
    else:  # a broker with CreatePartitions grows it in place
        assert info.partitions == 3
    events, _, _ = read_all(kafka, topic_name, [0], JsonCodec(SCHEMA), 2)
    assert [e.row for e in events] == [("A", 1.0, 1), ("B", 2.0, 2)]


def test_invalid_topic_names_are_rejected(kafka):
    with pytest.raises(TopicError, match="not a valid Kafka topic name"):
        kafka.ensure_topic("bad topic/name", 1)
    with pytest.raises(TopicError, match="at least 1 partition"):
        kafka.ensure_topic("fine.name", 0)


def test_round_robin_spreads_evenly(kafka, topic_name):
    kafka.ensure_topic(topic_name, 3)
    rows = [(f"S{i}", float(i), i) for i in range(9)]
    assert publish(kafka, topic_name, RoundRobin(), rows) == 9
    events, _, positions = read_all(kafka, topic_name, range(3), JsonCodec(SCHEMA), 9)
    per_partition = collections.Counter(e.partition for e in events)
    assert per_partition == {0: 3, 1: 3, 2: 3}
    assert sorted(e.row for e in events) == sorted(rows)
    assert positions == {0: 3, 1: 3, 2: 3}


def test_partitioned_routes_each_key_to_its_partition(kafka, topic_name):
    kafka.ensure_topic(topic_name, 4)
    rows = [(symbol, float(i), i) for i in range(40) for symbol in ("IBM", "WSO2", "ORCL", "MSFT", "GOOG")]
    publish(kafka, topic_name, Partitioned(key_index=0, key_name="symbol"), rows)
    events, _, _ = read_all(kafka, topic_name, range(4), JsonCodec(SCHEMA), len(rows))
    assert len(events) == len(rows)
    seen = collections.defaultdict(set)
    for event in events:
        seen[event.row[0]].add(event.partition)
    for symbol, partitions in seen.items():
        assert partitions == {partition_for_key(key_string(symbol).encode(), 4)}
    # Within one partition, a key's events keep their publishing order.
    ibm = [e.row[2] for e in sorted(events, key=lambda e: e.offset) if e.row[0] == "IBM"]
    assert ibm == sorted(ibm)


def test_partitioned_sets_the_message_key(kafka, broker, topic_name):
    from confluent_kafka import Consumer, TopicPartition

    kafka.ensure_topic(topic_name, 2)
    publish(kafka, topic_name, Partitioned(key_index=1, key_name="price"), [("A", 7.0, 1)])
    partition = partition_for_key(b"7.0", 2)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "key-check"})
    consumer.assign([TopicPartition(topic_name, partition, 0)])
    try:
        message = None
        deadline = time.monotonic() + 10
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
        assert message is not None and message.error() is None
        assert message.key() == b"7.0"
    finally:
        consumer.close()


def test_broadcast_reaches_every_partition(kafka, topic_name):
    kafka.ensure_topic(topic_name, 3)
    rows = [("A", 1.0, 1), ("B", 2.0, 2)]
    assert publish(kafka, topic_name, Broadcast(), rows) == 6
    events, _, _ = read_all(kafka, topic_name, range(3), JsonCodec(SCHEMA), 6)
    for partition in range(3):
        assert [e.row for e in events if e.partition == partition] == rows


def test_consume_from_given_offsets_with_timestamps(kafka, topic_name):
    kafka.ensure_topic(topic_name, 2)
    codec = BinaryCodec(SCHEMA)
    rows = [(f"S{i}", i * 1.5, i) for i in range(10)]
    publish(kafka, topic_name, RoundRobin(), rows, codec, timestamps=[1_000 + i for i in range(10)])
    # Partition 0 holds rows 0,2,4,6,8 at offsets 0..4; start it at offset 3. Partition 1 from its start.
    reader = kafka.reader(topic_name, {0: 3, 1: EARLIEST}, codec)
    got = []
    deadline = time.monotonic() + 15
    while len(got) < 7 and time.monotonic() < deadline:
        got += reader.poll(timeout=0.5).events
    positions = reader.positions()
    reader.close()
    from_zero = [(e.offset, e.row[2], e.timestamp) for e in got if e.partition == 0]
    assert from_zero == [(3, 6, 1006), (4, 8, 1008)]
    assert [e.row[2] for e in got if e.partition == 1] == [1, 3, 5, 7, 9]
    assert positions == {0: 5, 1: 5}
    assert kafka.end_offsets(topic_name) == {0: 5, 1: 5}


def test_latest_reads_only_new_events(kafka, topic_name):
    kafka.ensure_topic(topic_name, 1)
    codec = JsonCodec(SCHEMA)
    publish(kafka, topic_name, RoundRobin(), [("old", 1.0, 1)] * 5)
    reader = kafka.reader(topic_name, {0: LATEST}, codec)
    assert reader.positions() == {0: 5}
    publish(kafka, topic_name, RoundRobin(), [("new", 2.0, 2)])
    got = []
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        got += reader.poll(timeout=0.5).events
    reader.close()
    assert [(e.offset, e.row[0]) for e in got] == [(5, "new")]


def test_undecodable_events_are_rejected_with_reason_and_nothing_else_is_lost(kafka, topic_name):
    from confluent_kafka import Producer

    kafka.ensure_topic(topic_name, 1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for payload in [b'{"symbol": "A", "price": 1, "volume": 1}', b"garbage", b'{"symbol": "B", "price": "x", "volume": 2}', b'{"symbol": "C", "price": 3, "volume": 3}']:
        producer.produce(topic_name, payload, partition=0)
    producer.flush(10)
    events, rejects, positions = read_all(kafka, topic_name, [0], JsonCodec(SCHEMA), 4)
    assert [e.row for e in events] == [("A", 1.0, 1), ("C", 3.0, 3)]
    assert [(r.offset, r.data) for r in rejects] == [(1, b"garbage"), (2, b'{"symbol": "B", "price": "x", "volume": 2}')]
    assert "not valid JSON" in rejects[0].reason and "attribute 'price'" in rejects[1].reason
    assert positions == {0: 4}


def test_missing_topic_is_a_clear_error(kafka):
    with pytest.raises(TopicError, match="topic 'no.such.topic' does not exist on .*deploy"):
        kafka.publisher("no.such.topic", JsonCodec(SCHEMA), RoundRobin())
    with pytest.raises(TopicError, match="does not exist"):
        kafka.reader("no.such.topic", {0: 0}, JsonCodec(SCHEMA))


def test_reading_a_partition_the_topic_lacks(kafka, topic_name):
    kafka.ensure_topic(topic_name, 2)
    with pytest.raises(TopicError, match=r"partitions 0\.\.1; cannot read partition\(s\) \[5\]"):
        kafka.reader(topic_name, {5: 0}, JsonCodec(SCHEMA))


def test_unreachable_broker_names_the_address():
    from sp_dagster.embedded import free_port

    address = f"127.0.0.1:{free_port()}"
    transport = KafkaTransport(address, timeout=2)
    with pytest.raises(BrokerUnavailable) as caught:
        transport.ensure_topic("anything", 1)
    message = str(caught.value)
    assert address in message and "sp-dagster broker" in message and "bootstrapURLs" in message


@pytest.mark.slow
def test_broker_going_away_fails_publishing_clearly_and_reading_survives(topic_name):
    from sp_dagster.embedded import EmbeddedBroker

    broker = EmbeddedBroker().start()
    try:
        transport = KafkaTransport(broker.bootstrap_servers, timeout=3)
        transport.ensure_topic(topic_name, 1)
        codec = JsonCodec(SCHEMA)
        publisher = transport.publisher(topic_name, codec, RoundRobin())
        reader = transport.reader(topic_name, {0: EARLIEST}, codec)
    finally:
        broker.stop()
    # Reading during the outage returns nothing and does not raise: the client reconnects by itself.
    assert reader.poll(timeout=1.0).events == []
    reader.close()
    publisher.send([("A", 1.0, 1)])
    with pytest.raises(BrokerUnavailable, match=rf"not acknowledged within 3s by {broker.bootstrap_servers}; is the broker running"):
        publisher.flush(timeout=3)
