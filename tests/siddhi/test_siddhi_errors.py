"""Wrong apps: each error says where (line, column) and what, in one sentence, all at once.

The table holds apps with one mistake each (a few with two), the position every error must
point at and its exact message. Syntax errors come from the parser, the rest from
validation; `load` reports both the same way.
"""

from __future__ import annotations

import re

import pytest

from sp_dagster.siddhi import SiddhiQLError, parse
from sp_dagster.siddhi.validate import load, validate

S = "define stream S (symbol string, price float, volume long);\n"

WRONG_APPS = [
    (S + "from e1=S, every e2=S select e1.symbol insert into T;", (2, 12, "In a sequence, 'every' can only stand before the first element.")),
    (S + "from e1=S -> not S select e1.symbol insert into T;", (2, 14, "An absent event needs 'for <time>' unless it is paired with an event by 'and'.")),
    (S + "from e1=S+ -> e2=S select e1[0].symbol insert into T;", (2, 10, "'+' counts events in sequences; patterns count with <min:max>.")),
    (S + "define table Tab (symbol string);\nfrom Tab#window.length(2) join S select S.symbol insert into T;", (3, 17, "Table 'Tab' cannot take a window.")),
    (
        S + "define aggregation A from S#window.time(1 sec) select symbol, sum(price) as p group by symbol aggregate every sec...min;",
        (2, 36, "An aggregation cannot use a window."),
    ),
    (S + "select symbol from S insert into T;", (2, 1, "Unexpected 'select'; expected 'define', 'from', 'partition', an annotation or the end of the text.")),
    (S + "from S select symbol insert T;", (2, 29, "Unexpected 'T'; expected 'all', 'current', 'events', 'expired' or 'into'.")),
    ("define stream S (a int) define stream T (b int);", (1, 25, "Missing ';' before 'define'.")),
    ("define stream S (a int, b foo);", (1, 27, "Unknown attribute type 'foo'; use string, int, long, float, double, bool or object.")),
    (S + "form S select symbol insert into T;", (2, 1, "Unexpected 'form'; did you mean 'from'?")),
    (S + "from S[price > ] select symbol insert into T;", (2, 16, "Unexpected ']'; expected an expression.")),
    (S + "from S select 'abc insert into T;", (2, 15, "This string is not closed before the end of the line.")),
    (S + "from S select symbol insert intoo T;", (2, 29, "Unexpected 'intoo'; did you mean 'into'?")),
    (S + "partition with (symbol of S) begin from S select symbol insert into T;", (2, 70, "This partition is not closed with 'end'.")),
    (S + "from S select 3000000000 as x insert into T;", (2, 15, "The int literal 3000000000 is out of range; write 3000000000L for a long.")),
    (S + "from S#window.time(1.5 sec) select symbol insert into T;", (2, 20, "A time amount must be a whole number, not '1.5'.")),
    (S + "from S#window.time(5 sec 1 min) select symbol insert into T;", (2, 28, "The units of a time value must go from the largest to the smallest.")),
    (S + "from e1=S -> e2=S, e3=S select e1.symbol insert into T;", (2, 6, "A query cannot mix pattern '->' and sequence ',' operators.")),
    (S + "from S select symbol $ insert into T;", (2, 22, "Unexpected character '$'.")),
    ("@info(name='x')", (1, 1, "Annotation @info must be followed by a definition, query or partition.")),
    (S + "@App:name('late') from S select symbol insert into T;", (2, 1, "App annotation @App:name must come before the app's definitions and queries.")),
    (S + "from S select symbol group symbol insert into T;", (2, 28, "Unexpected 'symbol'; expected 'by'.")),
    (S + "from Foo select symbol insert into T;", (2, 6, "Stream 'Foo' is not defined.")),
    (S + "from s select symbol insert into T;", (2, 6, "Stream 's' is not defined; did you mean 'S'?")),
    (S + "from S select sym insert into T;", (2, 15, "No input of this query has an attribute 'sym'.")),
    (S + "from S select symbol, price + 'x' as p insert into T;", (2, 29, "Operator '+' needs numbers, not float and string.")),
    (S + "from S[price] select symbol insert into T;", (2, 8, "A filter condition must be bool, not float.")),
    (S + "from S[symbol > 5] select symbol insert into T;", (2, 15, "Operator '>' cannot compare string with int.")),
    (S + "from S[sum(price) > 5] select symbol insert into T;", (2, 8, "Aggregate function 'sum' can only be used in select and having.")),
    (S + "from S select sum(avg(price)) as p insert into T;", (2, 19, "Aggregate function 'avg' cannot be used inside another aggregate.")),
    (S + "from S select price * 2 insert into T;", (2, 15, "This expression needs a name; add 'as <name>'.")),
    (S + "from S select symbol, symbol insert into T;", (2, 23, "Attribute 'symbol' is selected twice.")),
    (S + "from S select foo(price) as p insert into T;", (2, 15, "Function 'foo' is not defined.")),
    (S + "from S select Sum(price) as p insert into T;", (2, 15, "Function 'Sum' is not defined; did you mean 'sum'?")),
    (S + "from S select convert(price, 'decimal') as p insert into T;", (2, 30, "The second argument of 'convert' must name a type such as 'double'.")),
    (S + "from S#window.lenght(5) select symbol insert into T;", (2, 15, "Window 'lenght' is not defined.")),
    (S + "from S#window.length('5') select symbol insert into T;", (2, 22, "Argument 1 of 'length' must be int, not string.")),
    (S + "from S#window.length(5, 6, 7) select symbol insert into T;", (2, 15, "'length' takes 1 argument, not 3.")),
    (S + "define stream S (x int);", (2, 15, "'S' is already defined on line 1.")),
    ("define stream S (a int, a long);", (1, 25, "Attribute 'a' is defined twice.")),
    (
        S + "define table T (symbol string);\nfrom S select symbol, price insert into T;",
        (3, 41, "The query outputs (symbol string, price float) but table 'T' has (symbol string)."),
    ),
    (
        S + "define stream T (symbol string, price double);\nfrom S select symbol, price insert into T;",
        (3, 41, "The query outputs (symbol string, price float) but stream 'T' has (symbol string, price double)."),
    ),
    (S + "from S select symbol delete S on S.symbol == symbol;", (2, 29, "'S' is not a table; 'delete' needs a table.")),
    (S + "from S select symbol having price > 'a' insert into T;", (2, 35, "Operator '>' cannot compare float with string.")),
    (S + "from S[not price] select symbol insert into T;", (2, 12, "The operand of 'not' must be bool, not float.")),
    (S + "from S select symbol insert into #T;", (2, 35, "Inner stream '#T' can only be used inside a partition.")),
    (S + "from #T select symbol insert into U;", (2, 6, "Inner stream '#T' is not defined in this partition.")),
    (
        S + "partition with (symbol of S) begin @dist(parallel='2') from S select symbol insert into T; end;",
        (2, 36, "@dist cannot be used on a query inside a partition; put it on the partition."),
    ),
    (S + "@dist(parallel='zero') from S select symbol insert into T;", (2, 7, "@dist(parallel) must be a whole number of at least 1, not 'zero'.")),
    (S + "@dist(maxParallel='lots') from S select symbol insert into T;", (2, 7, "@dist(maxParallel) must be a whole number of at least 1, not 'lots'.")),
    (
        S + "@dist(parallel='4', maxParallel='2') from S select symbol insert into T;",
        (2, 21, "@dist(maxParallel='2') is below parallel='4': the maximum is what the group may grow to; set it to at least the parallelism."),
    ),
    (S + "@dist(parallel='2', group='g') from S select symbol insert into T;", (2, 21, "@dist takes parallel, maxParallel and execGroup, not 'group'.")),
    (
        S + "@info(name='q') from S select symbol insert into T;\n@info(name='q') from S select symbol insert into U;",
        (3, 7, "Query name 'q' is already used on line 2."),
    ),
    ("@source(topic='x') define stream S (a int);", (1, 1, "@source needs a type, as in @source(type = 'kafka', ...).")),
    (
        "@sink(type='http', @distribution(strategy='partitioned', partitionKey='b', @destination(publisher.url='http://h'))) define stream S (a int);",
        (1, 58, "partitionKey 'b' is not an attribute of 'S'."),
    ),
    (
        "@sink(type='http', @distribution(strategy='random', @destination(publisher.url='http://h'))) define stream S (a int);",
        (1, 34, "@distribution(strategy) must be roundRobin, partitioned or broadcast, not 'random'."),
    ),
    ("@primaryKey('b') define table T (a int);", (1, 13, "@primaryKey names 'b', which is not an attribute of 'T'.")),
    # a partitioned @distribution or a @primaryKey off a definition is misplaced, never checked against attributes
    (
        S + "@sink(type='log', @distribution(strategy='partitioned', partitionKey='b')) from S select symbol insert into T;",
        (2, 1, "@sink cannot be used on a query."),
    ),
    (
        S
        + "@sink(type='log', @distribution(strategy='partitioned', partitionKey='b')) partition with (symbol of S) begin from S select symbol insert into T; end;",
        (2, 1, "@sink cannot be used on a partition."),
    ),
    (S + "@primaryKey('b') from S select symbol insert into T;", (2, 1, "@primaryKey cannot be used on a query.")),
    ("@store(type='rdbms') define stream S (a int);", (1, 1, "@store cannot be used on a stream.")),
    ("@app:playback(idle.time='soon') define stream S (a int);", (1, 15, "idle.time must be a time such as '2 sec', not 'soon'.")),
    (S + "from S join S as s2 select symbol insert into T;", (2, 28, "Attribute 'symbol' is ambiguous here; write S.symbol or s2.symbol.")),
    (
        S + "from S#window.length(5) as a join S#window.length(5) as b on a.price > b.symbol select a.symbol insert into T;",
        (2, 70, "Operator '>' cannot compare float with string."),
    ),
    (S + "from e1=S -> e2=S[price > e3.price] select e1.symbol insert into T;", (2, 27, "'e3' is not a stream, alias or event read by this query.")),
    (S + "from e1=S#window.length(2) -> e2=S select e1.symbol insert into T;", (2, 18, "Patterns and sequences cannot use windows.")),
    (S + "from every e1=S<5:2> -> e2=S select e1.symbol insert into T;", (2, 16, "The count <5:2> has its minimum above its maximum.")),
    (S + "from S select symbol output every 0 events insert into T;", (2, 22, "An output rate must be greater than zero.")),
    (S + "from S select symbol limit 'x' insert into T;", (2, 28, "'limit' needs an int or long, not string.")),
    (S + "define function f[javascript] return int { return 1; };", (2, 17, "Script functions are not supported; 'f' cannot be defined.")),
    (S + "define trigger Tr at 'sometimes';", (2, 16, "Trigger 'Tr' needs 'start' or a cron expression of six or seven fields.")),
    (S + "from S select symbol insert into Tr2;\ndefine trigger Tr2 at every 1 sec;", (2, 34, "Queries cannot insert into trigger 'Tr2'.")),
    (S + "define table T (symbol string);\nfrom T select symbol insert into U;", (3, 6, "Table 'T' cannot be read by a query on its own; join it instead.")),
    (
        S + "define table T (symbol string, price float);\nfrom S update T set price = 1.0f on T.symbol == symbol;",
        (3, 21, "'set' must assign an attribute of 'T', such as T.symbol."),
    ),
    (S + "from S select ifThenElse(price > 5, 'a', 1) as x insert into T;", (2, 42, "Argument 3 of 'ifThenElse' must be string like the one before, not int.")),
    (S + "define table T (symbol string);\nfrom S[symbol == T.symbol in U] select symbol insert into T;", (3, 27, "'U' is not a table; 'in' needs a table.")),
    (
        S + "partition with (symbol of Nope) begin from S select symbol insert into T; end;",
        (2, 17, "Only streams can be partitioned, and 'Nope' is not defined."),
    ),
    (
        S + "define aggregation A from S select symbol, sum(price) as total group by symbol aggregate by symbol every hour, sec;",
        (2, 20, "Aggregation durations must go from the smallest to the largest, once each."),
    ),
    (
        S + "from S#window.length(5) join S#window.length(5) on price > 1 select symbol insert into T;",
        [
            (2, 52, "Attribute 'price' is ambiguous here; give the inputs names with 'as' and qualify it."),
            (2, 69, "Attribute 'symbol' is ambiguous here; give the inputs names with 'as' and qualify it."),
        ],
    ),
]


@pytest.mark.parametrize("text, expected", WRONG_APPS, ids=[f"wrong-{i:02d}" for i in range(len(WRONG_APPS))])
def test_each_error_has_its_position_and_sentence(text, expected):
    expected = expected if isinstance(expected, list) else [expected]
    with pytest.raises(SiddhiQLError) as caught:
        load(text, "app.siddhi")
    found = [(e.line, e.column, e.message) for e in caught.value.errors]
    assert found == expected
    for error in caught.value.errors:
        assert error.source == "app.siddhi"
        assert _one_sentence(error.message), error.message
        assert _caret_column(error) == error.column


def test_the_table_is_large_enough():
    assert len(WRONG_APPS) >= 40


def _one_sentence(message: str) -> bool:
    body = re.sub(r"'[^']*'|\([^)]*\)", "", message)  # quoted names and lists may hold dots
    return "\n" not in message and body.rstrip()[-1] in ".?" and ". " not in body


def _caret_column(error: SiddhiQLError) -> int:
    """The column the caret of the excerpt points at (1-based, in the source line)."""
    source_line, caret_line = error.excerpt.splitlines()
    gutter = source_line.index("| ") + 2
    return caret_line.index("^") - gutter + 1


def test_the_message_quotes_the_line_and_marks_the_column():
    text = "define stream S (a int);\n\tfrom S select b insert into T;"
    with pytest.raises(SiddhiQLError) as caught:
        load(text, "orders.siddhi")
    assert str(caught.value) == (
        "orders.siddhi:2:16: No input of this query has an attribute 'b'.\n   2 |     from S select b insert into T;\n     |                   ^"
    )
    assert (caught.value.line, caught.value.column) == (2, 16)  # the tab counts as one column


def test_every_semantic_error_of_an_app_is_reported_together():
    text = S + "from Nope select symbol insert into A;\nfrom S select bogus insert into B;\nfrom S[price] select symbol insert into C;"
    errors = validate(parse(text))
    assert [(e.line, e.column) for e in errors] == [(2, 6), (3, 15), (4, 8)]
    with pytest.raises(SiddhiQLError) as caught:
        load(text)
    assert len(caught.value.errors) == 3
    assert str(caught.value).count("^") == 3


def test_syntax_errors_of_later_statements_are_reported_too():
    text = (
        S
        + "from S select symbol insert into A;\nfrom S[price >] select symbol insert into B;\nfrom S select insert into C;\nfrom S select symbol insert into D;"
    )
    with pytest.raises(SiddhiQLError) as caught:
        parse(text)
    # `select insert` reads `insert` as an attribute name (no keyword fits there), so `into` is wrong
    assert [(e.line, e.column) for e in caught.value.errors] == [(3, 15), (4, 22)]


def test_an_error_in_one_query_does_not_cascade_into_its_readers():
    text = S + "from S select nope insert into Mid;\nfrom Mid select nope insert into Out;"
    assert [(e.line, e.column, e.message) for e in validate(parse(text))] == [(2, 15, "No input of this query has an attribute 'nope'.")]


def test_errors_are_user_errors_of_the_cli():
    from sp_dagster.errors import SpDagsterError

    assert issubclass(SiddhiQLError, SpDagsterError)


def test_statements_split_at_top_level_semicolons_only():
    from sp_dagster.siddhi.recovery import statements

    text = (
        "define stream S (begin long, `end` long, s string);\n"
        "from S[s == 'a;b'] select begin insert into T; -- a comment; with a semicolon\n"
        "partition with (s of S) begin from S select s insert into X; from S select s insert into Y; end;\n"
        "@info(name = 'q;1') from S select s insert into Z"
    )
    chunks = [(offset, chunk) for offset, chunk in statements(text)]
    starts = ("define stream", "from S[", "-- a comment", "@info(name = 'q;1')")
    assert len(chunks) == 4 and all(chunk.strip().startswith(start) for (_, chunk), start in zip(chunks, starts))
    assert "end" in chunks[2][1] and chunks[2][1].count(";") == 3
    for offset, chunk in chunks:
        body = chunk.lstrip("\n ")
        start = len(chunk) - len(body)  # where the statement's text begins in the chunk
        original = offset + (len(text[offset:]) - len(text[offset:].lstrip("\n ")))
        assert text[original : original + len(body)] == body
        # the padding puts the statement on its original line and column
        assert chunk.count("\n", 0, start) == text.count("\n", 0, original)
        assert start - (chunk.rfind("\n", 0, start) + 1) == original - (text.rfind("\n", 0, original) + 1)
