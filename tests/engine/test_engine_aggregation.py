"""Incremental aggregations beyond the conformance cases: database tables with Siddhi's names,
state rebuilt from them, shards sharing one store (seed 002), snapshots, errors with positions."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from sp_dagster.engine import AppRuntime, EngineError
from sp_dagster.engine.aggregation.settings import property_settings
from sp_dagster.siddhi import SiddhiQLError
from tests.fixtures.partial_apps import engine_only

BASE = 1496289950000  # 2017-06-01 04:05:50 GMT

APP = """@app:name('Trades')
@app:playback
define stream Trades (symbol string, price double, volume long, ts long);
{annotations}
define aggregation TradeAgg
from Trades
select symbol, sum(price) as total, count() as n, avg(volume) as avgVolume, max(price) as hi
group by symbol
aggregate by ts every sec ... year;
"""


def _app(*annotations: str) -> str:
    return APP.format(annotations="\n".join(annotations))


def _rows(runtime: AppRuntime, query: str) -> list[tuple]:
    return sorted(tuple(e.data) for e in runtime.query(query))


def test_tables_have_siddhis_names_columns_and_key(store):  # noqa: F811
    runtime = AppRuntime(_app(store.annotation(), "@PartitionById"), shard_id="node-1")
    try:
        runtime.send("Trades", [("IBM", 10.0, 3, BASE)], [BASE])
        runtime.advance_time(BASE + 1000)
        engine = sa.create_engine(store.url)
        inspector = sa.inspect(engine)
        names = {n.upper() for n in inspector.get_table_names()}
        assert {f"TRADEAGG_{d}" for d in ("SECONDS", "MINUTES", "HOURS", "DAYS", "MONTHS", "YEARS")} <= names
        table = next(n for n in inspector.get_table_names() if n.upper() == "TRADEAGG_SECONDS")
        columns = [c["name"].upper() for c in inspector.get_columns(table)]
        assert columns == ["AGG_TIMESTAMP", "SHARD_ID", "AGG_EVENT_TIMESTAMP", "SYMBOL", "AGG_SUM_PRICE", "AGG_COUNT", "AGG_SUM_VOLUME", "AGG_MAX_PRICE"]
        key = [c.upper() for c in inspector.get_pk_constraint(table)["constrained_columns"]]
        assert key == ["AGG_TIMESTAMP", "SHARD_ID", "AGG_EVENT_TIMESTAMP", "SYMBOL"]
        with engine.connect() as conn:
            rows = conn.execute(sa.select(sa.Table(table, sa.MetaData(), autoload_with=engine))).fetchall()
        assert [tuple(r) for r in rows] == [(BASE, "node-1", BASE, "IBM", 10.0, 1, 3, 10.0)]
        engine.dispose()
    finally:
        runtime.shutdown()


def test_two_shards_share_one_store_and_every_retrieval_merges_them(store):  # noqa: F811
    """Seed 002: node 1 aggregates 30, node 2 aggregates 40, a retrieval on either returns 70."""
    app = _app(store.annotation(), "@PartitionById")
    one, two = AppRuntime(app, shard_id="node-1"), AppRuntime(app, shard_id="node-2")
    try:
        one.send("Trades", [("WSO2", 10.0, 1, BASE), ("WSO2", 20.0, 1, BASE + 100)], [BASE, BASE + 100])
        two.send("Trades", [("WSO2", 40.0, 1, BASE + 200)], [BASE + 200])
        for runtime in (one, two):
            runtime.advance_time(BASE + 61_000)  # past the second and the minute: both are written
        for runtime in (one, two):
            for per in ("seconds", "minutes"):
                rows = _rows(runtime, f"from TradeAgg within '2017-06-01 **:**:**' per '{per}' select symbol, total, n")
                assert rows == [("WSO2", 70.0, 3)], per
    finally:
        one.shutdown()
        two.shutdown()


def test_a_shard_without_a_shard_id_is_siddhis_error_at_the_aggregation():
    with pytest.raises(SiddhiQLError) as raised:
        AppRuntime(_app("@PartitionById"))
    assert "Configuration 'shardId' not provided for @partitionById annotation" in str(raised.value)
    assert raised.value.errors[0].line == 5  # the `define aggregation` line
    with pytest.raises(SiddhiQLError, match="shardId"):
        AppRuntime(_app(), **property_settings({"partitionById": "true"}))
    AppRuntime(_app("@PartitionById(enable='false')"), partition_by_id=False).shutdown()


def test_state_is_rebuilt_from_the_tables_after_a_restart(store):  # noqa: F811
    """A runtime that stops mid-minute loses nothing the tables hold: a new one reads it back."""
    app = _app(store.annotation())
    first = AppRuntime(app)
    first.send("Trades", [("IBM", 1.0, 2, BASE), ("IBM", 2.0, 4, BASE + 1000)], [BASE, BASE + 1000])
    first.advance_time(BASE + 2000)  # both seconds are written; the minute is still open
    first.shutdown()
    second = AppRuntime(app)
    try:
        expected = [(BASE - BASE % 60_000, "IBM", 3.0, 2, 3, 2.0)]
        assert _rows(second, "from TradeAgg within '2017-06-** **:**:**' per 'minutes'") == expected
        second.send("Trades", [("IBM", 4.0, 6, BASE + 3000)], [BASE + 3000])
        second.advance_time(BASE + 70_000)  # the minute rolls over: written once, with all three
        assert _rows(second, "from TradeAgg within '2017-06-** **:**:**' per 'minutes' select total, n") == [(7.0, 3)]
        assert _rows(second, "from TradeAgg within '2017-06-** **:**:**' per 'hours' select total, n, avgVolume") == [(7.0, 3, 4)]
    finally:
        second.shutdown()


def test_snapshot_mid_bucket_restores_into_a_fresh_runtime():
    app = _app()
    first = AppRuntime(app)
    first.send("Trades", [("IBM", 1.0, 1, BASE), ("ORCL", 5.0, 1, BASE + 10)], [BASE, BASE + 10])
    state = first.snapshot()
    first.shutdown()
    second = AppRuntime(app)
    try:
        second.restore(state)
        second.send("Trades", [("IBM", 2.0, 1, BASE + 20)], [BASE + 20])
        second.advance_time(BASE + 5000)
        rows = _rows(second, "from TradeAgg within '2017-06-** **:**:**' per 'seconds' select symbol, total, n")
        assert rows == [("IBM", 3.0, 2), ("ORCL", 5.0, 1)]
    finally:
        second.shutdown()


@pytest.mark.parametrize(
    "query, message",
    [
        ("from TradeAgg within '2017-06-** **:**:**' per 'weeks'", "valid time function"),
        ("from TradeAgg within '2017-06-** 12:**:**' per 'hours'", "Incorrect format provided for within clause"),
        ("from TradeAgg within 1000L per 'hours'", "pattern"),
        ("from TradeAgg within 2000L, 1000L per 'hours'", "start time must be less than the end time"),
        ("from TradeAgg select *", "must contain a `per`"),
    ],
)
def test_bad_retrievals_fail_with_a_sentence(query, message):
    runtime = AppRuntime(_app())
    try:
        with pytest.raises((SiddhiQLError, EngineError), match=message):
            runtime.query(query)
    finally:
        runtime.shutdown()


def test_a_granularity_not_kept_fails_and_per_names_are_equal():
    runtime = AppRuntime(_app().replace("every sec ... year", "every sec, min, hour"))
    try:
        runtime.send("Trades", [("IBM", 1.0, 1, BASE)], [BASE])
        runtime.advance_time(BASE + 1000)
        for per in ("sec", "second", "seconds", "SECONDS"):
            assert _rows(runtime, f"from TradeAgg within '2017-**-** **:**:**' per '{per}' select total") == [(1.0,)]
        with pytest.raises(EngineError, match="does not contain DAYS duration"):
            runtime.query("from TradeAgg within '2017-**-** **:**:**' per 'days'")
    finally:
        runtime.shutdown()


def test_purge_retention_must_name_kept_granularities_and_drops_old_rows():
    with pytest.raises(SiddhiQLError, match="HOURS granularity cannot be purged"):
        AppRuntime(_app("@purge(enable='true', interval='10 sec', @retentionPeriod(sec='120 sec', hours='25 hours'))").replace("sec ... year", "sec ... min"))
    runtime = AppRuntime(_app("@purge(enable='true', interval='10 sec', @retentionPeriod(sec='120 sec', min='1 day'))"))
    try:
        runtime.send("Trades", [("IBM", 1.0, 1, BASE)], [BASE])
        runtime.advance_time(BASE + 60_000)
        assert _rows(runtime, "from TradeAgg within '2017-**-** **:**:**' per 'seconds' select total") == [(1.0,)]
        runtime.advance_time(BASE + 200_000)  # older than 120 s: the seconds row is purged, the minute stays
        assert _rows(runtime, "from TradeAgg within '2017-**-** **:**:**' per 'seconds' select total") == []
        assert _rows(runtime, "from TradeAgg within '2017-**-** **:**:**' per 'minutes' select total") == [(1.0,)]
    finally:
        runtime.shutdown()


def test_a_join_reads_within_and_per_from_the_event_and_an_unmatched_trigger_still_calls_back():
    app = _app() + (
        "define stream Ask (symbol string, start string, finish string, per string);\n"
        "@info(name='q') from Ask as q join TradeAgg as a on a.symbol == q.symbol within q.start, q.finish per q.per "
        "select a.AGG_TIMESTAMP as bucket, a.total as total insert into Out;\n"
    )
    runtime = AppRuntime(app)
    calls = []
    runtime.add_query_callback("q", lambda ts, current, expired: calls.append([e.data for e in current or ()]))
    try:
        runtime.send("Trades", [("IBM", 1.0, 1, BASE), ("IBM", 2.0, 1, BASE + 60_000)], [BASE, BASE + 60_000])
        runtime.advance_time(BASE + 121_000)
        runtime.send("Ask", [("IBM", "2017-06-01 04:00:00", "2017-06-01 05:00:00", "minutes")], [BASE + 121_000])
        runtime.send("Ask", [("ORCL", "2017-06-01 04:00:00", "2017-06-01 05:00:00", "minutes")], [BASE + 121_000])
        runtime.send("Ask", [("IBM", "2017-06-01 04:00:00", "2017-06-01 05:00:00", "fortnights")], [BASE + 121_000])
        minute = BASE - BASE % 60_000
        assert calls[0] == [(minute, 1.0), (minute + 60_000, 2.0)]
        assert calls[1:] == [[], []]  # no match, and a bad `per` (logged): still one call each
    finally:
        runtime.shutdown()


def test_planned_shards_fed_round_robin_merge_and_survive_a_move(store):  # noqa: F811
    """Seed 002 distributed: an aggregation group with parallel 2, events round robin, a lookup
    in another group joins the merged totals; a shard moved mid-bucket (snapshot, restore on a
    new runtime under the same shard id) changes no total."""
    from sp_dagster.siddhi import parse
    from sp_dagster.topology import plan

    app = f"""@App:name('Trades')
define stream QueryStream (symbol string);
define stream TradeStream (symbol string, price double, quantity long, ts long);
@dist(parallel='2') {store.annotation()}
define aggregation TradeAgg from TradeStream select symbol, sum(quantity) as total, count() as n group by symbol aggregate by ts every sec ... year;
@info(name='lookup') @dist(execGroup='lookup', parallel='1')
from QueryStream as Q join TradeAgg as A on Q.symbol == A.symbol within '2017-06-** **:**:**' per 'hours'
select A.symbol, A.total, A.n insert into TotalsStream;
"""
    topology = plan(parse(app))
    shards = topology.group("Trades-aggregation-TradeAgg").instances
    (lookup,) = topology.group("Trades-lookup").instances
    runtimes = [AppRuntime(engine_only(s.app), shard_id=s.shard_id) for s in shards]
    reader = AppRuntime(engine_only(lookup.app), shard_id=lookup.shard_id)
    totals = []
    reader.add_callback("TotalsStream", lambda events: totals.extend(e.data for e in events))
    try:
        quantities = [10, 20, 30, 40, 50, 60]
        for number, quantity in enumerate(quantities[:3]):  # round robin over the two shards
            runtimes[number % 2].send("TradeStream", [("WSO2", 1.0, quantity, BASE + number)], [BASE + number])
        moved = runtimes[1].snapshot()  # shard 2 dies mid-bucket; its instance resumes elsewhere
        runtimes[1].shutdown()
        runtimes[1] = AppRuntime(engine_only(shards[1].app), shard_id=shards[1].shard_id)
        runtimes[1].restore(moved)
        for number, quantity in enumerate(quantities[3:], 3):
            runtimes[number % 2].send("TradeStream", [("WSO2", 1.0, quantity, BASE + number)], [BASE + number])
        later = BASE + 3_700_000  # past the hour: every shard has written its hour rows
        for runtime in runtimes:
            runtime.advance_time(later)
        reader.send("QueryStream", [("WSO2",)], [later])
        assert totals == [("WSO2", sum(quantities), len(quantities))]
    finally:
        for runtime in (*runtimes, reader):
            runtime.shutdown()


def test_sp_dagster_query_reads_an_aggregation_from_its_store(tmp_path):
    """`sp-dagster query APP 'from A within ... per ...'` answers from the tables a deployment wrote."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "trades.siddhi"
    path.write_text(_app(f"@store(type='rdbms', jdbc.url='jdbc:sqlite:{tmp_path}/agg.db')"), encoding="utf-8")
    writer = AppRuntime(path.read_text(encoding="utf-8"))
    writer.send("Trades", [("IBM", 1.0, 2, BASE), ("IBM", 2.0, 4, BASE + 1000), ("ORCL", 5.0, 1, BASE + 1500)], [BASE, BASE + 1000, BASE + 1500])
    writer.advance_time(BASE + 5000)  # the seconds are written; the minute is open, rebuilt from them
    writer.shutdown()
    query = "from TradeAgg within '2017-06-01 **:**:**' per 'minutes' select symbol, total, n order by symbol"
    done = subprocess.run(
        [sys.executable, "-m", "sp_dagster.cli", "query", str(path), query, "--json"],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == [
        {"symbol": "IBM", "total": 3.0, "n": 2},
        {"symbol": "ORCL", "total": 5.0, "n": 1},
    ]


def test_observations_give_rows_and_the_newest_bucket_per_granularity(store):  # noqa: F811
    runtime = AppRuntime(_app(store.annotation(), "@PartitionById"), shard_id="n1")
    try:
        runtime.send("Trades", [("IBM", 1.0, 1, BASE), ("ORCL", 1.0, 1, BASE + 1000)], [BASE, BASE + 1000])
        runtime.advance_time(BASE + 61_000)
        seen = runtime.aggregations()["TradeAgg"]
        minute = BASE - BASE % 60_000
        assert seen["rows"] == {"SECONDS": 2, "MINUTES": 2, "HOURS": 0, "DAYS": 0, "MONTHS": 0, "YEARS": 0}
        assert seen["newest_bucket"] == {"SECONDS": BASE + 1000, "MINUTES": minute, "HOURS": None, "DAYS": None, "MONTHS": None, "YEARS": None}
        assert seen["shard_id"] == "n1"
    finally:
        runtime.shutdown()


def test_a_shard_restored_elsewhere_and_replaying_counts_each_event_once(store):  # noqa: F811
    """A worker's shard dies after writing rows its last snapshot does not cover; another worker
    restores the snapshot later on the wall clock (its timers fire first, as a host's do) and
    replays the events since: the merged totals count each event once, on every backend."""
    from sp_dagster.engine.clock import DrivenClock

    app = APP.format(annotations=f"{store.annotation()}\n@PartitionById").replace("@app:playback\n", "")
    now = 1_700_000_040_000  # processing time (the wall clock), an exact minute
    events = [(("IBM", 1.0, n, BASE + n * 1000), now + 100 * n) for n in range(1, 5)]  # quantities 1..4 as volume
    events[3] = (events[3][0], now + 1500)  # the last one in the next second
    first = AppRuntime(app, clock=DrivenClock(now), shard_id="shard-2")
    other = AppRuntime(app, clock=DrivenClock(now), shard_id="shard-1")
    reader = AppRuntime(app, clock=DrivenClock(now), shard_id="reader")
    try:
        other.send("Trades", [("IBM", 1.0, 100, BASE)], [now])  # the other shard's share
        for row, stamp in events[:2]:
            first.send("Trades", [row], [stamp])
        saved = first.snapshot()  # mid-second, mid-minute
        for row, stamp in events[2:]:
            first.send("Trades", [row], [stamp])
        for runtime in (first, other):
            runtime.advance_time(now + 61_000)  # seconds and the minute are written
        first.shutdown()  # killed: nothing more from it
        query = "from TradeAgg within '2017-06-** **:**:**' per '{}' select symbol, n, avgVolume"

        def totals() -> dict[str, tuple]:
            found = {}
            for per in ("seconds", "minutes", "hours"):
                rows = _rows(reader, query.format(per))
                found[per] = (sum(r[1] for r in rows), sum(r[1] * r[2] for r in rows))
            return found

        reader.advance_time(now + 61_000)
        assert totals() == dict.fromkeys(("seconds", "minutes", "hours"), (5, 110))

        later = now + 90_000
        moved = AppRuntime(app, clock=DrivenClock(later), shard_id="shard-2")
        try:
            moved.restore(saved)
            moved.advance_time(later)  # the restored timers fire first ...
            for row, stamp in events[2:]:  # ... then the replay
                moved.send("Trades", [row], [stamp])
            for runtime in (moved, other, reader):
                runtime.advance_time(later + 61_000)
            assert totals() == dict.fromkeys(("seconds", "minutes", "hours"), (5, 110))
        finally:
            moved.shutdown()
    finally:
        for runtime in (other, reader):
            runtime.shutdown()


def test_a_group_joining_an_unsharded_aggregation_restores_without_touching_its_rows(store):  # noqa: F811
    """The copy a joining group holds only reads the store: restoring it deletes none of the rows
    the aggregation's own instance wrote, before or after the copy's snapshot."""
    from sp_dagster.siddhi import parse
    from sp_dagster.topology import plan

    app = f"""@App:name('Trades')
define stream QueryStream (symbol string);
define stream TradeStream (symbol string, price double, quantity long, ts long);
{store.annotation()}
define aggregation TradeAgg from TradeStream select symbol, sum(quantity) as total group by symbol aggregate by ts every sec ... hour;
@info(name='lookup') @dist(execGroup='lookup', parallel='1')
from QueryStream as Q join TradeAgg as A on Q.symbol == A.symbol within '2017-06-** **:**:**' per 'seconds'
select A.symbol, A.total insert into TotalsStream;
"""
    topology = plan(parse(app))
    (writer_app,) = topology.group("Trades-aggregation-TradeAgg").instances
    (lookup,) = topology.group("Trades-lookup").instances
    writer = AppRuntime(engine_only(writer_app.app))
    reader = AppRuntime(engine_only(lookup.app))
    totals = []
    reader.add_callback("TotalsStream", lambda events: totals.extend(e.data for e in events))
    try:
        writer.send("TradeStream", [("WSO2", 1.0, 10, BASE)], [BASE])
        writer.advance_time(BASE + 2000)
        reader.send("QueryStream", [("WSO2",)], [BASE + 2000])  # the copy reads (and builds itself from) the store
        saved = reader.snapshot()
        writer.send("TradeStream", [("WSO2", 1.0, 20, BASE + 3000)], [BASE + 3000])
        writer.advance_time(BASE + 70_000)  # seconds and the minute written after the copy's snapshot
        rows = writer.aggregations()["TradeAgg"]["rows"]
        assert rows == {"SECONDS": 2, "MINUTES": 1, "HOURS": 0}
        reader.shutdown()
        reader = AppRuntime(engine_only(lookup.app))
        reader.add_callback("TotalsStream", lambda events: totals.extend(e.data for e in events))
        reader.restore(saved)
        assert writer.aggregations()["TradeAgg"]["rows"] == rows
        reader.send("QueryStream", [("WSO2",)], [BASE + 70_000])
        assert totals == [("WSO2", 10), ("WSO2", 10), ("WSO2", 20)]
    finally:
        writer.shutdown()
        reader.shutdown()


def test_a_copy_that_only_reads_the_store_sees_what_the_writer_wrote_since_its_last_read(store):  # noqa: F811
    """A group joining an unsharded aggregation holds a copy that only reads the tables: each retrieval
    reads them anew, so rows the writer rolled up after the copy's first read are never counted twice."""
    app = _app(store.annotation())
    writer, reader = AppRuntime(app), AppRuntime(app)
    minutes = "from TradeAgg within '2017-06-** **:**:**' per 'hours' select total, n"
    try:
        writer.send("Trades", [("IBM", 10.0, 2, BASE), ("IBM", 20.0, 4, BASE + 1000)], [BASE, BASE + 1000])
        writer.advance_time(BASE + 2000)  # the seconds are written; the minute is open in the writer
        assert _rows(reader, minutes) == [(30.0, 2)]
        writer.advance_time(BASE + 70_000)  # the minute rolls over and is written
        assert _rows(reader, minutes) == _rows(writer, minutes) == [(30.0, 2)]
        writer.send("Trades", [("IBM", 5.0, 6, BASE + 71_000)], [BASE + 71_000])
        writer.advance_time(BASE + 72_000)
        assert _rows(reader, minutes) == _rows(writer, minutes) == [(35.0, 3)]
    finally:
        writer.shutdown()
        reader.shutdown()


@pytest.mark.parametrize("reader_offset", [-400, 400], ids=["reader-behind", "reader-ahead"])
def test_a_reader_whose_clock_differs_from_the_shards_counts_each_event_once_at_a_roll_over(store, reader_offset):  # noqa: F811
    """Each host drives its own clock: a reader a little behind the shards (they rolled a minute up
    into the MINUTES table, its clock still in that minute) or a little ahead (its clock in the next
    minute, theirs not yet) reads the rows the tables hold, each event counted once."""
    from sp_dagster.engine.clock import DrivenClock

    app = APP.format(annotations=f"{store.annotation()}\n@PartitionById").replace("@app:playback\n", "")
    minute = 1_700_000_040_000  # processing time (the wall clock), an exact minute
    shards = [AppRuntime(app, clock=DrivenClock(minute), shard_id=f"shard-{n}") for n in (1, 2)]
    reader = AppRuntime(app, clock=DrivenClock(minute), shard_id="reader")
    query = "from TradeAgg within '2017-06-** **:**:**' per '{}' select symbol, n, avgVolume"
    try:
        for number, shard in enumerate(shards):
            shard.send("Trades", [("IBM", 1.0, 10 * (number + 1), BASE + number * 1000)], [minute + 20_000 + number * 1000])
        shards[0].send("Trades", [("IBM", 1.0, 30, BASE + 5000)], [minute + 30_000])
        roll = minute + 60_000
        for shard in shards:  # the shards' seconds are written; their minute rolls over, or is about to
            shard.advance_time(roll + (-reader_offset if reader_offset < 0 else -1))
        reader.advance_time(roll + reader_offset)
        for per in ("seconds", "minutes", "hours"):
            rows = _rows(reader, query.format(per))
            assert (sum(r[1] for r in rows), sum(r[1] * r[2] for r in rows)) == (3, 60), per
    finally:
        for runtime in (*shards, reader):
            runtime.shutdown()


@pytest.mark.parametrize("during", ["MINUTES", "HOURS"])
def test_a_shard_rolling_a_minute_up_while_a_retrieval_reads_is_counted_once(store, during):  # noqa: F811
    """The shards write the minute's MINUTES row while a reader's retrieval is between its reads of
    the tables (after it looked for the newest HOURS or MINUTES rows): each event still counts once."""
    from sp_dagster.engine.clock import DrivenClock

    app = APP.format(annotations=f"{store.annotation()}\n@PartitionById").replace("@app:playback\n", "")
    minute = 1_700_000_040_000
    shards = [AppRuntime(app, clock=DrivenClock(minute), shard_id=f"shard-{n}") for n in (1, 2)]
    reader = AppRuntime(app, clock=DrivenClock(minute), shard_id="reader")
    aggregation = reader.context.aggregations["TradeAgg"]
    newest_by_shard = aggregation.store.newest_by_shard

    def then_roll(duration: str):
        newest = newest_by_shard(duration)
        if duration == during:
            for shard in shards:
                shard.advance_time(minute + 60_000)
        return newest

    aggregation.store.newest_by_shard = then_roll
    try:
        for number, shard in enumerate(shards):
            shard.send("Trades", [("IBM", 1.0, 10 * (number + 1), BASE + number * 1000)], [minute + 20_000 + number * 1000])
            shard.advance_time(minute + 30_000)  # the seconds are written; the minute is open
        rows = _rows(reader, "from TradeAgg within '2017-06-** **:**:**' per 'hours' select symbol, n, avgVolume")
        assert [(symbol, n, n * avg) for symbol, n, avg in rows] == [("IBM", 2, 30)]
        assert reader.aggregations()["TradeAgg"]["rows"]["MINUTES"] == 2  # the shards did roll up meanwhile
    finally:
        for runtime in (*shards, reader):
            runtime.shutdown()


@pytest.mark.parametrize("per", ["minutes", "hours"])
def test_an_unsharded_writer_rolling_a_minute_up_while_a_copy_reads_is_counted_once(store, per):  # noqa: F811
    """The writer rolls a minute up into the MINUTES table while a copy that only reads the store is
    between its reads of the tables (after it looked where each table ends): each event still counts once."""
    app = _app(store.annotation())
    writer, reader = AppRuntime(app), AppRuntime(app)
    aggregation = reader.context.aggregations["TradeAgg"]
    newest = aggregation.store.newest
    query = f"from TradeAgg within '2017-06-** **:**:**' per '{per}' select total, n"

    def then_roll(shard=None):
        found = newest(shard)
        writer.advance_time(BASE + 70_000)  # between the newest reads and the rows' reads
        return found

    try:
        writer.send("Trades", [("IBM", 10.0, 2, BASE), ("IBM", 20.0, 4, BASE + 1000)], [BASE, BASE + 1000])
        writer.advance_time(BASE + 2000)  # the seconds are written; the minute is open in the writer
        aggregation.store.newest = then_roll
        assert _rows(reader, query) == [(30.0, 2)]
        assert writer.aggregations()["TradeAgg"]["rows"]["MINUTES"] == 1  # the writer did roll up meanwhile
    finally:
        writer.shutdown()
        reader.shutdown()
