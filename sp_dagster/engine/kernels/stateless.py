"""Filters and projections over a whole segment: the query's vectorised (Arrow) path, once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from sp_dagster.engine.events import ArrowChunk
from sp_dagster.engine.expressions import materialize
from sp_dagster.engine.kernels.base import Kernel, Output
from sp_dagster.engine.kernels.eligibility import plain_query
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
        lo, hi = int(run.bounds[start]), int(run.bounds[end])
        batch = run.batch().slice(lo, hi - lo)
        times = run.times[lo:hi]
        owner = np.repeat(np.arange(start, end), np.diff(run.bounds[start : end + 1]))
        chunk = ArrowChunk(batch, pa.array(times, pa.int64()))
        for processor in self.query.processors:
            mask = processor.vector(chunk)
            if isinstance(mask, pa.Scalar):
                if mask.as_py() is True:
                    continue
                mask = pa.array(np.zeros(chunk.batch.num_rows, bool))
            keep = mask.to_numpy(zero_copy_only=False)
            keep = np.where(mask.is_null().to_numpy(zero_copy_only=False), False, keep) if mask.null_count else keep.astype(bool)
            chunk = ArrowChunk(chunk.batch.filter(keep), chunk.timestamps.filter(keep))
            times, owner = times[keep], owner[keep]
        selector = self.query.selector
        rows = chunk.batch.num_rows
        columns = [materialize(v(chunk), rows, e.type) for v, e in zip(selector.vectors, selector.executors)]
        out = pa.RecordBatch.from_arrays(columns, schema=selector.output_schema.arrow_schema())
        return Output(self.query, out, times, owner)

