"""Tables with @store(type='rdbms'): the same behaviour as in-memory tables, on SQLite, MariaDB and PostgreSQL.

Every app here is written with plain `define table`s, run once in memory, then rewritten with
a @store annotation pointing at each backend (real servers, a fresh database per test) and run
again: the outputs must be identical, event for event, and so must on-demand query results.
The conformance cases that use tables are replayed the same way, and must still pass.
"""

from __future__ import annotations

import subprocess
from dataclasses import replace

import pytest
import sqlalchemy as sa

from sp_dagster.embedded.broker import free_port
from sp_dagster.engine import AppRuntime, EngineError
from sp_dagster.engine.conformance import load_cases, run_case
from sp_dagster.siddhi import SiddhiQLError
from tests.fixtures.conformance import FILES
from tests.fixtures.stores import store_for

# --------------------------------------------------------------------------- scenarios


def play(app: str, steps: list) -> list:
    """Run `steps` ("send", stream, rows) / ("query", text) and return everything observed, in order."""
    seen: list = []
    runtime = AppRuntime(app)
    try:
        for name in sorted(runtime.streams):
            if name.startswith("O"):
                runtime.add_callback(name, lambda events, name=name: seen.extend((name, e.data) for e in events))
        for step in steps:
            if step[0] == "send":
                runtime.send(step[1], step[2])
            else:
                seen.append(("query", step[1], [e.data for e in runtime.query(step[1])]))
    finally:
        runtime.shutdown()
    return seen


UPSERT = (
    """
define stream S (symbol string, price float, volume long);
define stream U (symbol string, price float, volume long);
define stream Q (symbol string);
@primaryKey('symbol')
define table T (symbol string, price float, volume long);
from S insert into T;
from U update or insert into T set T.price = price, T.volume = T.volume + volume on T.symbol == symbol;
@info(name = 'j') from Q join T on T.symbol == Q.symbol select Q.symbol, T.price, T.volume insert into O1;
""",
    [
        ("send", "S", [("IBM", 10.1, 100), ("WSO2", 20.2, 200), ("IBM", 11.0, 1)]),
        ("send", "U", [("IBM", 12.3, 5), ("GOOG", 30.7, 300), ("GOOG", 31.5, 1)]),
        ("send", "Q", [("IBM",), ("GOOG",), ("WSO2",), ("X",)]),
        ("query", "from T select *"),
        ("query", "select 'ORCL' as symbol, 1.5f as price, 7L as volume update or insert into T set T.volume = volume on T.symbol == symbol"),
        ("query", "select 'IBM' as symbol, 1.5f as price, 7L as volume update or insert into T set T.volume = volume on T.symbol == symbol"),
        ("query", "select 'IBM' as symbol, 1.5f as price, 9L as volume insert into T"),
        ("query", "from T on T.volume < 100 select symbol, volume order by volume"),
    ],
)

DELETE = (
    """
define stream S (symbol string, price double, volume int, active bool);
define stream D1 (limit int);
define stream D2 (symbol string);
define stream D3 (n int);
define stream Q (n int);
define table T (symbol string, price double, volume int, active bool);
from S insert into T;
from D1 delete T on T.volume * 2 > limit;
from D2 delete T on T.symbol == symbol or T.price is null;
from D3 delete T on not (T.active == true) and n > 0;
@info(name = 'all') from Q join T select T.symbol, T.price, T.volume, T.active insert into O1;
""",
    [
        (
            "send",
            "S",
            [
                ("A", 1.5, 10, True),
                ("B", None, 20, False),
                ("A", 1.5, 10, True),
                ("C", 3.25, 30, None),
                (None, 4.0, 5, True),
                ("E", 2.0, 1, False),
                ("F", 5.5, 2, None),
            ],
        ),
        ("send", "Q", [(1,)]),
        ("send", "D1", [(50,)]),
        ("send", "Q", [(1,)]),
        ("send", "D3", [(0,)]),
        ("send", "Q", [(1,)]),
        ("send", "D3", [(1,)]),
        ("send", "Q", [(1,)]),
        ("send", "D2", [("A",)]),
        ("query", "from T select *"),
        ("query", "delete T on T.symbol is null"),
        ("query", "from T select count() as n"),
    ],
)

UPDATE = (
    """
define stream S (symbol string, price float, volume long);
define stream U1 (symbol string, price float);
define stream U2 (v long, price float);
define stream U3 (symbol string, price float, volume long);
define stream Q (symbol string);
define table T (symbol string, price float, volume long);
from S insert into T;
from U1 update T set T.price = price on T.symbol == symbol;
from U2 update T set T.price = price, T.volume = T.volume * 2 on T.volume + 1 == v;
from U3 update T on T.symbol == symbol;
@info(name = 'chk') from Q[(symbol == T.symbol and T.price > 50.0) in T] insert into O1;
@info(name = 'left') from Q left outer join T on Q.symbol == T.symbol select Q.symbol as s, T.price as p, T.volume as v insert into O2;
""",
    [
        ("send", "S", [("IBM", 10.5, 100), ("WSO2", 55.6, 10), ("IBM", 20.25, 7), ("MSFT", 1.0, 3)]),
        ("send", "Q", [("IBM",), ("WSO2",), ("NONE",)]),
        ("send", "U1", [("IBM", 75.5), ("NONE", 1.0)]),
        ("send", "Q", [("IBM",)]),
        ("send", "U2", [(8, 99.0), (4, 2.5)]),
        ("send", "Q", [("IBM",), ("MSFT",)]),
        ("send", "U3", [("WSO2", 1.25, 11)]),
        ("send", "Q", [("WSO2",)]),
        ("query", "update T set T.volume = T.volume + 1000 on T.symbol == 'IBM'"),
        ("query", "from T on T.volume > 500 select symbol, sum(volume) as total, count() as n group by symbol"),
        ("query", "from T as t select t.symbol, t.price order by price desc limit 2"),
    ],
)

JOIN_IN = (
    """
define stream S (symbol string, volume long);
define stream Q (symbol string, min long);
define table T (symbol string, volume long);
from S insert into T;
@info(name = 'in1') from Q[(Q.symbol == T.symbol and T.volume % 2 == 0) in T] select symbol insert into O1;
@info(name = 'in2') from Q[not ((symbol == T.symbol and T.volume >= min) in T)] select symbol insert into O2;
@info(name = 'left') from T join Q on T.symbol == Q.symbol and T.volume > Q.min select T.symbol, T.volume, Q.min insert into O3;
@info(name = 'agg') from Q join T on T.symbol != Q.symbol select Q.symbol, count() as n, sum(T.volume) as total group by Q.symbol insert into O4;
""",
    [
        ("send", "S", [("A", 1), ("B", 2), ("A", 3), ("A", 4), ("C", 5), ("B", 7)]),
        ("send", "Q", [("A", 0), ("B", 5), ("C", 9), ("D", 0)]),
        ("send", "Q", [("A", 2)]),
        ("query", "from T on T.volume >= 3 select symbol, sum(volume) as total group by symbol having total > 4 order by symbol"),
    ],
)

STRINGS = (
    """
define stream S (name string, n int);
define stream Q (name string);
define table T (name string, n int);
from S insert into T;
@info(name = 'eq') from Q join T on T.name == Q.name select T.name, T.n insert into O1;
@info(name = 'ne') from Q join T on T.name != Q.name select Q.name as q, T.n insert into O2;
""",
    [
        ("send", "S", [("abc", 1), ("ABC", 2), ("abc ", 3), ("ab", 4), ("", 5), (None, 6)]),
        ("send", "Q", [("abc",), ("ABC",), ("",), ("Abc",)]),
        ("query", "from T on T.name == 'abc' select n"),
        ("query", "from T on T.name != 'abc' select n"),
    ],
)

UPSERT_NO_KEY = (
    """
define stream U (k string, v int);
define stream Q (k string);
define table T (k string, v int);
from U update or insert into T set T.v = v on T.k == k;
@info(name = 'q') from Q join T on T.k == Q.k select T.k, T.v insert into O1;
""",
    [
        ("send", "U", [("a", 1), ("a", 1), ("b", 2), ("a", 1), ("b", 3)]),  # same values again: still a match
        ("send", "Q", [("a",), ("b",)]),
        ("query", "from T select *"),
    ],
)

SCENARIOS = {"upsert": UPSERT, "upsert-no-key": UPSERT_NO_KEY, "delete": DELETE, "update": UPDATE, "join-in": JOIN_IN, "strings": STRINGS}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_store_table_behaves_as_the_in_memory_table(store, name):
    app, steps = SCENARIOS[name]
    expected = play(app, steps)
    assert expected, "the scenario observes nothing"
    assert play(store.rewrite(app), steps) == expected


def test_rows_outlive_the_runtime_and_are_not_in_snapshots(store):
    app = store.rewrite("define stream S (k string, v int);\n@primaryKey('k')\ndefine table T (k string, v int);\nfrom S insert into T;")
    first = AppRuntime(app)
    first.send("S", [("a", 1), ("b", 2)])
    state = first.snapshot()
    first.query("delete T on T.k == 'a'")
    first.shutdown()
    second = AppRuntime(app)
    try:
        assert [e.data for e in second.query("from T select *")] == [("b", 2)]
        second.restore(state)  # the database is the table's state: a snapshot does not roll it back
        assert [e.data for e in second.query("from T select *")] == [("b", 2)]
        second.send("S", [("b", 3), ("c", 4)])  # b is already there: dropped, as in memory
        assert [e.data for e in second.query("from T select *")] == [("b", 2), ("c", 4)]
    finally:
        second.shutdown()


@pytest.mark.parametrize("kind", ["postgresql", "mariadb"])
def test_a_database_that_goes_away_fails_the_send_and_is_used_again_when_back(database_server_factory, tmp_path, kind):
    server = database_server_factory(kind)
    store = store_for(kind, server.create_database(), tmp_path)
    runtime = AppRuntime(store.rewrite("define stream S (k string);\ndefine table T (k string);\nfrom S insert into T;"))
    try:
        runtime.send("S", [("before",)])
        server.stop(immediate=True)
        with pytest.raises(EngineError) as raised:
            runtime.send("S", [("during",)])
        message = str(raised.value)
        assert "\n" not in message and message.startswith("table T: cannot connect to the database at ")
        server.start()
        runtime.send("S", [("after",)])
        assert [e.data for e in runtime.query("from T select k")] == [("before",), ("after",)]
    finally:
        runtime.shutdown()


# --------------------------------------------------------------------------- conformance


def _table_cases():
    params = []
    for path in FILES:
        for case in load_cases(path):
            if "define table" in case.app:
                params.append(pytest.param(case, id=f"{path.stem}:{case.id}"))
    return params


@pytest.mark.skipif(not FILES, reason="no conformance files")
@pytest.mark.parametrize("case", _table_cases())
def test_conformance_table_cases_on_a_store(store, case):
    """The conformance cases with tables, their tables kept in the store: same outputs as in memory."""
    in_memory = run_case(case)
    stored = run_case(replace(case, app=store.rewrite(case.app)))
    assert stored.passed, stored.error or "\n".join(stored.differences)
    assert (stored.in_events, stored.remove_events, stored.invocations) == (in_memory.in_events, in_memory.remove_events, in_memory.invocations)


@pytest.mark.skipif(not FILES, reason="no conformance files")
@pytest.mark.parametrize("case", [p for p in _table_cases() if len(p.values[0].inputs) >= 2])
def test_conformance_table_cases_on_a_store_survive_snapshot_and_restore(store, case):
    stored = run_case(replace(case, app=store.rewrite(case.app)), restore_at=len(case.inputs) // 2)
    assert stored.passed, stored.error or "\n".join(stored.differences)


def test_conformance_has_table_cases():
    if FILES:
        assert len(_table_cases()) >= 8


# --------------------------------------------------------------------------- the SQL


def _statements(runtime: AppRuntime, table: str) -> list[str]:
    seen: list[str] = []
    sa.event.listen(runtime.context.tables[table].engine, "before_cursor_execute", lambda conn, cursor, statement, *a: seen.append(statement))
    return seen


def test_sql_has_bound_parameters_only_and_filters_in_the_database(store):
    app = store.rewrite(
        "define stream S (symbol string, volume long);\ndefine stream Q (symbol string, min long);\n"
        "define table T (symbol string, volume long);\nfrom S insert into T;\n"
        "from Q join T on T.symbol == Q.symbol and T.volume > Q.min * 2 select T.symbol, T.volume insert into O;\n"
        "from Q delete T on T.symbol == symbol and T.volume < min;"
    )
    runtime = AppRuntime(app)
    statements = _statements(runtime, "T")
    out: list = []
    runtime.add_callback("O", lambda events: out.extend(e.data for e in events))
    runtime.send("S", [("Secret'Name", 10), ("Other", 99)])
    runtime.send("Q", [("Secret'Name", 4)])
    runtime.shutdown()
    assert out == [("Secret'Name", 10)]
    text = "\n".join(statements)
    assert "Secret" not in text and "99" not in text and " 8" not in text  # values travel as parameters
    selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    deletes = [s for s in statements if s.lstrip().upper().startswith("DELETE")]
    assert selects and all("WHERE" in s.upper() for s in selects)  # the join's condition runs in SQL
    assert deletes and all("WHERE" in s.upper() for s in deletes)


def test_table_is_created_with_keys_indexes_and_lengths(store):
    app = store.rewrite(
        "@primaryKey('symbol')\n@index('volume')\ndefine table StockTable (symbol string, price float, volume long, ok bool, d double, n int);",
        **{"field.length": "symbol:100", "table.name": "stocks_t"},
    )
    AppRuntime(app).shutdown()
    inspector = sa.inspect(sa.create_engine(store.url))
    columns = {c["name"]: c for c in inspector.get_columns("stocks_t")}
    assert set(columns) == {"sp_dagster_seq", "symbol", "price", "volume", "ok", "d", "n"}
    if store.kind != "sqlite":
        assert columns["symbol"]["type"].length == 100
    uniques = inspector.get_unique_constraints("stocks_t")
    indexes = inspector.get_indexes("stocks_t")
    assert any(u["column_names"] == ["symbol"] for u in uniques) or any(i["column_names"] == ["symbol"] and i["unique"] for i in indexes)
    assert any(i["column_names"] == ["volume"] for i in indexes)


def test_an_existing_table_is_used_as_it_is(store):
    engine = sa.create_engine(store.url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE stocktable (SYMBOL VARCHAR(20), volume BIGINT)"))
        conn.execute(sa.text("INSERT INTO stocktable VALUES ('IBM', 5), ('WSO2', 6)"))
    engine.dispose()
    runtime = AppRuntime(
        store.rewrite("define stream S (symbol string, volume long);\ndefine table StockTable (symbol string, volume long);\nfrom S insert into StockTable;")
    )
    try:
        runtime.send("S", [("GOOG", 7)])
        rows = sorted(e.data for e in runtime.query("from StockTable on volume > 5 select symbol, volume"))
        assert rows == [("GOOG", 7), ("WSO2", 6)]
    finally:
        runtime.shutdown()


# --------------------------------------------------------------------------- mistakes


def test_unreachable_database_is_one_line_naming_table_url_and_remedy():
    port = free_port()
    app = (
        f"@store(type='rdbms', jdbc.url='jdbc:mysql://127.0.0.1:{port}/db', username='u', password='s3cret', "
        "jdbc.driver.name='com.mysql.jdbc.Driver')\ndefine table StockTable (symbol string);"
    )
    with pytest.raises(EngineError) as raised:
        AppRuntime(app)
    message = str(raised.value)
    assert "\n" not in message
    assert "StockTable" in message and f"127.0.0.1:{port}/db" in message and "u:***@" in message
    assert "s3cret" not in message
    assert "check that the server is running" in message


@pytest.mark.parametrize(
    "annotation, fragment",
    [
        ("@store(type='rdbms', jdbc.url='jdbc:db2://h:50000/db')", "jdbc.url 'jdbc:db2://h:50000/db' is not supported"),
        ("@store(type='rdbms')", "needs jdbc.url (or datasource)"),
        ("@store(type='mongodb', mongodb.uri='mongodb://h/db')", "type 'mongodb' is not supported"),
        ("@store(type='rdbms', jdbc.url='jdbc:sqlite:/tmp/x.db', jdbc.urll='x')", "no option 'jdbc.urll'"),
        ("@store(type='rdbms', jndi.resource='java:comp/env/jdbc/x')", "jndi.resource needs a Java application server"),
        ("@store(type='rdbms', datasource='STOCKS_DB')", "this runtime was given none"),
        ("@store(type='rdbms', jdbc.url='jdbc:sqlite:/tmp/x.db', field.length='volume:10')", "applies to string attributes"),
        ("@store(type='rdbms', jdbc.url='jdbc:sqlite:/tmp/x.db', field.length='symbol')", "'attribute:length' pairs"),
        ("@store(type='rdbms', jdbc.url='jdbc:mysql://h/db', jdbc.driver.name='org.postgresql.Driver')", "drives postgresql"),
        ("@store(type='rdbms', jdbc.url='jdbc:sqlite:/tmp/x.db', pool.properties='maximumPoolSize:none')", "maximumPoolSize must be a whole number"),
    ],
)
def test_store_mistakes_point_at_the_annotation(annotation, fragment):
    app = f"define stream S (symbol string, volume long);\n{annotation}\ndefine table T (symbol string, volume long);\nfrom S insert into T;"
    with pytest.raises(SiddhiQLError) as raised:
        AppRuntime(app)
    assert fragment in raised.value.message
    assert raised.value.line == 2


def test_datasource_refers_to_the_runtimes_datasources(tmp_path):
    from sp_dagster.config.datasources import Datasource

    url = f"sqlite:///{tmp_path / 'ds.db'}"
    app = "define stream S (k string);\n@store(type='rdbms', datasource='TABLES_DB')\ndefine table T (k string);\nfrom S insert into T;"
    runtime = AppRuntime(app, datasources={"TABLES_DB": Datasource("TABLES_DB", url)})
    runtime.send("S", [("x",)])
    runtime.shutdown()
    with sa.create_engine(url).connect() as conn:
        assert conn.execute(sa.text("SELECT k FROM T")).all() == [("x",)]
    with pytest.raises(SiddhiQLError, match="'TABLES_DB' is not among the datasources of the deployment.yaml in use \\(OTHER\\)"):
        AppRuntime(app, datasources={"OTHER": Datasource("OTHER", url)})


def test_h2_urls_run_on_sqlite(sp_home):
    app = "define stream S (k string);\n@store(type='rdbms', jdbc.url='jdbc:h2:./tables/db', username='sa', jdbc.driver.name='org.h2.Driver')\ndefine table T (k string);\nfrom S insert into T;"
    runtime = AppRuntime(app)
    runtime.send("S", [("x",)])
    runtime.shutdown()
    runtime = AppRuntime(app)
    assert [e.data for e in runtime.query("from T select k")] == [("x",)]
    runtime.shutdown()


# --------------------------------------------------------------------------- the query command


@pytest.fixture
def cli(capsys):
    """`sp-dagster ARGS...` in this process: (exit code, stdout, stderr)."""
    from sp_dagster.cli import main

    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    return run


def test_query_command_reads_a_stored_table(store, tmp_path, cli):
    app = tmp_path / "app.siddhi"
    app.write_text(store.rewrite("define stream S (symbol string, price float);\ndefine table T (symbol string, price float);\nfrom S insert into T;"))
    events = tmp_path / "events.jsonl"
    events.write_text('{"stream": "S", "data": ["IBM", 55.6]}\n{"stream": "S", "data": ["WSO2", 10.5]}\n')
    # the events go into the database through `run`; `query` builds the app anew and reads them back
    assert cli("run", str(app), "--input", str(events)).returncode == 0
    result = cli("query", str(app), "from T on price > 20 select symbol, price")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["symbol  price", "IBM     55.6", "(1 row)"]
    result = cli("query", str(app), "from T select * order by price", "--json")
    assert result.stdout.splitlines() == ['{"symbol": "WSO2", "price": 10.5}', '{"symbol": "IBM", "price": 55.6}']


def test_query_command_replays_events_into_memory_tables_and_reports_mistakes(tmp_path, cli):
    app = tmp_path / "app.siddhi"
    app.write_text("define stream S (symbol string, volume long);\ndefine table T (symbol string, volume long);\nfrom S insert into T;\n")
    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(f'{{"stream": "S", "data": ["{symbol}", {volume}]}}' for symbol, volume in [("A", 1), ("B", 2), ("A", 3)]) + "\n")
    result = cli("query", str(app), "from T select symbol, sum(volume) as total group by symbol order by total desc", "--events", str(events))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["symbol  total", "A       4", "B       2", "(2 rows)"]
    empty = cli("query", str(app), "from T select *")
    assert empty.stdout.splitlines() == ["symbol  volume", "(0 rows)"]
    unknown = cli("query", str(app), "from Nope select *")
    assert unknown.returncode == 1
    assert unknown.stderr.startswith("error: query:1:6: 'Nope' is not a table")
    bad = cli("query", str(app), "from T select symbol,")
    assert bad.returncode == 1 and bad.stderr.startswith("error: query:1:")


# --------------------------------------------------------------------------- on-demand queries


ON_DEMAND_APP = """
define stream S (symbol string, price float, volume long);
@primaryKey('symbol')
define table T (symbol string, price float, volume long);
from S insert into T;
"""


def test_on_demand_queries_find_aggregate_and_change_tables():
    runtime = AppRuntime(ON_DEMAND_APP)
    try:
        runtime.send("S", [("IBM", 50.5, 100), ("WSO2", 10.0, 20), ("GOOG", 70.25, 5), ("ORCL", 5.0, 100)])

        def rows(text):
            return [e.data for e in runtime.query(text)]

        assert rows("from T") == [("IBM", 50.5, 100), ("WSO2", 10.0, 20), ("GOOG", 70.25, 5), ("ORCL", 5.0, 100)]
        assert rows("from T on price > 20 select symbol") == [("IBM",), ("GOOG",)]
        assert rows("from T as t on t.volume == 100 select t.symbol, price * 2 as p") == [("IBM", 101.0), ("ORCL", 10.0)]
        assert rows("from T select volume, count() as n group by volume having n > 1") == [(100, 2)]
        assert rows("from T select sum(volume) as total, max(price) as top") == [(225, 70.25)]
        assert rows("from T select symbol, price order by price desc limit 2 offset 1") == [("IBM", 50.5), ("WSO2", 10.0)]
        assert rows("delete T on T.volume == 100") == []
        assert rows("update T set T.price = T.price + 1f on T.symbol == 'WSO2'") == []
        assert rows("select 'MSFT' as symbol, 3.5f as price, 9L as volume insert into T") == []
        assert rows("select 'GOOG' as symbol, 1f as price, 1L as volume update or insert into T on T.symbol == symbol") == []
        assert rows("from T") == [("WSO2", 11.0, 20), ("GOOG", 1.0, 1), ("MSFT", 3.5, 9)]
        assert runtime.query("from T on price > 100") == []
    finally:
        runtime.shutdown()


@pytest.mark.parametrize(
    "text, fragment, column",
    [
        ("from Nope select *", "'Nope' is not a table", 6),
        ("from T on T.missing > 1 select *", "'T' has no attribute 'missing'", 11),
        ("from T select symbol,", "", 0),
        ("delete Nope on Nope.x == 1", "", 0),
        ("select 1 as a insert into T", "", 0),
    ],
)
def test_on_demand_mistakes_have_line_and_column(text, fragment, column):
    runtime = AppRuntime(ON_DEMAND_APP)
    try:
        with pytest.raises(SiddhiQLError) as raised:
            runtime.query(text)
    finally:
        runtime.shutdown()
    error = raised.value
    assert error.line == 1 and error.column >= 1 and error.excerpt
    assert fragment in error.message
    if column:
        assert error.column == column


def test_run_and_query_take_datasources_from_a_deployment_file(tmp_path, cli):
    conf = tmp_path / "deployment.yaml"
    conf.write_text(f"datasources:\n  TABLES_DB: sqlite:///{tmp_path / 'tables.db'}\n")
    app = tmp_path / "app.siddhi"
    app.write_text("define stream S (k string);\n@store(type='rdbms', datasource='TABLES_DB')\ndefine table T (k string);\nfrom S insert into T;\n")
    events = tmp_path / "events.jsonl"
    events.write_text('{"stream": "S", "data": ["x"]}\n')
    assert cli("run", str(app), "--input", str(events), "--conf", str(conf)).returncode == 0
    assert cli("query", str(app), "from T select k", "--conf", str(conf)).stdout.splitlines() == ["k", "x", "(1 row)"]
    without = cli("query", str(app), "from T select k")
    # Without --conf, the search order's file is used: it has no TABLES_DB, and the error says where to define it.
    assert without.returncode == 1 and f"{app}:2:22: @store datasource 'TABLES_DB' is not among the datasources of the deployment.yaml in use" in without.stderr
    assert "--conf FILE" in without.stderr and "config where" in without.stderr
