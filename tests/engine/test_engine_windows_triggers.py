"""Named windows (`define window`) shared by queries, and triggers (start, periodic, cron)."""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from dateutil import tz

from sp_dagster.engine import AppRuntime
from sp_dagster.engine.clock import WallClock
from sp_dagster.engine.triggers import QuartzCron
from sp_dagster.siddhi import SiddhiQLError


def collect(runtime: AppRuntime, stream: str) -> list:
    rows: list = []
    runtime.add_callback(stream, lambda events: rows.extend(e.data for e in events))
    return rows


def query_log(runtime: AppRuntime, query: str) -> list:
    """Every output chunk of `query` as (current rows, expired rows)."""
    chunks: list = []
    runtime.add_query_callback(query, lambda ts, cur, rem: chunks.append(([e.data for e in cur or []], [e.data for e in rem or []])))
    return chunks


def restarted(runtime: AppRuntime, app: str) -> AppRuntime:
    """A fresh runtime of `app` restored from a snapshot of `runtime` (which is shut down)."""
    state = runtime.snapshot()
    runtime.shutdown()
    fresh = AppRuntime(app)
    fresh.restore(state)
    return fresh


# --------------------------------------------------------------------------- named windows

SHARED = """
define stream S (symbol string, price double);
define stream T (symbol string, price double);
define window W (symbol string, price double) length(2);
@info(name='fillS') from S select symbol, price insert into W;
@info(name='fillT') from T select symbol, price insert into W;
@info(name='all') from W select symbol, price insert all events into O;
@info(name='sum') from W select sum(price) as total insert all events into Total;
@info(name='cheap') from W[price < 10] select symbol insert expired events into Gone;
"""


def test_a_named_length_window_is_one_window_shared_by_every_query():
    runtime = AppRuntime(SHARED)
    seen, totals, gone = query_log(runtime, "all"), query_log(runtime, "sum"), collect(runtime, "Gone")
    window = collect(runtime, "W")  # a stream callback on W sees what the window emits
    runtime.send("S", [("A", 5.0)])
    runtime.send("T", [("B", 20.0)])  # both feeding queries fill the same window
    runtime.send("S", [("C", 30.0)])  # A leaves the window: an expired event, then C
    runtime.send("T", [("D", 1.0)])  # B leaves
    assert seen == [([("A", 5.0)], []), ([("B", 20.0)], []), ([("C", 30.0)], [("A", 5.0)]), ([("D", 1.0)], [("B", 20.0)])]
    # one row per window output chunk (its last event), the expiry subtracted first
    assert totals == [([(5.0,)], []), ([(25.0,)], []), ([(50.0,)], []), ([(31.0,)], [])]
    assert gone == [("A",)]  # the filter sees the expired events too
    assert window == [("A", 5.0), ("B", 20.0), ("A", 5.0), ("C", 30.0), ("B", 20.0), ("D", 1.0)]


def test_insert_expired_events_into_a_window_adds_them_as_current_events():
    app = """
    define stream S (x int);
    define window Recent (x int) length(1);
    define window Evicted (x int) length(5);
    from S select x insert into Recent;
    from Recent select x insert expired events into Evicted;
    @info(name='q') from Evicted select x insert all events into O;
    """
    runtime = AppRuntime(app)
    chunks = query_log(runtime, "q")
    runtime.send("S", [(1,), (2,), (3,)])  # one chunk in, one chunk out of each window
    assert chunks == [([(1,), (2,)], [])]


def test_a_window_with_output_expired_events_emits_only_what_leaves_it():
    app = """
    define stream S (symbol string);
    define window W (symbol string) length(1) output expired events;
    from S select symbol insert into W;
    @info(name='every') from W select symbol insert all events into O;
    @info(name='current') from W select symbol insert into C;
    """
    runtime = AppRuntime(app)
    every, current = query_log(runtime, "every"), collect(runtime, "C")
    for symbol in "ABC":
        runtime.send("S", [(symbol,)])
    assert every == [([], [("A",)]), ([], [("B",)])]
    assert current == []  # nothing current ever leaves the window


def test_a_window_with_output_current_events_never_expires_anything_downstream():
    app = """
    @app:playback
    define stream S (x int);
    define window W (x int) time(1 sec) output current events;
    from S select x insert into W;
    @info(name='q') from W select count() as n insert all events into O;
    """
    runtime = AppRuntime(app)
    chunks = query_log(runtime, "q")
    runtime.send("S", [(1,)], timestamps=[1000])
    runtime.send("S", [(2,)], timestamps=[5000])
    assert chunks == [([(1,)], []), ([(2,)], [])]


JOIN = """
define stream Orders (id string, qty int);
define stream Prices (id string, price double);
define window Book (id string, price double) length(2);
from Prices select id, price insert into Book;
@info(name='probe') from Orders join Book on Orders.id == Book.id select Orders.id, qty, price insert into Out;
@info(name='outer') from Orders left outer join Book on Orders.id == Book.id select Orders.id, price insert into OuterOut;
@info(name='trigger') from Book unidirectional join Orders#window.length(5) as o on o.id == Book.id
select Book.id, o.qty, Book.price insert all events into Repriced;
"""


def test_a_named_window_joins_as_the_probed_side_and_as_the_triggering_side():
    runtime = AppRuntime(JOIN)
    out, outer, repriced = collect(runtime, "Out"), collect(runtime, "OuterOut"), query_log(runtime, "trigger")
    runtime.send("Prices", [("IBM", 10.0)])
    runtime.send("Orders", [("IBM", 3), ("WSO2", 7)])
    assert out == [("IBM", 3, 10.0)]
    assert outer == [("IBM", 10.0), ("WSO2", None)]
    runtime.send("Prices", [("WSO2", 20.0)])  # the window's new event finds the order held
    runtime.send("Prices", [("IBM", 11.0)])  # IBM@10 leaves the window: an expired join, then the new one
    assert repriced == [
        ([("WSO2", 7, 20.0)], []),
        ([("IBM", 3, 11.0)], [("IBM", 3, 10.0)]),
    ]
    runtime.send("Orders", [("IBM", 1)])
    assert out[-1] == ("IBM", 1, 11.0)  # only what the window holds now is found


def test_a_self_join_of_a_named_window_is_triggered_by_its_left_side_only():
    app = """
    define stream S (v int);
    define window W (v int) lengthBatch(2);
    from S select v insert into W;
    @info(name='pairs') from W as a join W as b on a.v < b.v select a.v as lo, b.v as hi insert into P;
    """
    runtime = AppRuntime(app)
    chunks = query_log(runtime, "pairs")
    runtime.send("S", [(1,), (2,)])
    runtime.send("S", [(3,), (4,)])
    assert chunks == [([(1, 2)], []), ([(3, 4)], [])]  # not twice, as both sides triggering would give


def test_a_named_window_survives_snapshot_and_restore():
    app = """
    @app:playback
    define stream S (symbol string, price double);
    define stream Q (symbol string);
    define window W (symbol string, price double) time(10 sec);
    from S select symbol, price insert into W;
    @info(name='q') from W select symbol, sum(price) as total group by symbol insert all events into O;
    @info(name='j') from Q join W on Q.symbol == W.symbol select W.symbol, W.price insert into Found;
    """
    runtime = AppRuntime(app)
    runtime.send("S", [("A", 1.0)], timestamps=[1000])
    runtime.send("S", [("A", 2.0), ("B", 5.0)], timestamps=[4000, 4000])
    runtime = restarted(runtime, app)
    chunks, found = query_log(runtime, "q"), collect(runtime, "Found")
    runtime.send("Q", [("A",)], timestamps=[5000])  # the restored window is probed
    assert found == [("A", 1.0), ("A", 2.0)]
    runtime.send("S", [("A", 4.0)], timestamps=[11000])  # its restored timers fire: A@1000 expires
    runtime.advance_time(14000)  # A@4000 and B@4000 expire together
    assert chunks == [([], [("A", 2.0)]), ([("A", 6.0)], []), ([], [("A", 4.0), ("B", None)])]


def test_named_windows_inside_partitions():
    app = """
    define stream S (k string, v int);
    define stream P (k string);
    define window W (k string, v int) length(3);
    partition with (k of S, k of P)
    begin
        from S select k, v insert into W;
        @info(name='lookup') from P join W on P.k == W.k select P.k, sum(W.v) as total insert into Looked;
    end;
    @info(name='q') from W select count() as n insert into Counts;
    """
    runtime = AppRuntime(app)
    counts, looked = collect(runtime, "Counts"), collect(runtime, "Looked")
    runtime.send("S", [("a", 1), ("b", 10), ("a", 2)])
    assert counts == [(1,), (2,), (3,)]  # every partition instance feeds the one window
    runtime.send("P", [("a",)])
    assert looked == [("a", 3)]  # a partition instance probes the shared window


def test_a_named_window_of_an_unknown_kind_is_a_load_error():
    with pytest.raises(SiddhiQLError) as raised:
        AppRuntime("define stream S (x int);\ndefine window W (x int) cron('*/5 * * * * ?');\nfrom S select x insert into W;")
    assert (raised.value.line, raised.value.message) == (2, "window 'cron' is not supported by the engine")


# --------------------------------------------------------------------------- triggers


def test_a_start_trigger_fires_once_when_the_runtime_starts():
    runtime = AppRuntime("define trigger Boot at 'START';\n@info(name='q') from Boot select triggered_time insert into O;")
    rows = collect(runtime, "O")
    before = int(time.time() * 1000)
    runtime.start()
    runtime.start()
    assert len(rows) == 1 and before <= rows[0][0] <= int(time.time() * 1000)
    runtime.shutdown()


def test_a_start_trigger_does_not_fire_again_after_a_restore():
    app = "@app:playback\ndefine stream S (x int);\ndefine trigger Boot at 'start';\nfrom Boot select triggered_time insert into O;"
    runtime = AppRuntime(app)
    rows = collect(runtime, "O")
    runtime.send("S", [(1,)], timestamps=[5000])
    assert rows == [(0,)]
    runtime = restarted(runtime, app)
    rows = collect(runtime, "O")
    runtime.send("S", [(1,)], timestamps=[6000])
    assert rows == []


PERIODIC = """
@app:playback
define stream S (x int);
define trigger Tick at every 5 sec;
@info(name='q') from Tick select triggered_time insert into O;
@info(name='seen') from S select x insert into Seen;
"""


def test_a_periodic_trigger_in_playback_fires_as_event_time_advances():
    runtime = AppRuntime(PERIODIC)
    ticks, order = [], []
    runtime.add_callback("O", lambda events: ticks.extend((e.timestamp, e.data[0]) for e in events))
    runtime.add_callback("O", lambda events: order.extend(("tick", e.data[0]) for e in events))
    runtime.add_callback("Seen", lambda events: order.extend(("event", e.timestamp) for e in events))
    runtime.send("S", [(1,)], timestamps=[1000])  # event time starts: the first tick is due at 6000
    assert ticks == []
    runtime.send("S", [(2,)], timestamps=[12000])  # the ticks due by then fire first, each at its time
    runtime.advance_time(16000)
    assert ticks == [(6000, 6000), (11000, 11000), (16000, 16000)]
    assert order == [("event", 1000), ("tick", 6000), ("tick", 11000), ("event", 12000), ("tick", 16000)]


def test_a_periodic_trigger_keeps_its_next_fire_time_through_snapshot_and_restore():
    runtime = AppRuntime(PERIODIC)
    runtime.send("S", [(1,)], timestamps=[1000])
    runtime.send("S", [(2,)], timestamps=[7000])  # fired at 6000; next at 11000
    assert runtime.triggers["Tick"].next == 11000
    runtime = restarted(runtime, PERIODIC)
    assert runtime.triggers["Tick"].next == 11000
    rows = collect(runtime, "O")
    runtime.advance_time(17000)
    assert rows == [(11000,), (16000,)]  # the old phase, not one anchored anew at 17000


def test_a_restored_wall_clock_trigger_skips_the_periods_that_passed_but_keeps_its_phase():
    now = [1_000_000.0]
    app = "define trigger Tick at every 100 milliseconds;\nfrom Tick select triggered_time insert into O;"
    runtime = AppRuntime(app, clock=WallClock(source=lambda: now[0]))
    try:
        trigger = runtime.triggers["Tick"]
        assert trigger.next == 1_000_000_100
        trigger.restore(1_000_000_000 - 250)  # saved long ago; its phase is 50 ms past the 100 ms grid
        assert trigger.next == 1_000_000_050
    finally:
        runtime.shutdown()


def test_a_periodic_trigger_fires_on_the_wall_clock():
    runtime = AppRuntime("define trigger Tick at every 100 milliseconds;\nfrom Tick select triggered_time insert into O;")
    rows = collect(runtime, "O")
    try:
        deadline = time.monotonic() + 10
        while len(rows) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        runtime.shutdown()
    assert len(rows) >= 3
    times = [r[0] for r in rows]
    assert [b - a for a, b in zip(times, times[1:])] == [100] * (len(times) - 1)  # fixed rate, no drift


def test_a_cron_trigger_in_playback_fires_at_the_times_it_names():
    app = """
    @app:playback
    define stream S (x int);
    define trigger Every5 at '*/5 * * * * ?';
    @info(name='q') from Every5 select triggered_time insert into O;
    """
    runtime = AppRuntime(app)
    rows = collect(runtime, "O")
    start = 1_700_000_001_000  # 1_700_000_000 s is a multiple of 5 s
    runtime.send("S", [(1,)], timestamps=[start])
    runtime.advance_time(start + 12_000)
    assert rows == [(start + 4_000,), (start + 9_000,)]


def test_a_cron_trigger_fires_on_the_wall_clock():
    runtime = AppRuntime("define trigger EverySecond at '* * * * * ?';\nfrom EverySecond select triggered_time insert into O;")
    rows = collect(runtime, "O")
    try:
        deadline = time.monotonic() + 5
        while not rows and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        runtime.shutdown()
    assert rows and rows[0][0] % 1000 == 0  # on a whole second


def test_quartz_days_of_the_week_count_from_sunday():
    zone = tz.tzlocal()
    base = int(datetime(2024, 6, 1, tzinfo=zone).timestamp() * 1000)  # a Saturday

    def day(expression: str) -> datetime:
        return datetime.fromtimestamp(QuartzCron(expression).next_after(base) / 1000, zone)

    assert day("0 0 12 ? * 2").strftime("%a %d") == "Mon 03"
    assert day("0 0 12 ? * 2-6").strftime("%a %d") == "Mon 03"
    assert day("0 0 12 ? * 1/7").strftime("%a %d") == "Sun 02"
    assert day("0 0 12 ? * 6#3").strftime("%a %d") == "Fri 21"
    assert day("0 0 12 ? * 6L").strftime("%a %d") == "Fri 28"
    assert day("0 0 12 ? * L").strftime("%a %d") == "Sat 01"
    assert day("0 0 12 ? * MON").strftime("%a %d") == "Mon 03"
    assert day("0 0 12 L * ?").strftime("%a %d") == "Sun 30"
    assert QuartzCron("0 0 12 * * ? 2020").next_after(base) is None  # past its last year


@pytest.mark.parametrize(
    ("definition", "message"),
    [
        ("at '* * * * * *'", "exactly one of day-of-month and day-of-week must be '?'"),
        ("at '0 0 12 1 * MON'", "exactly one of day-of-month and day-of-week must be '?'"),
        ("at '0 0 0 ? * 8'", "days of the week are 1-7 (SUN-SAT), not 8"),
        ("at '61 * * * * ?'", "is not valid"),
        ("at '0 0 0 LW * ?'", "(L-n, LW) is not supported"),
        ("at '0 ? 0 * * ?'", "'?' can only stand alone in day-of-month or day-of-week"),
    ],
)
def test_bad_cron_triggers_are_load_errors_with_a_position(definition, message):
    with pytest.raises(SiddhiQLError) as raised:
        AppRuntime(f"define stream S (x int);\ndefine trigger Bad {definition};\nfrom Bad select * insert into O;")
    assert (raised.value.line, raised.value.column) == (2, 16)
    assert message in raised.value.message and "^" in str(raised.value)


@pytest.mark.parametrize("definition", ["at 'sometimes'", "at every 0 sec"])
def test_malformed_triggers_are_parser_errors_with_a_position(definition):
    with pytest.raises(SiddhiQLError) as raised:
        AppRuntime(f"define stream S (x int);\ndefine trigger Bad {definition};\nfrom Bad select * insert into O;")
    assert raised.value.line == 2


def test_a_trigger_is_a_stream_that_joins_and_feeds_partitions():
    app = """
    @app:playback
    define stream S (k string, v int);
    define trigger Tick at every 10 sec;
    define window Last (k string, v int) length(1);
    from S select k, v insert into Last;
    @info(name='report') from Tick join Last select Tick.triggered_time as at, Last.k, Last.v insert into Report;
    partition with (k of S)
    begin
        from S select k, v insert into #Seen;
        from Tick join #Seen#window.length(1) as s select s.k, triggered_time insert into PerKey;
    end;
    """
    runtime = AppRuntime(app)
    report, per_key = collect(runtime, "Report"), collect(runtime, "PerKey")
    runtime.send("S", [("a", 1)], timestamps=[1000])
    runtime.send("S", [("b", 2)], timestamps=[5000])
    runtime.advance_time(11000)
    assert report == [(11000, "b", 2)]
    assert sorted(per_key) == [("a", 11000), ("b", 11000)]
