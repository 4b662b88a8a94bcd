"""On-demand queries (Siddhi's `siddhiAppRuntime.query(...)`): run once against an app's tables.
A `from` query runs the rows its `on` selects through the selector as one batch; the other forms
evaluate their selection once (constants only) and change the table as a query's output would.
"""

from __future__ import annotations

from dataclasses import dataclass

from sp_dagster.engine.errors import app_error
from sp_dagster.engine.events import Event, StreamEvent
from sp_dagster.engine.expressions import JoinedScope
from sp_dagster.engine.processors import Processor
from sp_dagster.engine.schema import Schema
from sp_dagster.engine.selector import Selector
from sp_dagster.engine.tables import TableOutput
from sp_dagster.siddhi import SiddhiQLError, ast, check_on_demand_query, parse_on_demand_query


class _Collect(Processor):
    def __init__(self, deliver=None):
        self.events: list[StreamEvent] = []
        self.deliver = deliver

    def process(self, chunk):
        if self.deliver is not None:
            self.deliver(chunk)
        else:
            self.events.extend(chunk)


@dataclass(frozen=True)
class OnDemandResult:
    """What an on-demand query returned: its attributes (none for delete/update/insert) and events."""

    schema: Schema
    events: list[Event]


def run_on_demand(runtime, text: str, source: str | None = None) -> OnDemandResult:
    """Parse, check and run one on-demand query against `runtime` (whose lock the caller holds).

        runtime.query("from StockTable on price > 10 select symbol, sum(volume) as total group by symbol")
        runtime.query("select 'IBM' as symbol, 75.5f as price insert into StockTable")
        runtime.query("delete StockTable on StockTable.symbol == 'IBM'")
        runtime.query("update StockTable set StockTable.price = 80f on StockTable.symbol == 'IBM'")
        runtime.query("select 'IBM' as symbol, 81f as price update or insert into StockTable "
                      "set StockTable.price = price on StockTable.symbol == symbol")

    Errors (unknown table, bad query) are SiddhiQLErrors with line and column in the query text.
    """
    try:
        query = parse_on_demand_query(text, source)
        _, errors = check_on_demand_query(query, runtime.context.analysis)
        if errors:
            raise SiddhiQLError.combine(errors)
        return _run(runtime.context, query)
    except SiddhiQLError as error:
        raise error.attach(text, source) from None


def _run_aggregation(context, store: ast.StoreInput, selection: ast.Selector, now: int) -> OnDemandResult:
    """`from A [on c] within ... per ... [select ...]`: the aggregation's rows through the selector."""
    from sp_dagster.engine.aggregation.retrieval import on_demand_rows

    scope, rows = on_demand_rows(context, store, now)
    schema = context.aggregations[store.store].schema
    selector = Selector(selection, schema, scope, current_on=True, expired_on=False, track_future=False)
    collect = _Collect()
    selector.next = collect
    if rows:
        selector.process([StreamEvent(now, row) for row in rows])
    return OnDemandResult(selector.output_schema, [Event(e.timestamp, e.output) for e in collect.events])


def _run(context, query: ast.OnDemandQuery) -> OnDemandResult:
    now = context.clock.now()
    selection = query.selector or ast.Selector()
    if query.input is not None:
        store = query.input
        if store.store in context.aggregations:
            return _run_aggregation(context, store, selection, now)
        table = context.tables.get(store.store)
        if table is None:
            raise app_error(f"'{store.store}' is not a table; the engine runs on-demand queries on tables only", store)
        names = (store.store,) + ((store.alias,) if store.alias else ())
        scope = JoinedScope([(names, table.schema, 0)], context)
        condition = table.compile_condition(store.on, scope, 0)
        selector = Selector(selection, table.schema, scope, current_on=True, expired_on=False, track_future=False)
        collect = _Collect()
        selector.next = collect
        rows = table.find(condition, (), now)
        if rows:
            selector.process([StreamEvent(now, row) for row in rows])
        return OnDemandResult(selector.output_schema, [Event(e.timestamp, e.output) for e in collect.events])
    output = query.output
    assert output is not None and not isinstance(output, ast.Return)  # a query without input modifies a table
    empty = Schema((), ())
    scope = JoinedScope([((), empty, 0)], context)
    selector = Selector(selection, empty, scope, current_on=True, expired_on=False, track_future=False)
    table = context.tables[output.target]  # the checks made sure it is a table
    target = TableOutput(output, table, selector.output_schema, (), context, [])
    selector.next = _Collect(target.send)
    selector.process([StreamEvent(now, ())])
    return OnDemandResult(Schema((), ()), [])
