"""The parser builds the tree the language means, for every construct; rendering keeps it."""

from __future__ import annotations

import pytest

from sp_dagster.siddhi import ast, parse, parse_expression, parse_on_demand_query
from sp_dagster.siddhi.ast import BinaryOp, Constant, Variable
from sp_dagster.siddhi.render import render, render_expression, render_on_demand_query

S = "define stream S (symbol string, price float, volume long);\n"


def only_query(text: str) -> ast.Query:
    return next(q for q, _ in parse(S + text).queries())


def one(value, type_):
    return Constant(value, type_)


# ----------------------------------------------------------------------------- expressions


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1 + 2 * 3", BinaryOp("+", one(1, "int"), BinaryOp("*", one(2, "int"), one(3, "int")))),
        ("(1 + 2) * 3", BinaryOp("*", BinaryOp("+", one(1, "int"), one(2, "int")), one(3, "int"))),
        ("10 - 4 - 3", BinaryOp("-", BinaryOp("-", one(10, "int"), one(4, "int")), one(3, "int"))),
        ("a - -3", BinaryOp("-", Variable("a"), one(-3, "int"))),
        ("a or b and c", BinaryOp("or", Variable("a"), BinaryOp("and", Variable("b"), Variable("c")))),
        ("a == 1 and b != 2", BinaryOp("and", BinaryOp("==", Variable("a"), one(1, "int")), BinaryOp("!=", Variable("b"), one(2, "int")))),
        ("a > 1 == true", BinaryOp("==", BinaryOp(">", Variable("a"), one(1, "int")), one(True, "bool"))),
        # as in Siddhi, `not` binds tighter than comparisons and `is null` tighter than `not`
        ("not a == b", BinaryOp("==", ast.Not(Variable("a")), Variable("b"))),
        ("not a is null", ast.Not(ast.IsNull(Variable("a")))),
        ("a == T.a in T", ast.In(BinaryOp("==", Variable("a"), Variable("a", "T")), "T")),
        ("a % 2 / 3", BinaryOp("/", BinaryOp("%", Variable("a"), one(2, "int")), one(3, "int"))),
    ],
)
def test_operator_precedence_and_associativity(text, expected):
    parsed = parse_expression(text)
    assert parsed == expected
    assert parse_expression(render_expression(parsed)) == parsed


@pytest.mark.parametrize(
    "text, value, type_",
    [
        ("5", 5, "int"),
        ("-2147483648", -(2**31), "int"),
        ("5L", 5, "long"),
        ("5l", 5, "long"),
        ("5f", 5.0, "float"),
        ("2.5F", 2.5, "float"),
        ("5.5", 5.5, "double"),
        ("5d", 5.0, "double"),
        ("1e3", 1000.0, "double"),
        ("2.5e-3f", 0.0025, "float"),
        (".5", 0.5, "double"),
        ("'single'", "single", "string"),
        ('"double"', "double", "string"),
        ('"it\'s"', "it's", "string"),
        ('"""a \\"quoted\\" \\n line"""', 'a "quoted" \n line', "string"),
        ("'back\\slash'", "back\\slash", "string"),
        ("true", True, "bool"),
        ("FALSE", False, "bool"),
    ],
)
def test_constants_of_every_type(text, value, type_):
    parsed = parse_expression(text)
    assert parsed == Constant(value, type_)
    assert parse_expression(render_expression(parsed)) == parsed


@pytest.mark.parametrize(
    "text, millis",
    [("5 sec", 5_000), ("1 hour 30 min", 5_400_000), ("2 days", 172_800_000), ("500 millisec", 500), ("1 min 1 millisecond", 60_001)],
)
def test_time_constants_are_long_milliseconds(text, millis):
    parsed = parse_expression(text)
    assert isinstance(parsed, ast.TimeConstant) and parsed.millis == millis and parsed.type == "long"
    assert parse_expression(render_expression(parsed)) == parsed


def test_attribute_references_with_streams_indexes_and_namespaced_functions():
    parsed = parse_expression("e1[0].price + e2[last].price + e2[last - 1].price + #Inner.x + str:length(S.symbol)")
    terms = []
    while isinstance(parsed, BinaryOp):
        terms.insert(0, parsed.right)
        parsed = parsed.left
    terms.insert(0, parsed)
    assert terms == [
        Variable("price", "e1", 0),
        Variable("price", "e2", ast.Last()),
        Variable("price", "e2", ast.Last(1)),
        Variable("x", "Inner", inner=True),
        ast.FunctionCall("length", (Variable("symbol", "S"),), "str"),
    ]


def test_event_null_checks():
    assert parse_expression("e2[last] is null") == ast.IsNull(ast.StreamRef("e2", ast.Last()))
    assert parse_expression("e2 is null") == ast.IsNull(Variable("e2"))


# ----------------------------------------------------------------------------- definitions


def test_definitions_of_every_kind():
    app = parse(
        "define stream S (a string, b int, c long, d float, e double, f bool, g object);\n"
        "@primaryKey('a') @index('b') define table T (a string, b int);\n"
        "define window W (a string) length(10) output all events;\n"
        "define trigger Every5 at every 5 sec;\n"
        "define trigger AtStart at 'start';\n"
        "define trigger Cron at '*/5 * * * * ?';\n"
        "define aggregation A from S select a, avg(e) as avgE group by a aggregate by c every sec ... year;\n"
        "define aggregation B from S select a, sum(b) as total group by a aggregate every min, hour, day;\n"
        "define function f[javascript] return string { return data[0] + 'x'; };\n"
    )
    stream, table, window, every5, at_start, cron, agg_a, agg_b, function = app.definitions
    assert [a.type for a in stream.attributes] == list(ast.TYPES)
    assert table.annotation("PRIMARYKEY").values == ("a",)
    assert window.window == ast.Window("length", (one(10, "int"),)) and window.output_event_type == "all"
    assert every5.every.millis == 5000 and at_start.at == "start" and cron.at == "*/5 * * * * ?"
    assert agg_a.duration_range and agg_a.durations == ("second", "year") and agg_a.aggregate_by == Variable("c")
    assert agg_a.all_durations == ast.DURATIONS
    assert not agg_b.duration_range and agg_b.durations == ("minute", "hour", "day") and agg_b.aggregate_by is None
    assert function.language == "javascript" and function.return_type == "string"
    assert function.body.strip() == "return data[0] + 'x';"
    assert parse(render(app)) == app


def test_keywords_and_types_are_case_insensitive_names_are_not():
    upper = parse("DEFINE STREAM S (A INT);\nFROM S[A > 1] SELECT A INSERT INTO T;")
    lower = parse("define stream S (A int);\nfrom S[A > 1] select A insert into T;")
    assert upper == lower
    assert parse("define stream s (a int);") != parse("define stream S (a int);")


def test_keywords_serve_as_names_where_no_keyword_fits():
    app = parse(
        "define stream Events (min double, count int, type string, `select` int);\n"
        "from Events select min, count, type, `select`, and(true) as every insert into `from`;"
    )
    query = next(q for q, _ in app.queries())
    assert [a.name for a in app.definition("Events").attributes] == ["min", "count", "type", "select"]
    assert [a.name for a in query.selector.attributes][:4] == ["min", "count", "type", "select"]
    assert query.selector.attributes[4].expression == ast.FunctionCall("and", (one(True, "bool"),))
    assert query.target == "from"
    assert parse(render(app)) == app


def test_a_keyword_never_matches_the_start_of_a_longer_word():
    query = only_query("from S select symbol as intox insert into information;")
    assert query.selector.attributes[0].rename == "intox" and query.target == "information"


# ----------------------------------------------------------------------------- queries


def test_filters_stream_functions_and_windows_keep_their_order():
    query = only_query("from S[price > 1]#log('x')#window.time(1 min)[volume < 5]#window.ns:custom(2) select * insert into T;")
    stream = query.input
    assert isinstance(stream, ast.StreamInput)
    kinds = [type(h).__name__ for h in stream.handlers]
    assert kinds == ["Filter", "StreamFunction", "Window", "Filter", "Window"]
    assert stream.handlers[4] == ast.Window("custom", (one(2, "int"),), "ns")
    assert stream.window == ast.Window("time", (parse_expression("1 min"),))
    assert query.selector.star


@pytest.mark.parametrize(
    "join, join_type, unidirectional",
    [
        ("join", "inner", None),
        ("inner join", "inner", None),
        ("left outer join", "left_outer", None),
        ("right outer join", "right_outer", None),
        ("full outer join", "full_outer", None),
        ("outer join", "full_outer", None),
        ("unidirectional join", "inner", "left"),
    ],
)
def test_joins(join, join_type, unidirectional):
    query = only_query(f"from S#window.length(5) as a {join} S#window.time(1 sec) as b on a.symbol == b.symbol select a.price insert into T;")
    assert isinstance(query.input, ast.JoinInput)
    assert (query.input.join_type, query.input.unidirectional) == (join_type, unidirectional)
    assert query.input.left.reference == "a" and query.input.right.stream.window.name == "time"
    assert query.input.on == parse_expression("a.symbol == b.symbol")


def test_right_unidirectional_and_aggregation_join_with_within_and_per():
    query = only_query('from S as s join A unidirectional within "2017-06-01 09:35:00", "2017-06-01 10:00:00" per s.symbol select s.price insert into T;')
    assert query.input.unidirectional == "right"
    assert query.input.within == (one("2017-06-01 09:35:00", "string"), one("2017-06-01 10:00:00", "string"))
    assert query.input.per == Variable("symbol", "s")


def test_patterns_with_every_counts_logic_absence_and_within():
    query = only_query(
        "from every (e1=S[price > 20] -> e2=S[price > e1.price]<2:5>) -> e3=S or e4=S -> not S[price > 5] for 10 sec "
        "within 1 hour select e1.symbol insert into T;"
    )
    state = query.input
    assert isinstance(state, ast.StateInput) and state.kind == "pattern" and state.within.millis == 3_600_000
    every, logical, absent = state.element.elements
    assert isinstance(every, ast.EveryState) and isinstance(every.element, ast.StateChain)
    assert every.element.elements[1].quantifier == ast.Quantifier(2, 5)
    assert logical == ast.LogicalState("or", ast.StreamState(ast.StreamInput("S"), "e3"), ast.StreamState(ast.StreamInput("S"), "e4"))
    assert absent.waiting.millis == 10_000 and absent.stream.filters[0].condition == parse_expression("price > 5")
    assert [s.stream.stream for s in state.states()] == ["S"] * 5


@pytest.mark.parametrize(
    "count, expected",
    [("<2:5>", ast.Quantifier(2, 5)), ("<2:>", ast.Quantifier(2, None)), ("<:5>", ast.Quantifier(None, 5)), ("<3>", ast.Quantifier(3, 3))],
)
def test_pattern_counts(count, expected):
    query = only_query(f"from e1=S{count} -> e2=S select e1[0].price insert into T;")
    assert query.input.element.elements[0].quantifier == expected


def test_sequences_with_quantifiers():
    query = only_query("from every e1=S, e2=S[price > e1.price]+, e3=S*, e4=S?, not S for 1 sec select e1.price insert into T;")
    state = query.input
    assert state.kind == "sequence"
    symbols = [getattr(e, "quantifier", None) and e.quantifier.symbol for e in state.element.elements]
    assert symbols == [None, "+", "*", "?", None]
    assert isinstance(state.element.elements[0], ast.EveryState)


def test_a_single_named_event_is_a_pattern_but_a_bare_stream_is_not():
    assert isinstance(only_query("from e1=S select e1.price insert into T;").input, ast.StateInput)
    assert isinstance(only_query("from S select price insert into T;").input, ast.StreamInput)


def test_selection_clauses():
    query = only_query(
        "from S#window.lengthBatch(4) select symbol, sum(price) as total group by symbol having total > 10 "
        "order by total desc, symbol limit 5 offset 2 insert into T;"
    )
    selector = query.selector
    assert [a.name for a in selector.attributes] == ["symbol", "total"]
    assert selector.group_by == (Variable("symbol"),)
    assert selector.having == parse_expression("total > 10")
    assert selector.order_by == (ast.OrderBy(Variable("total"), "desc"), ast.OrderBy(Variable("symbol"), "asc"))
    assert (selector.limit, selector.offset) == (one(5, "int"), one(2, "int"))


@pytest.mark.parametrize(
    "clause, expected",
    [
        ("output every 5 events", ast.OutputRate("events", 5, "all")),
        ("output all every 5 events", ast.OutputRate("events", 5, "all")),
        ("output first every 2 events", ast.OutputRate("events", 2, "first")),
        ("output last every 1 min", ast.OutputRate("time", parse_expression("1 min"), "last")),
        ("output snapshot every 10 sec", ast.OutputRate("snapshot", parse_expression("10 sec"), None)),
    ],
)
def test_output_rate_limiting(clause, expected):
    assert only_query(f"from S select symbol {clause} insert into T;").rate == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("insert into T", ast.InsertInto("T")),
        ("insert events into T", ast.InsertInto("T")),
        ("insert current events into T", ast.InsertInto("T")),
        ("insert expired events into T", ast.InsertInto("T", "expired")),
        ("insert all events into T", ast.InsertInto("T", "all")),
        ("delete T", ast.Delete("T")),
        ("delete T for expired events on T.symbol == symbol", ast.Delete("T", parse_expression("T.symbol == symbol"), "expired")),
        ("update T on T.symbol == symbol", ast.Update("T", parse_expression("T.symbol == symbol"))),
        (
            "update T set T.price = price, T.volume = 0L on T.symbol == symbol",
            ast.Update(
                "T",
                parse_expression("T.symbol == symbol"),
                (ast.SetAssignment(Variable("price", "T"), Variable("price")), ast.SetAssignment(Variable("volume", "T"), one(0, "long"))),
            ),
        ),
        (
            "update or insert into T set T.price = price on T.symbol == symbol",
            ast.UpdateOrInsert("T", parse_expression("T.symbol == symbol"), (ast.SetAssignment(Variable("price", "T"), Variable("price")),)),
        ),
        ("return", ast.Return()),
        ("return all events", ast.Return("all")),
    ],
)
def test_query_outputs(text, expected):
    assert only_query(f"from S select symbol, price {text};").output == expected


def test_partitions_with_value_and_range_keys_and_inner_streams():
    app = parse(
        S + "define stream U (symbol string, price float, volume long);\n"
        "@info(name = 'p') partition with (symbol of S, price >= 100 as 'large' or price < 100 as 'small' of U)\n"
        "begin\n  @info(name = 'inner') from S select symbol, price insert into #Mid;\n"
        "  from #Mid#window.length(2) select symbol insert into Out\nend;"
    )
    partition = app.partitions[0]
    assert partition.annotation("info").get("name") == "p"
    assert partition.keys[0] == ast.ValuePartition("S", Variable("symbol"))
    assert partition.key_for("U").ranges == (
        ast.RangeCondition(parse_expression("price >= 100"), "large"),
        ast.RangeCondition(parse_expression("price < 100"), "small"),
    )
    first, second = partition.queries
    assert first.name == "inner" and first.output == ast.InsertInto("Mid", inner=True)
    assert second.input.stream == "Mid" and second.input.inner
    assert [p for _, p in app.queries()] == [partition, partition]
    assert parse(render(app)) == app


def test_fault_streams():
    assert only_query("from !S select symbol insert into T;").input == ast.StreamInput("S", fault=True)


# ----------------------------------------------------------------------------- annotations and the app


def test_app_annotations_and_element_annotations_are_queryable_case_insensitively():
    app = parse(
        "@App:name('Orders') @app:description('d') @APP:playback\n"
        "@Source(type = 'kafka', topic.list = 'in', @map(type = 'json', @attributes(a = '$.a')), @dist(parallel = '2'))\n"
        "@sink(type = 'http', @distribution(strategy = 'partitioned', partitionKey = 'a', @destination(url = 'u1'), @destination(url = 'u2')))\n"
        "define stream S (a int);\n"
        "@info(name = 'q1') @dist(parallel = '3', execGroup = 'g1') @unknown('kept', x = 'y')\n"
        "from S select a insert into T;"
    )
    assert app.name == "Orders" and app.playback
    assert app.annotation("app:DESCRIPTION").values == ("d",)
    stream = app.definition("S")
    source = stream.annotation("source")
    assert source.get("TOPIC.LIST") == "in" and source.annotation("MAP").annotation("attributes").get("a") == "$.a"
    assert source.annotation("dist").get("parallel") == "2"
    destinations = stream.annotation("SINK").annotation("distribution").annotations_named("destination")
    assert [d.get("url") for d in destinations] == ["u1", "u2"]
    query = next(q for q, _ in app.queries())
    assert query.name == "q1"
    assert query.annotation("DIST").get("execgroup") == "g1" and query.annotation("dist").get("parallel") == "3"
    assert query.annotation("unknown").values == ("kept",) and query.annotation("unknown").get("x") == "y"
    assert parse(render(app)) == app


def test_element_order_is_kept():
    app = parse("define stream B (a int);\nfrom B select a insert into C;\ndefine table A (a int);\nfrom C select a insert into A;")
    assert [type(e).__name__ for e in app.elements] == ["StreamDefinition", "Query", "TableDefinition", "Query"]


def test_comments_are_ignored():
    text = "-- a line comment\n/* a block\ncomment */ define stream S (a int); // another\nfrom S select a insert into T; -- done"
    assert parse(text) == parse("define stream S (a int);\nfrom S select a insert into T;")


def test_positions_are_kept_but_not_compared():
    app = parse("\n\n   define stream S (a int);\nfrom S select  a insert into T;")
    stream = app.definitions[0]
    query = next(q for q, _ in app.queries())
    assert (stream.line, stream.column) == (3, 18)
    assert (query.line, query.column) == (4, 1)
    variable = query.selector.attributes[0].expression
    assert (variable.line, variable.column) == (4, 16)
    assert (query.output.line, query.output.column) == (4, 30)
    compact = parse("define stream S (a int); from S select a insert into T;")
    assert compact == app and hash(compact) == hash(app)


def test_nodes_are_immutable_and_hashable():
    app = parse(S + "from S select symbol insert into T;")
    with pytest.raises(AttributeError):
        app.elements = ()  # type: ignore[misc]
    assert isinstance(app.elements, tuple)
    assert len({app, parse(S + "from S select symbol insert into T;")}) == 1


def test_walk_visits_every_node_in_source_order():
    app = parse(S + "@info(name = 'q') from S[price > 1] select symbol, sum(volume) as v insert into T;")
    query = next(q for q, _ in app.queries())
    kinds = [type(node).__name__ for node in ast.walk(query)]
    assert kinds == [
        "Query",
        "Annotation",
        "AnnotationElement",
        "StreamInput",
        "Filter",
        "BinaryOp",
        "Variable",
        "Constant",
        "Selector",
        "OutputAttribute",
        "Variable",
        "OutputAttribute",
        "FunctionCall",
        "Variable",
        "InsertInto",
    ]
    variables = [n.name for n in ast.walk(app) if isinstance(n, Variable)]
    assert variables == ["price", "symbol", "volume"]


def test_empty_app():
    assert parse("") == ast.App() and render(ast.App()) == ""


# ----------------------------------------------------------------------------- on-demand queries


@pytest.mark.parametrize(
    "text",
    [
        "from T on price > 40 select symbol, price",
        "from T select *",
        "from T as t on t.symbol == 'IBM' select t.symbol, sum(t.price) as total group by t.symbol having total > 2 order by total desc limit 3",
        'from A within "2017-06-01 04:05:50", "2017-06-01 04:06:57" per "seconds" select symbol, total',
        "from A on symbol == 'x' within 1496289950000L per 'hours' select symbol",
        "select 'WSO2' as symbol, 100f as price insert into T",
        "delete T on T.symbol == 'IBM'",
        "select 100f as p delete T on T.price > p",
        "update T set T.price = 10f on T.symbol == 'IBM'",
        "select 'IBM' as s update or insert into T set T.price = 10f on T.symbol == s;",
    ],
)
def test_on_demand_queries(text):
    parsed = parse_on_demand_query(text)
    assert parse_on_demand_query(render_on_demand_query(parsed)) == parsed


def test_on_demand_query_structure():
    parsed = parse_on_demand_query("from T on price > 40 select symbol")
    assert parsed.input == ast.StoreInput("T", on=parse_expression("price > 40"))
    assert parsed.selector.attributes[0].name == "symbol" and parsed.output is None
    deleted = parse_on_demand_query("delete T on T.symbol == 'IBM'")
    assert deleted.input is None and deleted.output == ast.Delete("T", parse_expression("T.symbol == 'IBM'"))
