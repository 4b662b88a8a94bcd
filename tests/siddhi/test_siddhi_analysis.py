"""The analysis resolves every name: inferred output streams, inner streams, query outputs."""

from __future__ import annotations

from sp_dagster.siddhi import ast, parse
from sp_dagster.siddhi.analysis import analyze
from sp_dagster.siddhi.types import ExpressionChecker
from sp_dagster.siddhi.validate import load_with_analysis


def signature(attributes) -> list[tuple[str, str]]:
    return [(a.name, a.type) for a in attributes]


def test_insert_into_an_undefined_stream_defines_it_with_inferred_types():
    app, analysis = load_with_analysis(
        "define stream Trades (symbol string, price float, volume int);\n"
        "from Trades#window.length(5) select symbol, avg(price) as avgPrice, sum(volume) as total, price * volume as value\n"
        "group by symbol insert into Stats;\n"
        "from Stats[avgPrice > 10] select symbol, total insert into Alerts;"
    )
    assert analysis.inferred == {"Stats", "Alerts"}
    assert signature(analysis.streams["Stats"].attributes) == [("symbol", "string"), ("avgPrice", "double"), ("total", "long"), ("value", "float")]
    assert signature(analysis.attributes("Alerts")) == [("symbol", "string"), ("total", "long")]
    stats = analysis.streams["Stats"]
    assert (stats.line, stats.column) == (3, 29), "an inferred stream sits where it is inserted into"


def test_a_query_may_read_a_stream_that_a_later_query_defines():
    app, analysis = load_with_analysis("define stream In (a int);\nfrom Mid select a * 2 as b insert into Out;\nfrom In select a insert into Mid;")
    first = next(q for q, _ in app.queries())
    assert signature(analysis.output(first)) == [("b", "int")]


def test_a_cycle_of_undefined_streams_is_an_error():
    analysis = analyze(parse("from A select x insert into B;\nfrom B select x insert into A;"))
    # B stays undefined because its only writer failed: that one error is reported, not its echo
    assert [(e.line, e.message) for e in analysis.errors] == [(1, "Stream 'A' is not defined.")]


def test_inner_streams_belong_to_their_partition():
    app, analysis = load_with_analysis(
        "define stream S (k string, v int);\n"
        "define stream Mid (k string, v double);\n"
        "partition with (k of S) begin\n"
        "  from S select k, v insert into #Mid;\n"
        "  from #Mid select k, v insert into Mid2;\n"
        "end;\n"
        "partition with (k of S) begin\n"
        "  from S select k, v * 1.5 as v insert into #Mid;\n"
        "  from #Mid select k, v insert into Mid;\n"
        "end;"
    )
    first, second = app.partitions
    assert signature(analysis.inner_streams(first)["Mid"].attributes) == [("k", "string"), ("v", "int")]
    assert signature(analysis.inner_streams(second)["Mid"].attributes) == [("k", "string"), ("v", "double")]
    assert signature(analysis.attributes("Mid")) == [("k", "string"), ("v", "double")]
    assert signature(analysis.attributes("Mid2")) == [("k", "string"), ("v", "int")]


def test_definitions_of_every_kind_are_resolved():
    app, analysis = load_with_analysis(
        "define stream S (symbol string, price double, ts long);\n"
        "define table T (symbol string, price double);\n"
        "define window W (symbol string, price double) time(1 min);\n"
        "define trigger Tick at every 1 sec;\n"
        "define aggregation A from S select symbol, avg(price) as avgPrice group by symbol aggregate by ts every sec ... hour;\n"
        "from Tick join T select T.symbol, Tick.triggered_time insert into Ticks;\n"
        "from S as s join A as a on s.symbol == a.symbol within 0L, 1000L per 'seconds' select a.AGG_TIMESTAMP, a.avgPrice insert into Agg;"
    )
    assert set(analysis.tables) == {"T"} and set(analysis.windows) == {"W"} and set(analysis.triggers) == {"Tick"}
    assert signature(analysis.attributes("Tick")) == [("triggered_time", "long")]
    assert signature(analysis.attributes("A")) == [("AGG_TIMESTAMP", "long"), ("symbol", "string"), ("avgPrice", "double")]
    assert signature(analysis.attributes("Ticks")) == [("symbol", "string"), ("triggered_time", "long")]
    assert signature(analysis.attributes("Agg")) == [("AGG_TIMESTAMP", "long"), ("avgPrice", "double")]


def test_query_scopes_type_any_expression_of_the_query():
    app, analysis = load_with_analysis(
        "define stream A (id string, x int);\ndefine stream B (id string, y float);\n"
        "from every e1=A -> e2=B[id == e1.id] select e1.x + e2.y as s insert into Out;"
    )
    query = next(q for q, _ in app.queries())
    checker = ExpressionChecker(lambda message, node: None, {})
    expression = query.selector.attributes[0].expression
    assert checker.check(expression, analysis.scope(query)) == "float"
    assert checker.check(ast.Variable("id", "e2"), analysis.scope(query)) == "string"


def test_join_select_star_concatenates_both_sides():
    _, analysis = load_with_analysis(
        "define stream A (id string, x int);\ndefine stream B (key string, y float);\n"
        "from A#window.length(1) join B#window.length(1) on A.id == B.key select * insert into Out;"
    )
    assert signature(analysis.attributes("Out")) == [("id", "string"), ("x", "int"), ("key", "string"), ("y", "float")]


ON_DEMAND_APP = (
    "define stream S (symbol string, price float, ts long);\n"
    "define table T (symbol string, price float);\n"
    "define aggregation A from S select symbol, sum(price) as total group by symbol aggregate by ts every sec ... min;\n"
)


def test_on_demand_queries_are_checked_against_the_app():
    from sp_dagster.siddhi import check_on_demand_query, parse_on_demand_query

    _, analysis = load_with_analysis(ON_DEMAND_APP)

    def outcome(text):
        outputs, errors = check_on_demand_query(parse_on_demand_query(text), analysis)
        return (signature(outputs) if outputs else outputs), [(e.column, e.message) for e in errors]

    assert outcome("from T on price > 10 select symbol") == ([("symbol", "string")], [])
    assert outcome("from T select *") == ([("symbol", "string"), ("price", "float")], [])
    assert outcome("from A within 0L, 1000L per 'seconds' select symbol, total") == ([("symbol", "string"), ("total", "double")], [])
    assert outcome("select 'x' as symbol, 1f as price insert into T") == (None, [])
    assert outcome("delete T on T.symbol == 'x'") == (None, [])
    assert outcome("from S select symbol") == (None, [(6, "'S' is not a table, window or aggregation of this app.")])
    assert outcome("from T on nope > 1 select symbol") == ([("symbol", "string")], [(11, "No input of this query has an attribute 'nope'.")])
    assert outcome("from T within 0L, 1L per 'seconds' select symbol")[1] == [(6, "'within' and 'per' can only be used on an aggregation.")]
    assert outcome("select 'x' as symbol insert into T")[1] == [(34, "The query outputs (symbol string) but table 'T' has (symbol string, price float).")]
