"""What only the NATS JetStream transport does, against a real nats-server (what all layers share: test_transports.py)."""

from __future__ import annotations

import subprocess
import time

import pytest

from sp_dagster.errors import BrokerUnavailable, ConfigError, JetStreamUnavailable, MessagingError, TopicError
from sp_dagster.messaging import EARLIEST, BinaryCodec, Broadcast, JsonCodec, Partitioned, RoundRobin
from sp_dagster.messaging.nats import NatsTransport
from sp_dagster.messaging.strategies import partition_for_key
from tests.fixtures.waiting import wait_until
from tests.messaging.helpers import SCHEMA, publish, read_all

pytestmark = pytest.mark.nats


def test_growing_a_topic_keeps_its_events(nats, topic_name):
    nats.ensure_topic(topic_name, 1)
    publish(nats, topic_name, RoundRobin(), [("A", 1.0, 1), ("B", 2.0, 2)])
    assert nats.ensure_topic(topic_name, 3).partitions == 3  # JetStream adds subjects in place
    assert nats.topic_info(topic_name).partitions == 3
    publish(nats, topic_name, Broadcast(), [("C", 3.0, 3)])
    events, _, _ = read_all(nats, topic_name, range(3), JsonCodec(SCHEMA), 5)
    assert [e.row for e in events if e.partition == 0] == [("A", 1.0, 1), ("B", 2.0, 2), ("C", 3.0, 3)]
    assert [e.row for e in events if e.partition != 0] == [("C", 3.0, 3)] * 2


def test_delete_topic(nats, topic_name):
    nats.ensure_topic(topic_name, 2)
    nats.delete_topic(topic_name)
    assert nats.topic_info(topic_name) is None and topic_name not in nats.list_topics()
    nats.delete_topic(topic_name)  # deleting what is gone is fine


def test_two_clusters_on_one_server_never_collide(nats, nats_server, topic_name):
    other = NatsTransport(nats_server.url, nats.cluster_id + "-other", timeout=15)
    try:
        nats.ensure_topic(topic_name, 1)
        other.ensure_topic(topic_name, 2)
        publish(nats, topic_name, RoundRobin(), [("mine", 1.0, 1)])
        publish(other, topic_name, RoundRobin(), [("theirs", 2.0, 2)] * 2)
        assert nats.list_topics() == {topic_name: nats.topic_info(topic_name)}
        assert nats.topic_info(topic_name).partitions == 1 and other.topic_info(topic_name).partitions == 2
        events, _, _ = read_all(nats, topic_name, [0], JsonCodec(SCHEMA), 1)
        assert [e.row[0] for e in events] == ["mine"]
        other.delete_topic(topic_name)
        assert nats.topic_info(topic_name) is not None
    finally:
        other.close()


def test_invalid_names_are_rejected(nats, nats_server):
    with pytest.raises(TopicError, match="not a valid topic name"):
        nats.ensure_topic("bad topic/name", 1)
    with pytest.raises(TopicError, match="not a valid topic name"):
        nats.ensure_topic("a..b", 1)
    with pytest.raises(TopicError, match="at least 1 partition"):
        nats.ensure_topic("fine.name", 0)
    with pytest.raises(ConfigError, match="clusterId 'a.b' cannot name NATS streams"):
        NatsTransport(nats_server.url, "a.b")


def test_consume_from_given_offsets_with_timestamps_and_resume_exactly(nats, topic_name):
    nats.ensure_topic(topic_name, 2)
    codec = BinaryCodec(SCHEMA)
    rows = [(f"S{i}", i * 1.5, i) for i in range(10)]
    publish(nats, topic_name, RoundRobin(), rows, codec, timestamps=[1_000 + i for i in range(10)])
    # Partition 0 holds rows 0,2,4,6,8 at sequences 1,3,5,7,9; start it at 7. Partition 1 from its start.
    reader = nats.reader(topic_name, {0: 7, 1: EARLIEST}, codec)
    got = []
    deadline = time.monotonic() + 15
    while len(got) < 7 and time.monotonic() < deadline:
        got += reader.poll(timeout=0.5).events
    assert [(e.offset, e.row[2], e.timestamp) for e in got if e.partition == 0] == [(7, 6, 1006), (9, 8, 1008)]
    assert [e.row[2] for e in got if e.partition == 1] == [1, 3, 5, 7, 9]
    assert reader.positions() == {0: 10, 1: 11} == nats.end_offsets(topic_name)
    reader.close()
    # A reader started where another stopped (after 2 events of partition 1) yields the next event first.
    resumed = nats.reader(topic_name, {1: [e.offset for e in got if e.partition == 1][1] + 1}, codec)
    again = []
    while len(again) < 3 and time.monotonic() < deadline:
        again += resumed.poll(max_events=1, timeout=0.5).events
    resumed.close()
    assert [e.row[2] for e in again] == [5, 7, 9]


def test_an_empty_partition_ends_at_zero(nats, topic_name):
    nats.ensure_topic(topic_name, 2)
    assert nats.end_offsets(topic_name) == {0: 0, 1: 0}
    publish(nats, topic_name, Partitioned(0), [("IBM", 1.0, 1)])
    ends = nats.end_offsets(topic_name)
    busy = partition_for_key(b"IBM", 2)
    assert ends == {busy: 2, 1 - busy: 0}


def test_publishing_to_a_partition_the_topic_lacks_fails_on_flush(nats, topic_name):
    nats.ensure_topic(topic_name, 1)
    raw = nats.raw_publisher()
    raw.produce(topic_name, b"x", None, 3, None)
    with pytest.raises(MessagingError, match=rf"1 event could not be published to '{topic_name}'.*partition does not exist"):
        raw.flush()


def test_unreachable_server_names_the_address():
    from sp_dagster.embedded import free_port

    address = f"nats://127.0.0.1:{free_port()}"
    transport = NatsTransport(address, "c1", timeout=2)
    with pytest.raises(BrokerUnavailable) as caught:
        transport.ensure_topic("anything", 1)
    message = str(caught.value)
    assert address in message and "sp-dagster nats" in message and "natsServerUrl" in message


def test_a_server_without_jetstream_says_so(tmp_path):
    from sp_dagster.embedded import free_port, nats_server_binary, port_open

    port = free_port()
    process = subprocess.Popen([nats_server_binary(), "--addr", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: port_open("127.0.0.1", port), timeout=10, what=f"nats-server listening on port {port}")
        with pytest.raises(JetStreamUnavailable, match=rf"JetStream is not enabled on the NATS server at nats://127.0.0.1:{port}; start nats-server with -js"):
            NatsTransport(f"127.0.0.1:{port}", "c1", timeout=5).list_topics()
    finally:
        process.terminate()
        process.wait(10)


@pytest.mark.slow
def test_server_going_away_fails_publishing_clearly_and_reading_survives(topic_name, tmp_path):
    from sp_dagster.embedded import EmbeddedNatsServer

    server = EmbeddedNatsServer(store_dir=tmp_path / "store").start()
    transport = NatsTransport(server.url, "c1", timeout=3)
    try:
        transport.ensure_topic(topic_name, 1)
        codec = JsonCodec(SCHEMA)
        publisher = transport.publisher(topic_name, codec, RoundRobin())
        reader = transport.reader(topic_name, {0: EARLIEST}, codec)
    finally:
        server.stop()
    # Reading during the outage returns nothing and does not raise: the client reconnects by itself.
    assert reader.poll(timeout=1.0).events == []
    reader.close()
    publisher.send([("A", 1.0, 1)])
    with pytest.raises(BrokerUnavailable, match=rf"not acknowledged within 3s by {server.url}; is the NATS server running"):
        publisher.flush(timeout=3)
    transport.close()


def test_one_raw_publisher_serves_several_threads(nats, topic_name):
    import threading

    from sp_dagster.messaging.codecs import RawCodec

    nats.ensure_topic(topic_name, 2)
    raw = nats.raw_publisher()

    def produce(partition):
        for i in range(3000):
            raw.produce(topic_name, str(i).encode(), None, partition, None)

    threads = [threading.Thread(target=produce, args=(p,)) for p in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    raw.close()
    events, _, _ = read_all(nats, topic_name, [0, 1], RawCodec(), 6000)
    for partition in (0, 1):
        assert [int(e.row[0]) for e in events if e.partition == partition] == list(range(3000))


def test_an_event_over_the_servers_max_payload_is_refused_alone_and_the_connection_stays(nats, topic_name):
    from sp_dagster.messaging.errors import MessageTooLarge

    nats.ensure_topic(topic_name, 1)
    publisher = nats.raw_publisher()
    limit = publisher.max_message_bytes
    assert limit == 1024 * 1024  # nats-server's default
    publisher.produce(topic_name, b"before", None, 0, None)
    with pytest.raises(
        MessageTooLarge, match=rf"is over the {limit}-byte limit of a NATS message \(the server's max_payload\); send smaller events, or raise max_payload"
    ):
        publisher.produce(topic_name, b"x" * (limit + 1), None, 0, None)
    publisher.produce(topic_name, b"after", None, 0, None)
    publisher.flush(15)  # the server never saw the big one, so it did not drop the connection and what came before and after is in
    publisher.close()
    from sp_dagster.messaging.codecs import RawCodec

    reader = nats.reader(topic_name, {0: EARLIEST}, RawCodec())
    got: list = []
    deadline = time.monotonic() + 15
    while len(got) < 2 and time.monotonic() < deadline:
        got += [e.row[0] for e in reader.poll(10, 0.5).events]
    reader.close()
    assert got == [b"before", b"after"]
