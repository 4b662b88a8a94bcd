"""AppRuntime as a caller uses it: sending rows or Arrow batches, callbacks, clocks, snapshots."""

from __future__ import annotations

import pickle
import time
import zlib

import pyarrow as pa
import pytest

from sp_dagster.engine import AppRuntime, EngineError
from sp_dagster.engine.clock import DrivenClock
from sp_dagster.engine.values import f32
from sp_dagster.siddhi import SiddhiQLError

STOCKS = "define stream S (symbol string, price float, volume long);\n"


def collect(runtime: AppRuntime, stream: str) -> list:
    rows: list = []
    runtime.add_callback(stream, lambda events: rows.extend(e.data for e in events))
    return rows


def test_rows_and_arrow_batches_give_the_same_output():
    app = STOCKS + (
        "from S[price > 10 and volume % 2 == 0 or symbol == 'X'] "
        "select symbol, price * 2 + volume as a, volume / 3 as b, price / 0 as c, coalesce(symbol, 'none') as d, "
        "ifThenElse(price > 50, volume, volume * -1) as e, 2147483647 + 1 as f insert into O;"
    )
    data = [("A", 12.5, 4), ("B", 55.6, 7), (None, 99.0, 10), ("X", None, None), ("C", 3.0, -9), ("D", 1e30, 2**62)]
    by_rows, by_batch = AppRuntime(app), AppRuntime(app)
    rows, batch_rows = collect(by_rows, "O"), collect(by_batch, "O")
    by_rows.send("S", data)
    batch = pa.RecordBatch.from_pylist(
        [dict(zip(("symbol", "price", "volume"), row)) for row in data],
        schema=pa.schema([("symbol", pa.string()), ("price", pa.float32()), ("volume", pa.int64())]),
    )
    assert by_batch.queries["query_1"].arrow is False  # % is row-only, so this query runs row by row
    by_batch.send("S", batch)
    assert rows == batch_rows and rows


def test_stateless_queries_run_column_wise_and_match_the_row_path():
    app = STOCKS + "from S[price >= 20.5 and symbol != 'B'] select symbol, price * 2 - volume as a, price / 4 as b, volume + 1 as c insert into O;"
    vectorised, rowwise = AppRuntime(app), AppRuntime(app)
    assert vectorised.queries["query_1"].arrow
    out_vector, out_rows = collect(vectorised, "O"), collect(rowwise, "O")
    data = [("A", 20.5, 1), ("B", 30.0, 2), ("C", 99.9, -5), ("D", None, 3), (None, 40.25, None)]
    batch = pa.RecordBatch.from_pylist(
        [dict(zip(("symbol", "price", "volume"), row)) for row in data],
        schema=pa.schema([("symbol", pa.string()), ("price", pa.float32()), ("volume", pa.int64())]),
    )
    vectorised.send("S", batch)
    rowwise.send("S", data)
    # null compares false, so D (no price) and the row without a symbol are filtered out
    assert out_rows == [("A", 40.0, 5.125, 2), ("C", f32(f32(f32(99.9) * 2) + 5), f32(f32(99.9) / 4), -4)]
    assert out_vector == out_rows


def test_query_callback_splits_current_and_expired_events():
    runtime = AppRuntime(STOCKS + "@info(name='q') from S#window.length(1) select symbol insert all events into O;")
    seen = []
    runtime.add_query_callback("q", lambda ts, cur, rem: seen.append(([e.data for e in cur or []], [e.data for e in rem or []])))
    runtime.send("S", [("A", 1.0, 1)])
    runtime.send("S", [("B", 1.0, 1)])
    assert seen == [([("A",)], []), ([("B",)], [("A",)])]


def test_misuse_is_reported_as_engine_errors():
    runtime = AppRuntime(STOCKS + "@info(name='q') from S select symbol insert into O;")
    with pytest.raises(EngineError, match="no stream 'T'"):
        runtime.send("T", [("A", 1.0, 1)])
    with pytest.raises(EngineError, match="takes 3 values"):
        runtime.send("S", [("A", 1.0)])
    with pytest.raises(EngineError, match="no query 'nope'"):
        runtime.add_query_callback("nope", print)
    with pytest.raises(EngineError, match="timestamps"):
        runtime.send("S", [("A", 1.0, 1)], timestamps=[1, 2])


def test_unsupported_features_are_rejected_at_load_with_positions():
    app = (
        "define stream A (x int);\ndefine stream B (x int);\nfrom A#window.unique:length(x, 2) select x insert into C;\n"
        "from A select math:rand() as r insert into O;\n"
    )
    with pytest.raises(SiddhiQLError) as raised:
        AppRuntime(app)
    messages = [(e.line, e.message) for e in raised.value.errors]
    assert (3, "window 'unique:length' is not supported by the engine") in messages
    assert (4, "function math:rand() is not supported by the engine") in messages
    assert "^" in str(raised.value)  # the parser's excerpt with a caret


def test_validation_errors_come_from_the_parser():
    with pytest.raises(SiddhiQLError, match="cannot compare int with string"):
        AppRuntime("define stream S (a int, b string);\nfrom S[a > b] select a insert into O;")


def test_engine_specific_limits_are_load_errors():
    with pytest.raises(SiddhiQLError, match="window.length must be a constant"):
        AppRuntime("define stream S (a int);\nfrom S#window.length(a) select a insert into O;")
    with pytest.raises(SiddhiQLError, match="not supported by the engine"):
        AppRuntime("define stream S (a int);\nfrom S select math:rand() as r insert into O;")


def test_playback_sends_split_by_timestamp_and_timers_fire_first():
    runtime = AppRuntime("@app:playback\n" + STOCKS + "@info(name='q') from S#window.time(1 sec) select symbol insert all events into O;")
    chunks = []
    runtime.add_query_callback("q", lambda ts, cur, rem: chunks.append((ts, [e.data[0] for e in cur or []], [e.data[0] for e in rem or []])))
    runtime.send("S", [("A", 1.0, 1), ("B", 1.0, 1), ("C", 1.0, 1)], timestamps=[1000, 1000, 2500])
    assert chunks == [(1000, ["A", "B"], []), (2500, [], ["A", "B"]), (2500, ["C"], [])]
    runtime.advance_time(3500)
    assert chunks[-1] == (3500, [], ["C"])


def test_wall_clock_timers_fire_without_new_events():
    runtime = AppRuntime(STOCKS + "@info(name='q') from S#window.time(100 milliseconds) select symbol insert expired events into O;")
    expired = collect(runtime, "O")
    try:
        runtime.send("S", [("A", 1.0, 1)])
        deadline = time.monotonic() + 5
        while not expired and time.monotonic() < deadline:
            time.sleep(0.02)
        assert expired == [("A",)]
    finally:
        runtime.shutdown()


def test_a_driven_clock_fires_only_when_its_host_advances_it_and_says_when_to_come_back():
    app = STOCKS + (
        "@info(name='t') from S#window.time(1 sec) select symbol insert expired events into Gone;\n"
        "@info(name='b') from S#window.timeBatch(500 milliseconds) select count() as n insert into Counts;\n"
    )
    runtime = AppRuntime(app, clock=DrivenClock(10_000))
    gone, counts = collect(runtime, "Gone"), collect(runtime, "Counts")
    assert runtime.uses_timers and not runtime.playback and runtime.next_wakeup() is None
    runtime.send("S", [("A", 1.0, 1), ("B", 1.0, 1)], timestamps=[10_000, 10_200])
    assert runtime.next_wakeup() == 10_500  # the batch's end comes before A's expiry at 11_000
    time.sleep(0.6)  # real time passing does nothing: only the host moves this clock
    assert (gone, counts) == ([], [])
    runtime.advance_time(10_500)
    assert counts == [(2,)] and gone == [] and runtime.next_wakeup() == 11_000
    # a snapshot taken between wake-ups carries the armed timers into a fresh runtime
    other = AppRuntime(app, clock=DrivenClock(0))
    other_gone = collect(other, "Gone")
    other.restore(runtime.snapshot())
    assert other.next_wakeup() == 11_000
    other.advance_time(11_300)
    assert other_gone == [("A",), ("B",)] and other.next_wakeup() == 11_500  # timeBatch keeps its beat
    # an event stamped in the past arms a timer already due: the next advance fires it, at the same time
    other.send("S", [("C", 1.0, 1)], timestamps=[10_250])
    assert other.next_wakeup() == 11_250
    other.advance_time(11_300)
    assert other_gone[-1] == ("C",) and other.next_wakeup() == 11_500
    assert not AppRuntime(STOCKS + "from S#window.length(2) select symbol insert into O;", clock=DrivenClock()).uses_timers


def test_advance_time_is_refused_on_the_wall_clock():
    runtime = AppRuntime(STOCKS + "from S#window.time(1 sec) select symbol insert into O;")
    try:
        with pytest.raises(EngineError, match="DrivenClock"):
            runtime.advance_time(5)
    finally:
        runtime.shutdown()


def test_output_buffer_drains_arrow_batches():
    runtime = AppRuntime(STOCKS + "from S#window.lengthBatch(2) select symbol, sum(volume) as total insert into O;")
    buffer = runtime.add_buffer("O")
    runtime.send("S", [("A", 1.0, 1), ("B", 1.0, 2), ("C", 1.0, 3), ("D", 1.0, 4)])
    batch, timestamps = buffer.drain()
    assert batch.to_pylist() == [{"symbol": "B", "total": 3}, {"symbol": "D", "total": 7}]
    assert len(timestamps) == 2
    assert buffer.drain()[0].num_rows == 0


def test_snapshot_restores_into_a_fresh_runtime_and_rejects_strangers():
    app = "@app:playback\n" + STOCKS + "partition with (symbol of S) begin from S#window.length(2) select symbol, sum(volume) as total insert into O; end;"
    first = AppRuntime(app)
    first.send("S", [("A", 1.0, 1), ("B", 1.0, 10), ("A", 1.0, 2)], timestamps=[1, 2, 3])
    state = first.snapshot()
    second = AppRuntime(app)
    out = collect(second, "O")
    second.restore(state)
    second.send("S", [("A", 1.0, 4), ("B", 1.0, 20)], timestamps=[4, 5])
    assert out == [("A", 6), ("B", 30)]
    with pytest.raises(EngineError, match="not a snapshot"):
        second.restore(b"garbage")
    with pytest.raises(EngineError, match="different app"):
        AppRuntime(STOCKS + "from S select symbol insert into O;").restore(state)
    hostile = zlib.compress(pickle.dumps({"version": 1, "parts": time.sleep}))
    with pytest.raises(EngineError, match="not a snapshot"):
        second.restore(hostile)


def test_inner_streams_are_per_partition_key():
    app = STOCKS + ("partition with (symbol of S) begin from S select symbol, volume insert into #T; from #T select symbol, count() as n insert into O; end;")
    runtime = AppRuntime(app)
    out = collect(runtime, "O")
    runtime.send("S", [("A", 1.0, 1)])
    runtime.send("S", [("B", 1.0, 1)])
    runtime.send("S", [("A", 1.0, 1)])
    assert out == [("A", 1), ("B", 1), ("A", 2)]


def test_time_rate_limit_follows_playback_time():
    runtime = AppRuntime("@app:playback\n" + STOCKS + "from S select symbol output all every 10 sec insert into O;")
    out = collect(runtime, "O")
    runtime.send("S", [("A", 1.0, 1), ("B", 1.0, 1)], timestamps=[1000, 5000])
    assert out == []
    runtime.send("S", [("C", 1.0, 1)], timestamps=[11000])
    assert out == [("A",), ("B",)]
    runtime.send("S", [("D", 1.0, 1)], timestamps=[60000])
    assert out == [("A",), ("B",), ("C",)]


def test_snapshot_rate_limit_emits_the_window_contents():
    runtime = AppRuntime("@app:playback\n" + STOCKS + "from S#window.length(2) select symbol, price output snapshot every 10 sec insert all events into O;")
    out = collect(runtime, "O")
    runtime.send("S", [("A", 1.0, 1), ("B", 2.0, 1), ("C", 3.0, 1)], timestamps=[1000, 2000, 3000])
    runtime.send("S", [("D", 4.0, 1)], timestamps=[12000])
    assert out == [("B", 2.0), ("C", 3.0)]


def test_queries_may_read_streams_written_further_down():
    app = (
        "define stream A (x int);\n"
        "from B select y * 2 as z insert into C;\n"
        "from A select x as y insert into B;\n"
        "partition with (x of A) begin from #P select y insert into D; from A select x as y insert into #P; end;\n"
    )
    runtime = AppRuntime(app)
    doubled, inner = collect(runtime, "C"), collect(runtime, "D")
    runtime.send("A", [(21,)])
    assert doubled == [(42,)] and inner == [(21,)]


def test_shutdown_twice_is_harmless():
    runtime = AppRuntime("@app:playback\n" + STOCKS + "from S#window.time(1 sec) select symbol insert into O;")
    runtime.send("S", [("A", 1.0, 1)], timestamps=[5])
    runtime.shutdown()
    runtime.shutdown()


def test_update_or_insert_with_set_and_primary_key_survives_snapshot():
    app = (
        "define stream S (symbol string, price double);\n"
        "@primaryKey('symbol') define table T (symbol string, price double, hits long);\n"
        "from S select symbol, price, 1L as hits update or insert into T set T.price = price, T.hits = T.hits + 1L on T.symbol == symbol;\n"
        "define stream Q (symbol string);\n"
        "@info(name='q') from Q join T on Q.symbol == T.symbol select T.symbol, T.price, T.hits insert into O;\n"
    )
    runtime = AppRuntime(app)
    seen = []
    runtime.add_callback("O", lambda events: seen.extend(e.data for e in events))
    runtime.send("S", [("IBM", 1.0), ("WSO2", 2.0), ("IBM", 3.0)])
    other = AppRuntime(app)
    other.add_callback("O", lambda events: seen.extend(e.data for e in events))
    other.restore(runtime.snapshot())
    other.send("Q", [("IBM",), ("X",)])
    assert seen == [("IBM", 3.0, 2)]
