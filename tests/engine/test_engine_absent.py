"""Absent pattern and sequence states (`not S for T`) beyond the conformance cases.

Playback cases step the clock by event timestamps (and advance_time); wall-clock cases let
the timer thread fire deadlines, either on real time or on a hand-moved time source.
"""

from __future__ import annotations

import time

import pytest

from sp_dagster.engine import AppRuntime
from sp_dagster.engine.clock import WallClock
from tests.fixtures.waiting import wait_until

STREAMS = "define stream A (id string, v int);\ndefine stream B (id string, v int);\ndefine stream C (id string, v int);\n"
PLAYBACK = "@app:playback\n" + STREAMS


def run(app: str, inputs, query: str = "q", clock=None):
    """Send (stream, id, v, timestamp) inputs (timestamp None: advance_time only); return
    [(timestamp, row)] of what the query emitted, and the runtime (shut down)."""
    runtime = AppRuntime(app, clock=clock)
    out = []
    runtime.add_query_callback(query, lambda ts, cur, rem: out.extend((ts, e.data) for e in cur or []))
    try:
        for stream, key, value, timestamp in inputs:
            if stream is None:
                runtime.advance_time(timestamp)
            else:
                runtime.send(stream, [(key, value)], timestamps=[timestamp])
    finally:
        runtime.shutdown()
    return out


# -- playback


def test_absence_fires_at_its_deadline_and_a_match_just_before_it_kills():
    app = PLAYBACK + ("@info(name='q') from every e1=A -> not B[id == e1.id] for 1 sec select e1.id as id insert into O;")
    out = run(
        app,
        [
            ("A", "k1", 0, 1000),
            ("A", "k2", 0, 1500),
            ("B", "k1", 0, 1999),  # 1 ms before k1's deadline: kills it
            ("B", "k2", 0, 2500),  # at k2's deadline: the deadline fires first
            (None, None, None, 10_000),
        ],
    )
    assert out == [(2500, ("k2",))]  # the match carries its deadline as timestamp


def test_every_absent_first_state_followed_by_an_event():
    app = PLAYBACK + "@info(name='q') from every not A[v > 0] for 1 sec -> e2=B select e2.id as id insert into O;"
    out = run(
        app,
        [
            ("B", "b1", 0, 2100),  # quiet periods ended at 1000 and 2000: two partial matches wait
            ("A", "a", 0, 2500),  # v 0: does not match the filter
            ("A", "a", 5, 2600),  # kills the period that began at 2000; the next one ends at 3600
            ("B", "b2", 0, 3000),
            ("B", "b3", 0, 3700),
        ],
    )
    assert out == [(2100, ("b1",)), (2100, ("b1",)), (3700, ("b3",))]


def test_absent_first_state_without_every_waits_for_one_quiet_period_only():
    app = PLAYBACK + "@info(name='q') from not A for 1 sec -> e2=B select e2.id as id insert into O;"
    out = run(
        app,
        [
            ("A", "a", 1, 500),  # restarts the wait: quiet from 500 to 1500
            ("B", "b1", 0, 1200),
            ("B", "b2", 0, 1600),
            ("B", "b3", 0, 5000),  # one match only, as there is no every
        ],
    )
    assert out == [(1600, ("b2",))]


def test_not_for_then_arrow_then_event_with_every_on_the_absent_state():
    app = PLAYBACK + ("@info(name='q') from (e1=A -> every not B[v > e1.v] for 900 milliseconds) within 2 sec select e1.id as id insert into O;")
    out = run(app, [("A", "a", 10, 1000), (None, None, None, 10_000)])
    assert out == [(1900, ("a",)), (2800, ("a",))]  # the third period would end past within


def test_absent_and_event_needs_both_and_absent_or_event_needs_either():
    both = PLAYBACK + "@info(name='q') from every e1=A -> not B for 1 sec and e3=C select e1.id as a, e3.id as c insert into O;"
    out = run(
        both,
        [
            ("A", "a1", 0, 1000),
            ("C", "c1", 0, 1500),  # before the quiet second is over: waits for it
            ("A", "a2", 0, 3000),
            ("B", "b", 0, 3500),  # kills a2's partial match
            ("C", "c2", 0, 4500),
            ("A", "a3", 0, 6000),
            ("C", "c3", 0, 8000),  # after the quiet second: completes at once
        ],
    )
    assert out == [(2000, ("a1", "c1")), (8000, ("a3", "c3"))]

    either = PLAYBACK + "@info(name='q') from every e1=A -> not B for 1 sec or e3=C select e1.id as a, e3.id as c insert into O;"
    out = run(
        either,
        [
            ("A", "a1", 0, 1000),  # nothing comes: the quiet second completes it
            ("A", "a2", 0, 3000),
            ("B", "b", 0, 3100),  # kills only the quiet-second branch
            ("C", "c2", 0, 3200),
            ("A", "a3", 0, 5000),
            ("C", "c3", 0, 5500),
            (None, None, None, 9000),
        ],
    )
    assert out == [(2000, ("a1", None)), (3200, ("a2", "c2")), (5500, ("a3", "c3"))]


def test_not_and_event_without_time_at_the_start():
    app = PLAYBACK + "@info(name='q') from not A and e2=B -> e3=C select e2.id as b, e3.id as c insert into O;"
    assert run(app, [("B", "b", 0, 1000), ("C", "c", 0, 2000)]) == [(2000, ("b", "c"))]
    assert run(app, [("A", "a", 0, 500), ("B", "b", 0, 1000), ("C", "c", 0, 2000)]) == []


def test_sequence_absent_state_lives_through_one_event():
    app = PLAYBACK + "@info(name='q') from every e1=A, not B[v > 5] for 1 sec select e1.id as id insert into O;"
    # a1 lives through a2 and is dropped by a3; a2 is dropped when a3 waits on the same state
    out = run(app, [("A", "a1", 0, 1000), ("A", "a2", 0, 1500), ("A", "a3", 0, 1800), (None, None, None, 9000)])
    assert out == [(2800, ("a3",))]
    # a B that fails the filter is lived through, and the deadline fires; one that passes kills
    out = run(app, [("A", "a1", 0, 1000), ("B", "b", 0, 1200), (None, None, None, 9000)])
    assert out == [(2000, ("a1",))]
    out = run(app, [("A", "a1", 0, 1000), ("B", "b", 9, 1200), (None, None, None, 9000)])
    assert out == []


def test_sequence_absent_between_two_events():
    app = PLAYBACK + "@info(name='q') from e1=A, not B for 1 sec, e3=C select e1.id as a, e3.id as c insert into O;"
    assert run(app, [("A", "a", 0, 1000), ("C", "c", 0, 2500)]) == [(2500, ("a", "c"))]
    assert run(app, [("A", "a", 0, 1000), ("C", "c", 0, 1500)]) == []  # C came inside the quiet second


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_restore_mid_wait_keeps_deadlines_and_timers(cut):
    app = PLAYBACK + (
        "@info(name='q') from every e1=A -> not B[id == e1.id] for 1 sec select e1.id as id insert into O;\n"
        "@info(name='p') from every not C for 2 sec select 'quiet' as id insert into P;"
    )
    inputs = [("A", "k1", 0, 1000), ("A", "k2", 0, 1200), ("B", "k2", 0, 1500), ("A", "k3", 0, 1900)]
    expected = [(2000, ("k1",)), (2900, ("k3",))]

    def start():
        runtime = AppRuntime(app)
        runtime.add_query_callback("q", lambda ts, cur, rem: out.extend((ts, e.data) for e in cur or []))
        runtime.add_query_callback("p", lambda ts, cur, rem: quiet.extend(ts for _ in cur or []))
        return runtime

    out, quiet = [], []
    runtime = start()
    for stream, key, value, timestamp in inputs[:cut]:
        runtime.send(stream, [(key, value)], timestamps=[timestamp])
    state = runtime.snapshot()
    runtime.shutdown()
    runtime = start()
    runtime.restore(state)
    for stream, key, value, timestamp in inputs[cut:]:
        runtime.send(stream, [(key, value)], timestamps=[timestamp])
    runtime.advance_time(6000)
    runtime.shutdown()
    assert out == expected
    assert quiet == [2000, 4000, 6000]


# -- wall clock


def test_wall_clock_timer_fires_an_absence_without_further_events():
    app = STREAMS + "@info(name='q') from every e1=A -> not B[id == e1.id] for 500 milliseconds select e1.id as id insert into O;"
    runtime = AppRuntime(app)
    out = []
    runtime.add_callback("O", lambda events: out.extend(e.data for e in events))
    try:
        runtime.send("A", [("k1", 0)])
        runtime.send("A", [("k2", 0)])
        runtime.send("B", [("k2", 0)])  # k2 is paid in time
        wait_until(lambda: out, 5.0, 0.01, what="the absence to fire")
        time.sleep(0.3)
        assert out == [("k1",)]
    finally:
        runtime.shutdown()


class _Hand:
    """A time source moved by the test."""

    def __init__(self, ms: int):
        self.ms = ms

    def __call__(self) -> float:
        return self.ms / 1000


def test_wall_clock_periodic_absence_on_a_moved_clock_and_restore():
    app = STREAMS + "@info(name='q') from every not A[v > 0] for 1 sec select 'quiet' as s insert into O;"
    hand = _Hand(1_000_000)
    clock = WallClock(hand)
    runtime = AppRuntime(app, clock=clock)
    times = []
    runtime.add_query_callback("q", lambda ts, cur, rem: times.extend(ts for _ in cur or []))

    def move(ms: int) -> None:
        hand.ms = ms
        clock.wake(ms)

    try:
        move(1_001_000)
        wait_until(lambda: times == [1_001_000], 5.0, 0.01, what="the first absence at its deadline")
        move(1_001_500)
        runtime.send("A", [("a", 5)])  # kills the period begun at 1_001_000; the next ends at 1_002_500
        move(1_002_200)
        time.sleep(0.1)
        assert times == [1_001_000]
        state = runtime.snapshot()
    finally:
        runtime.shutdown()

    clock = WallClock(hand)
    restored = AppRuntime(app, clock=clock)
    restored.add_query_callback("q", lambda ts, cur, rem: times.extend(ts for _ in cur or []))
    try:
        restored.restore(state)
        move(1_002_500)
        wait_until(lambda: times == [1_001_000, 1_002_500], 5.0, 0.01, what="the second absence at its deadline")
        move(1_003_400)
        time.sleep(0.1)
        assert times == [1_001_000, 1_002_500]
    finally:
        restored.shutdown()


def test_partitioned_absence_is_per_key():
    app = PLAYBACK + (
        "partition with (id of A, id of B) begin\n"
        "@info(name='q') from every e1=A -> not B for 1 sec select e1.id as id insert into O;\n"
        "@info(name='p') from every not A[v > 5] for 1 sec select 'quiet' as id insert into P;\n"
        "end;"
    )
    runtime = AppRuntime(app)
    out, quiet = [], []
    runtime.add_query_callback("q", lambda ts, cur, rem: out.extend((ts, e.data) for e in cur or []))
    runtime.add_query_callback("p", lambda ts, cur, rem: quiet.extend(ts for _ in cur or []))
    try:
        runtime.send("A", [("k1", 1)], timestamps=[1000])
        runtime.send("A", [("k2", 9)], timestamps=[1200])  # k2's quiet periods start over at 1200
        runtime.send("B", [("k2", 0)], timestamps=[1500])  # kills k2's absence only
        runtime.advance_time(2300)
    finally:
        runtime.shutdown()
    assert out == [(2000, ("k1",))]
    assert quiet == [2000, 2200]  # k1's instance began at 1000, k2's quiet period at 1200
