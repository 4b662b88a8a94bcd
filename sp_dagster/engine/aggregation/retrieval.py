"""Reading an aggregation: `within ... per ...` evaluated, in on-demand queries and in joins.
`within` and `per` may read the joining event's attributes; constants are checked when the query
is built, and a joining event whose range or granularity is invalid matches nothing.
"""

from __future__ import annotations

import logging

from sp_dagster.engine.aggregation.timing import normalize_per, within_range
from sp_dagster.engine.errors import EngineError, app_error
from sp_dagster.engine.events import CURRENT, EXPIRED, StreamEvent
from sp_dagster.engine.expressions import JoinedScope, compile_expression
from sp_dagster.siddhi import ast

log = logging.getLogger("sp_dagster.engine.aggregation")

_GRANULARITIES = "SECONDS, MINUTES, HOURS, DAYS, MONTHS, YEARS"


class Retrieval:
    """The `within` range and `per` granularity of one retrieval, compiled against a scope."""

    def __init__(self, aggregation, within: tuple[ast.Expression, ...], per: ast.Expression | None, scope, node: ast.Node):
        self.aggregation = aggregation
        if per is None:
            raise app_error("Syntax Error: Aggregation join query must contain a `per` definition for granularity", node)
        if not within:
            raise app_error("Syntax Error: Aggregation read query must contain a `within` definition for filtering of aggregation data.", node)
        self.per = compile_expression(per, scope)
        if self.per.type != "string":
            raise app_error(f"The per value is expected to be a string, but found {self.per.type.upper()}", per)
        if self.per.constant and normalize_per(self.per.value) is None:
            raise app_error(f"Aggregation Query's per value is expected to be of a valid time function of the following {_GRANULARITIES}.", per)
        self.within = [compile_expression(w, scope) for w in within]
        for expression, compiled in zip(within, self.within):
            if compiled.type not in ("string", "long", "int"):
                raise app_error(f"A within value is expected to be a long or a string, but found {compiled.type}", expression)
        if all(w.constant for w in self.within):
            try:
                within_range([w.value for w in self.within])
            except EngineError as exc:
                raise app_error(str(exc), within[0]) from None

    def range(self, event: StreamEvent) -> tuple[int, int, str]:
        """(start, end, granularity) for `event` (EngineError when they are not valid)."""
        start, end = within_range([w.row(event) for w in self.within])
        value = self.per.row(event)
        per = normalize_per(value) if value is not None else None
        if per is None:
            raise EngineError(f"Aggregation Query's per value is expected to be of a valid time function of the following {_GRANULARITIES}.")
        return start, end, per

    def rows(self, event: StreamEvent) -> list[tuple]:
        """The aggregation's rows for `event`'s range and granularity."""
        start, end, per = self.range(event)
        return self.aggregation.find(start, end, per)


def on_demand_rows(context, store: ast.StoreInput, now: int):
    """(scope, rows) of `from A [on c] within ... per ...`: the aggregation's rows the `on` keeps.

    `from A [on cond] within '2017-06-** **:**:**' per 'days' select ...`
    """
    aggregation = context.aggregations[store.store]
    names = (store.store,) + ((store.alias,) if store.alias else ())
    scope = JoinedScope([(names, aggregation.schema, 0)], context)
    retrieval = Retrieval(aggregation, store.within, store.per, scope, store)
    rows = retrieval.rows(StreamEvent(now, (None,) * len(aggregation.schema)))
    if store.on is not None:
        condition = compile_expression(store.on, scope).row
        rows = [row for row in rows if condition(StreamEvent(now, row)) is True]
    return scope, rows


class AggregationJoinView:
    """An aggregation as one side of a join: its rows for each event of the other side.

    `from S join A on A.k == S.k within S.start, S.end per S.per select ...`
    """

    def __init__(self, aggregation, join: ast.JoinInput, scope: JoinedScope, left: bool, callbacks: list):
        self.retrieval = Retrieval(aggregation, join.within, join.per, scope, join)
        self.nulls = (None,) * len(aggregation.schema)
        self.aggregation_left = left  # the aggregation is the left side
        self.name = aggregation.name
        self.callbacks = callbacks  # the query's callbacks

    def held_for(self, event: StreamEvent) -> list[StreamEvent]:
        """The rows `event` may join (the join checks its condition on each)."""
        data = self.nulls + event.data if self.aggregation_left else event.data + self.nulls
        try:
            rows = self.retrieval.rows(StreamEvent(event.timestamp, data))
        except EngineError as exc:  # an invalid range or granularity: Siddhi drops the event
            log.error("aggregation %s: a joining event was dropped: %s", self.name, exc)
            return []
        return [StreamEvent(event.timestamp, row) for row in rows]

    def unmatched(self, chunk) -> None:
        """A triggering chunk joined no row: Siddhi still calls the query's callbacks, with no events."""
        if any(event.type in (CURRENT, EXPIRED) for event in chunk):
            for callback in self.callbacks:
                callback.receive([])
