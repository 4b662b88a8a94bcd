"""Incremental aggregations (`define aggregation ... aggregate [by ts] every sec ... year`).
timing.py places buckets in time, plan.py says what a definition keeps, executor.py rolls buckets
up per granularity, store.py holds the tables (in memory or in a database), incremental.py runs
one aggregation and retrieval.py reads it (`within ... per ...`).
"""

from sp_dagster.engine.aggregation.incremental import IncrementalAggregation

__all__ = ["IncrementalAggregation"]
