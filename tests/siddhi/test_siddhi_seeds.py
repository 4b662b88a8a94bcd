"""The SiddhiQL examples of the seed documents parse, once their transcription damage is fixed.

Each example is cut from the seed document itself (between two marker lines), so the test
follows the documents; the repairs are the only text written here, each one undoing an
obvious transcription slip, and each must change the text it is meant for.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from siddhi_corpus import SEEDS, needs_shared

from sp_dagster.siddhi import SiddhiQLError, ast, parse
from sp_dagster.siddhi.render import render
from sp_dagster.siddhi.validate import validate

pytestmark = needs_shared


@dataclass(frozen=True)
class SeedExample:
    document: str
    first_line: str  # the example starts with the line starting with this
    last_line: str  # ... and ends with the line starting with this
    repairs: tuple[tuple[str, str], ...]  # (damaged text, repaired text)


EXAMPLES = {
    "active-active aggregation": SeedExample(
        "002_7f4598dcacce5530.txt",
        "define stream TradeStream",
        "aggregate by timestamp",
        # a stray ';' inside the attribute list
        (("quantity long, ;timestamp long", "quantity long, timestamp long"),),
    ),
    "distributed sink": SeedExample(
        "004_acfe67e98f3fc0f1.txt",
        "// Stream defined with distributed sink",
        "     backendTime long);",
        (
            # the annotation lost its closing parentheses: close @distribution and @Sink
            ("partitionKey='userTenantDomain',\n", "partitionKey='userTenantDomain'))\n"),
            # doubled commas between attributes
            ("apiCreator string,,", "apiCreator string,"),
            ("userTenantDomain string,,", "userTenantDomain string,"),
        ),
    ),
}


def _excerpt(example: SeedExample) -> str:
    lines = (SEEDS / example.document).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(example.first_line))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(example.last_line))
    return "\n".join(lines[start : end + 1]) + "\n"


def _repaired(example: SeedExample) -> str:
    text = _excerpt(example)
    for damaged, repaired in example.repairs:
        assert damaged in text, f"repair target {damaged!r} not found: the seed changed"
        text = text.replace(damaged, repaired)
    return text


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_damaged_example_is_rejected(name):
    with pytest.raises(SiddhiQLError):
        parse(_excerpt(EXAMPLES[name]))


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_repaired_example_parses_validates_and_round_trips(name):
    app = parse(_repaired(EXAMPLES[name]))
    assert validate(app) == []
    assert parse(render(app)) == app


def test_the_aggregation_example_means_what_the_document_says():
    app = parse(_repaired(EXAMPLES["active-active aggregation"]))
    aggregation = app.definition("TradeAggregation")
    assert isinstance(aggregation, ast.AggregationDefinition)
    assert aggregation.aggregate_by == ast.Variable("timestamp")
    assert aggregation.all_durations == ("second", "minute", "hour", "day", "week", "month", "year")
    store = aggregation.annotation("STORE")
    assert store.get("type") == "rdbms" and store.get("JDBC.URL") == "jdbc:mysql://localhost:3306/TestDB"
    assert store.values == ("com.mysql.jdbc.Driver",)


def test_the_distributed_sink_example_means_what_the_document_says():
    app = parse(_repaired(EXAMPLES["distributed sink"]))
    request = app.definition("Request")
    distribution = request.annotation("sink").annotation("distribution")
    assert distribution.get("strategy") == "partitioned"
    assert distribution.get("partitionKey") == "userTenantDomain"
    assert len(request.attributes) == 17 and request.attribute("throttledOut").type == "bool"
