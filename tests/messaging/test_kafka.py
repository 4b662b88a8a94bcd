"""What only the Kafka transport does, against the real embedded broker (what all layers share: test_transports.py)."""

from __future__ import annotations

import time

import pytest

from sp_dagster.errors import BrokerUnavailable, TopicError
from sp_dagster.messaging import EARLIEST, BinaryCodec, JsonCodec, Partitioned, RoundRobin
from sp_dagster.messaging.kafka import KafkaTransport
from sp_dagster.messaging.strategies import partition_for_key
from tests.messaging.helpers import SCHEMA, publish, read_all

pytestmark = pytest.mark.broker


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


def committed_and_visible(transport: KafkaTransport, topic_name: str) -> tuple[int, list[bytes]]:
    """The offset group-<topic> committed on partition 0, and what a read_committed reader sees there."""
    from confluent_kafka import Consumer, TopicPartition

    group = Consumer(transport.client_config(**{"group.id": f"group-{topic_name}"}))
    committed = group.committed([TopicPartition(topic_name, 0)], timeout=10)[0].offset
    group.close()
    reader = Consumer(transport.client_config(**{"group.id": f"read-{topic_name}", "isolation.level": "read_committed", "enable.auto.commit": False}))
    reader.assign([TopicPartition(topic_name, 0, 0)])
    values, deadline = [], time.monotonic() + 5
    while time.monotonic() < deadline:
        message = reader.poll(0.2)
        if message is not None and not message.error():
            values.append(message.value())
    reader.close()
    return committed, values


@pytest.mark.parametrize("keep_trying", [True, False])
def test_a_transaction_the_broker_does_not_answer_in_time_is_committed_once_it_does_while_its_owner_keeps_trying(topic_name, keep_trying):
    import signal
    import threading

    from sp_dagster.embedded import EmbeddedBroker

    with EmbeddedBroker() as broker:
        transport = KafkaTransport(broker.bootstrap_servers, timeout=2)
        transport.ensure_topic(topic_name, 1)
        txn = transport.transactional_publisher(f"txn-{topic_name}", f"group-{topic_name}")
        txn.produce_all([(topic_name, b"first", None, 0, None, None)])
        txn.commit({(topic_name, 0): 5})
        txn.produce_all([(topic_name, b"second", None, 0, None, None)])
        broker.process.send_signal(signal.SIGSTOP)  # frozen: every request hangs past the 2 s timeout
        threading.Timer(5.0, broker.process.send_signal, (signal.SIGCONT,)).start()
        if keep_trying:
            txn.commit({(topic_name, 0): 9}, retry_while=lambda: True)
        else:
            with pytest.raises(BrokerUnavailable, match="committing a transaction"):
                txn.commit({(topic_name, 0): 9})
            time.sleep(5)  # the broker answers again; the transaction stays unresolved
        committed, values = committed_and_visible(transport, topic_name)
    if keep_trying:  # committed once the broker answered: its messages and its offsets together
        assert (values, committed) == ([b"first", b"second"], 9)
    else:  # given up: only what committed before is visible or counted
        assert (values, committed) == ([b"first"], 5)


@pytest.mark.slow
@pytest.mark.timeout(180, method="thread")  # what this guards against is a call that never returns (in C: no signal reaches it)
def test_a_transaction_over_a_broker_killed_and_started_again_commits_or_is_given_up_and_never_hangs(topic_name):
    # librdkafka's send_offsets_to_transaction ignores its timeout once the group coordinator went
    # away (confluentinc/librdkafka#5456): after a broker restart it waited forever. The broker
    # keeps its data in our S3 stand-in (a mock: no object store runs here).
    from sp_dagster.embedded.s3 import EmbeddedS3

    with EmbeddedS3() as s3, s3.broker() as broker:
        transport = KafkaTransport(broker.bootstrap_servers, timeout=5)
        transport.ensure_topic(topic_name, 1)
        txn = transport.transactional_publisher(f"txn-{topic_name}", f"group-{topic_name}")
        txn.produce_all([(topic_name, b"first", None, 0, None, None)])
        txn.commit({(topic_name, 0): 1})
        broker.crash()
        broker.start()
        txn.produce_all([(topic_name, b"second", None, 0, None, None)])
        try:
            txn.commit({(topic_name, 0): 2}, retry_while=lambda: True)
            given_up = False
        except BrokerUnavailable as exc:
            given_up = True
            assert "did not return from sending the input offsets" in str(exc) and txn.stuck
        txn.close()
        successor = transport.transactional_publisher(f"txn-{topic_name}", f"group-{topic_name}")  # fences the first
        successor.produce_all([(topic_name, b"third", None, 0, None, None)])
        successor.commit({(topic_name, 0): 3})
        successor.close()
        committed, values = committed_and_visible(transport, topic_name)
        transport.close()
    assert committed == 3
    # What committed is there, in order; a given-up transaction's message may show (tansu lets an
    # open transaction through when its successor starts: the worker's output marks catch that).
    allowed = [[b"first", b"second", b"third"]] + ([[b"first", b"third"]] if given_up else [])
    assert values in allowed


def test_the_broker_is_asked_to_abort_a_transaction_left_open_for_the_fence_window():
    from sp_dagster.messaging.kafka import _abandon_after

    assert _abandon_after(None, {}) == {}
    assert _abandon_after(7.25, {}) == {"transaction.timeout.ms": 7250}
    assert _abandon_after(0.2, {}) == {"transaction.timeout.ms": 1000}  # Kafka's floor
    assert _abandon_after(8, {"socket.timeout.ms": "60000"}) == {"transaction.timeout.ms": 8000, "socket.timeout.ms": 8100}
    assert _abandon_after(8, {"transaction.timeout.ms": 30000}) == {}  # the user's own setting wins


def test_transactions_with_a_short_abort_time_commit_even_with_a_long_user_socket_timeout(broker, topic_name):
    # The abort itself is not shown here: the embedded broker (tansu) has no transaction timeout. This
    # checks that librdkafka and the broker accept the setting with a user's socket.timeout.ms beside it.
    transport = KafkaTransport(broker.bootstrap_servers, {"socket.timeout.ms": "60000"}, timeout=15)
    transport.ensure_topic(topic_name, 1)
    txn = transport.transactional_publisher(f"txn-{topic_name}", f"group-{topic_name}", abandoned_after_s=3.0)
    txn.produce_all([(topic_name, b"one", None, 0, None, None)])
    txn.commit({(topic_name, 0): 4})
    txn.close()
    assert committed_and_visible(transport, topic_name) == (4, [b"one"])
    transport.close()


def test_several_empty_topics_grown_by_one_transport_on_a_broker_that_recreates_them(kafka, topic_name):
    # tansu cannot add partitions, so an empty topic is deleted and created again; a librdkafka
    # client that knew the old topic crashed the process when it met the new one (a segfault).
    names = [f"{topic_name}-{n}" for n in range(3)]
    for name in names:
        kafka.ensure_topic(name, 2)
    assert [kafka.ensure_topic(name, 3).partitions for name in names] == [3, 3, 3]
    assert [kafka.topic_info(name).partitions for name in names] == [3, 3, 3]


class AbortRecorder:
    """A producer that counts the aborts asked of it (everything else goes to the real one)."""

    def __init__(self, producer):
        self.producer, self.aborts = producer, 0

    def abort_transaction(self, *args):
        self.aborts += 1
        return self.producer.abort_transaction(*args)

    def __getattr__(self, name):
        return getattr(self.producer, name)


def test_a_publisher_closed_after_its_owners_lease_ended_leaves_its_transaction_to_the_successor(broker, topic_name):
    # A late abort of an older epoch (a broker that does not fence it, like the embedded one) would drop
    # outputs the successor found on the topic and counted as published: past the lease, nothing is sent.
    transport = KafkaTransport(broker.bootstrap_servers, timeout=15)
    transport.ensure_topic(topic_name, 1)
    closed = {}
    for lease_left in (5.0, 0.0):
        txn = transport.transactional_publisher(f"txn-{topic_name}-{lease_left}", f"group-{topic_name}")
        txn.time_left = lambda left=lease_left: left
        txn.produce_all([(topic_name, b"open", None, 0, None, None)])
        txn.producer = recorder = AbortRecorder(txn.producer)
        txn.close()
        closed[lease_left] = recorder.aborts
    assert closed == {5.0: 1, 0.0: 0}
    ends, with_open = transport.end_offsets(topic_name), transport.end_offsets_with_open_transactions(topic_name)
    assert with_open[0] > ends[0]  # the second one's transaction is still open: its successor resolves it
    transport.close()


def test_group_offsets_are_committed_without_waiting_and_read_back_by_the_next_owner(kafka, topic_name):
    kafka.ensure_topic(topic_name, 2)
    group = f"offsets-{topic_name}"
    first = kafka.group_offsets(group)
    assert first.committed([(topic_name, 0), (topic_name, 1)]) == {}
    for n in range(1, 50):  # one per turn, none waited for
        first.commit({(topic_name, 0): n, (topic_name, 1): 2 * n}, f"{n}:stamp")
    first.close()  # waits for those in flight
    second = kafka.group_offsets(group)
    try:
        assert {place: offset for place, (offset, _meta) in second.committed([(topic_name, 0), (topic_name, 1)]).items()} == {
            (topic_name, 0): 49,
            (topic_name, 1): 98,
        }
    finally:
        second.close()


def test_an_owner_whose_claim_ended_lets_go_of_its_clients_at_once_with_the_broker_out_of_reach(tmp_path, topic_name):
    import signal

    from sp_dagster.embedded import EmbeddedBroker

    with EmbeddedBroker(log_path=tmp_path / "tansu.log") as own:
        transport = KafkaTransport(own.bootstrap_servers, timeout=15)
        transport.ensure_topic(topic_name, 1)
        publisher, offsets = transport.raw_publisher(), transport.group_offsets(f"left-{topic_name}")
        assert own.process is not None
        own.process.send_signal(signal.SIGSTOP)  # every request hangs, as across a cut network
        try:
            publisher.produce_all([(topic_name, b"queued", None, 0, None, None)])
            offsets.commit({(topic_name, 0): 1})
            started = time.monotonic()
            publisher.leave()
            offsets.close(wait=False)
            took = time.monotonic() - started
        finally:
            own.process.send_signal(signal.SIGCONT)
            transport.close()
    assert took < 1.0, f"letting go took {took:.1f} s"
