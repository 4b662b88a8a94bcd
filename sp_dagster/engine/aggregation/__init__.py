"""Incremental aggregations (`define aggregation ... aggregate [by ts] every sec ... year`).

timing.py: granularities, bucket starts, `within`/`per` values; plan.py: what a definition
keeps (base aggregates, latest values, outputs); executor.py: one running bucket per
granularity, rolling up; store.py: the tables per granularity, in memory or in a database;
incremental.py: one aggregation (events in, retrieval out); retrieval.py: `within ... per ...`
in on-demand queries and joins.
"""

from sp_dagster.engine.aggregation.incremental import IncrementalAggregation

__all__ = ["IncrementalAggregation"]
