"""Messages a fetch passed over are read again (messaging/skips.py): the guard's rules on their own,
then a KafkaReader on the real broker whose consumer is made to step over messages, as tansu's
fetch does when batches of several producers are stored out of order."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer, TopicPartition

from sp_dagster.messaging import EARLIEST
from sp_dagster.messaging.codecs import RawCodec
from sp_dagster.messaging.skips import HOLES_KEPT_S, SILENT_CHECKS, SILENT_S, WRITER_HEADER, SkipGuard, WriterStamps, parse_stamp


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def admit_all(guard, partition, items):
    """(offset, token, n) in read order -> the verdicts."""
    return [guard.admit(partition, offset, (token, n) if token else None) for offset, token, n in items]


def test_stamps_count_per_partition_and_parse_back():
    stamps = WriterStamps()
    values = [stamps.stamp("t", 0), stamps.stamp("t", 1), stamps.stamp("t", 0), stamps.stamp("u", 0)]
    assert [parse_stamp(v)[1] for v in values] == [0, 0, 1, 0]
    assert {parse_stamp(v)[0] for v in values} == {stamps.token.encode()}
    assert WriterStamps().token != stamps.token
    assert parse_stamp(None) is None and parse_stamp(b"no-counter") is None and parse_stamp(b"w:x") is None


def test_a_jump_reads_again_from_the_first_hole_after_the_writers_last_message():
    guard = SkipGuard("t", clock=Clock())
    # w:0 at 0, v:0 at 1, marker at 2, w:1 at 3 passed over, v:1 at 4, then w:2 at 5 shows the jump.
    assert admit_all(guard, 0, [(0, "w", 0), (1, "v", 0), (4, "v", 1)]) == [True, True, True]
    assert guard.admit(0, 5, ("w", 2)) == 2  # holes [2, 4): read again from 2
    # Read again: the marker's offset never comes, 3 is delivered, 4 was delivered, 5 ends the pass.
    assert admit_all(guard, 0, [(3, "w", 1), (4, "v", 1), (5, "w", 2), (6, "v", 2)]) == [True, False, True, True]
    assert guard.found == 1 and guard.lost == 0


def test_a_counter_not_found_after_reading_again_is_lost_once_and_reading_goes_on():
    guard = SkipGuard("t", clock=Clock())
    assert admit_all(guard, 0, [(0, "w", 0), (1, "v", 0), (3, "v", 1)]) == [True, True, True]
    assert guard.admit(0, 4, ("w", 2)) == 2
    assert admit_all(guard, 0, [(3, "v", 1), (4, "w", 2), (5, "w", 3)]) == [False, True, True]
    assert guard.lost == 1 and guard.found == 0
    # No hole behind the writer at all: lost at once, nothing read again.
    assert guard.admit(0, 6, ("w", 5)) is True and guard.lost == 2


def test_a_new_writer_after_holes_reads_them_again_once():
    guard = SkipGuard("t", clock=Clock())
    assert admit_all(guard, 0, [(0, "w", 0), (2, "w", 1)]) == [True, True]
    assert guard.admit(0, 3, ("x", 0)) == 1  # a new owner: what its predecessor left may lie in the hole [1, 2)
    assert admit_all(guard, 0, [(2, "w", 1), (3, "x", 0)]) == [False, True]  # 1 held a marker
    # Another new writer: the holes behind it are read again, the young one found empty just now too.
    assert admit_all(guard, 0, [(5, "y", 0)]) == [1]
    assert admit_all(guard, 0, [(2, "w", 1), (3, "x", 0), (5, "y", 0), (6, "y", 1)]) == [False, False, True, True]  # nothing: not asked again
    assert guard.found == 0 and guard.lost == 0


def test_a_silent_writer_has_the_holes_behind_it_read_again():
    clock = Clock()
    guard = SkipGuard("t", clock=clock)
    assert admit_all(guard, 0, [(0, "w", 0), (1, "v", 0), (3, "v", 1)]) == [True, True, True]
    assert guard.due() == {}
    clock.now += SILENT_S
    assert guard.due() == {0: 2}  # w's last message at 0; the hole [2, 3) lies behind it
    assert guard.due() == {}  # under way
    assert admit_all(guard, 0, [(2, "w", 1), (3, "v", 1)]) == [True, False]
    guard.reread_done(0)
    clock.now += SILENT_S
    assert guard.due() == {}  # both checked since their last message, no holes left
    assert admit_all(guard, 0, [(4, "v", 2)]) == [True]


def test_a_reader_handing_over_reads_every_hole_again():
    guard = SkipGuard("t", clock=Clock())
    assert admit_all(guard, 0, [(0, "w", 0), (2, "w", 1)]) + admit_all(guard, 1, [(0, "v", 0)]) == [True, True, True]
    assert guard.read_all_again() == {0: 1} and guard.rereading()
    assert guard.read_all_again() == {}  # under way
    guard.reread_done(0)
    assert not guard.rereading() and guard.read_all_again() == {}


def test_a_second_read_that_finds_nothing_keeps_the_holes_until_they_are_too_old():
    clock = Clock()
    guard = SkipGuard("t", clock=clock)
    assert admit_all(guard, 0, [(0, "w", 0), (1, "v", 0), (3, "w", 1), (5, "v", 1), (7, "w", 2)]) == [True] * 5
    state = guard.partitions[0]
    assert (state.starts, state.ends) == ([2, 4, 6], [3, 5, 7])
    state.reread(4, 8)
    state.reread_over()
    assert (state.starts, state.ends) == ([2, 4, 6], [3, 5, 7]) and not guard.rereading()  # kept for a later check
    clock.now += HOLES_KEPT_S + 1
    guard.due()
    assert state.starts == []  # forgotten unread


def test_a_dead_writers_open_transaction_is_found_when_its_next_owner_starts():
    clock = Clock()
    guard = SkipGuard("t", clock=clock)
    # w's last two messages (2, 3) are in its open transaction when it dies: a read_committed fetch steps over them.
    assert admit_all(guard, 0, [(0, "w", 0), (1, "v", 0), (4, "v", 1)]) == [True, True, True]
    for _ in range(SILENT_CHECKS):  # every silent-writer check finds them still hidden
        clock.now += 8 * SILENT_S
        if guard.due():
            assert admit_all(guard, 0, [(4, "v", 1)]) == [False]
            guard.reread_done(0)
    clock.now += 20.0  # the next owner, a writer not met before, starts long after: its start lets them through
    assert admit_all(guard, 0, [(5, "w2", 0)]) == [2]
    assert admit_all(guard, 0, [(2, "w", 1), (3, "w", 2), (4, "v", 1), (5, "w2", 0)]) == [True, True, False, True]
    assert guard.found == 2 and guard.lost == 0


def test_a_silent_writer_is_checked_again_while_what_it_left_is_not_stored_yet():
    clock = Clock()
    guard = SkipGuard("t", clock=clock)
    # w:1, at offset 2, is not stored yet when v:1 at 3 is read: the first two checks pass over it again.
    assert admit_all(guard, 0, [(0, "w", 0), (1, "v", 0), (3, "v", 1)]) == [True, True, True]
    for wait in (SILENT_S, SILENT_S):
        clock.now += wait
        assert guard.due() == {0: 2}
        assert admit_all(guard, 0, [(3, "v", 1)]) == [False]
        guard.reread_done(0)
    clock.now += 2 * SILENT_S
    assert guard.due() == {0: 2}  # the third check, four times SILENT_S after w's last message, finds it
    assert admit_all(guard, 0, [(2, "w", 1), (3, "v", 1), (4, "v", 2)]) == [True, False, True]
    assert guard.found == 1 and guard.lost == 0
    clock.now += 8 * SILENT_S
    assert guard.due() == {}  # nothing behind either writer any more


def test_a_silent_writer_is_checked_a_bounded_number_of_times():
    clock = Clock()
    guard = SkipGuard("t", clock=clock)
    assert admit_all(guard, 0, [(0, "w", 0), (1, "v", 0), (3, "v", 1)]) == [True, True, True]  # a marker at 2, say
    checks = 0
    for _ in range(40):
        clock.now += SILENT_S / 2
        if guard.due():
            checks += 1
            guard.reread_done(0)
    assert checks == SILENT_CHECKS  # w's (v's own find no hole behind its last message)


def test_unstamped_messages_are_delivered_in_order_and_never_again():
    guard = SkipGuard("t", clock=Clock())
    assert admit_all(guard, 1, [(0, None, 0), (5, None, 0), (5, None, 0), (3, None, 0)]) == [True, True, False, False]
    assert guard.due() == {}


def _produce(bootstrap, topic, items):
    """(partition, token, n) in order; token None: no stamp."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, token, n in items:
        headers = [(WRITER_HEADER, f"{token}:{n}".encode())] if token else None
        producer.produce(topic, value=f"{token}{n}".encode(), partition=partition, headers=headers)
    producer.flush(10)


def _read(reader, want, seconds=15.0):
    got, deadline = [], time.monotonic() + seconds
    while len(got) < want and time.monotonic() < deadline:
        got += [(offset, value.decode()) for _p, offset, _s, _k, value, _h in reader.poll_raw(max(1, want - len(got)), 0.2)]
    return got


@pytest.mark.broker
def test_reader_delivers_messages_its_consumer_stepped_over_before_the_writers_next(kafka, broker, topic_name):
    kafka.ensure_topic(topic_name, 1)
    _produce(broker.bootstrap_servers, topic_name, [(0, "w", 0), (0, "v", 0), (0, "w", 1), (0, "w", 2), (0, "v", 1), (0, "w", 3)])
    reader = kafka.reader(topic_name, {0: EARLIEST}, RawCodec())
    try:
        first = _read(reader, 2)
        assert first == [(0, "w0"), (1, "v0")]
        reader.consumer.seek(TopicPartition(topic_name, 0, 4))  # a fetch that passes over w1 and w2
        rest = _read(reader, 4)
        # v1 goes on at once (v's counter is whole); w3 shows w's jump: w1 and w2 come first.
        assert rest == [(4, "v1"), (2, "w1"), (3, "w2"), (5, "w3")]
        assert reader.guard.found == 2 and reader.guard.lost == 0
        assert reader.positions() == {0: 6}
    finally:
        reader.close()


@pytest.mark.broker
def test_reader_reads_again_behind_a_writer_gone_silent_at_the_end_of_a_stream(kafka, broker, topic_name):
    kafka.ensure_topic(topic_name, 1)
    _produce(broker.bootstrap_servers, topic_name, [(0, "v", 0), (0, "w", 0), (0, "w", 1), (0, "v", 1)])
    reader = kafka.reader(topic_name, {0: EARLIEST}, RawCodec())
    try:
        assert _read(reader, 2) == [(0, "v0"), (1, "w0")]
        reader.consumer.seek(TopicPartition(topic_name, 0, 3))  # w's last message passed over; nothing of w follows
        assert _read(reader, 1) == [(3, "v1")]
        assert _read(reader, 1, seconds=SILENT_S + 10) == [(2, "w1")]
        assert _read(reader, 1, seconds=1.0) == []  # nothing twice
    finally:
        reader.close()


@pytest.mark.broker
def test_published_messages_carry_a_counter_per_partition(kafka, topic_name):
    kafka.ensure_topic(topic_name, 2)
    publisher = kafka.raw_publisher()
    publisher.produce_all(
        [(topic_name, b"a", None, 0, None, b"o|1"), (topic_name, b"b", None, 1, None, None), (topic_name, b"c", None, 0, None, None)], "sp-origin"
    )
    publisher.flush(10)
    publisher.close()
    reader = kafka.reader(topic_name, {0: EARLIEST, 1: EARLIEST}, RawCodec())
    try:
        got, deadline = [], time.monotonic() + 15
        while len(got) < 3 and time.monotonic() < deadline:
            got += reader.poll_raw(100, 0.2, "sp-origin")
        stamps = {(p, value): parse_stamp(dict(message_headers).get(WRITER_HEADER)) for p, value, message_headers in _with_headers(kafka, topic_name)}
    finally:
        reader.close()
    assert sorted((p, v, origin) for p, _o, _s, _k, v, origin in got) == [(0, b"a", b"o|1"), (0, b"c", None), (1, b"b", None)]
    assert [stamps[(0, b"a")][1], stamps[(0, b"c")][1], stamps[(1, b"b")][1]] == [0, 1, 0]
    assert len({token for token, _n in stamps.values()}) == 1


def _with_headers(kafka, topic):
    """(partition, value, headers) of every message, read with a plain consumer."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "t", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
    out, deadline = [], time.monotonic() + 15
    while len(out) < 3 and time.monotonic() < deadline:
        out += [(m.partition(), m.value(), m.headers() or []) for m in consumer.consume(100, 0.2) if m.error() is None]
    consumer.close()
    return out
