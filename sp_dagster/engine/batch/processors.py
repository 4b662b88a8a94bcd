"""Filters and projections over a whole segment: the query's vectorised (Arrow) path, once."""

from __future__ import annotations

import pyarrow as pa

from sp_dagster.engine.batch.base import Kernel, Output, segment
from sp_dagster.engine.batch.eligibility import plain_query
from sp_dagster.engine.expressions import materialize
from sp_dagster.engine.processors import FilterProcessor


class StatelessKernel(Kernel):
    """`from S[cond]... select <expressions>`: no window, no aggregate, every step vectorised."""

    @classmethod
    def build(cls, receiver, runtime):
        query = plain_query(receiver)
        if query is None or not query.arrow or not query.selector.accepts_arrow:
            return None
        if not all(isinstance(p, FilterProcessor) and p.vector is not None for p in query.processors):
            return None
        return cls(query)

    def run(self, run, start, end):
        chunk, times, owner = segment(run, start, end, self.query.processors)
        selector = self.query.selector
        rows = chunk.batch.num_rows
        columns = [materialize(v(chunk), rows, e.type) for v, e in zip(selector.vectors, selector.executors)]
        out = pa.RecordBatch.from_arrays(columns, schema=selector.output_schema.arrow_schema())
        return Output(self.query, out, times, owner)
