"""Partitions (`partition with (key of S) begin ... end`) over a whole segment.
The segment's keys are found at once, instances made in the order the event path makes them, and
each inner query's kernel computes every instance at once, one lane per key.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sp_dagster.engine.batch.base import Kernel, Output, apply_filters
from sp_dagster.engine.batch.eligibility import blind_output
from sp_dagster.engine.batch.patterns import PatternKernel
from sp_dagster.engine.batch.windows.length import LengthAggregateKernel
from sp_dagster.engine.events import ArrowChunk
from sp_dagster.engine.partition import PartitionInstance, PartitionReceiver
from sp_dagster.javatext import java_str
from sp_dagster.siddhi import ast

#: Key attribute types whose java_str form tells values apart.
KEY_TYPES = ("string", "int", "long")
#: Kernel classes an inner query may have (each computes lanes).
INNER = (LengthAggregateKernel, PatternKernel)


class PartitionKernel(Kernel):
    """A value partition on one attribute of S whose every inner query has a lane kernel.

    The event path routes every chunk of S to the instance of its key, split into runs of one key
    (sub-chunks; events without a key are dropped), and each instance's queries process their
    sub-chunk. Here each inner query's kernel computes every instance at once, one lane per key
    (batch.windows.length, batch.patterns); PartitionOutput delivers the outputs sub-chunk by
    sub-chunk, query by query, as the instances would send them.
    """

    @classmethod
    def build(cls, receiver, runtime):
        if not isinstance(receiver, PartitionReceiver) or len(receiver.executors) != 1:
            return None
        partition = receiver.runtime
        stream = receiver.stream
        if partition.read != [stream] or runtime.context.analysis.inner_streams(partition.partition):
            return None
        keys = [key for key in partition.partition.keys if key.stream == stream]
        if len(keys) != 1 or not isinstance(keys[0], ast.ValuePartition):
            return None
        expression = keys[0].expression
        schema = runtime.context.junctions[stream].schema
        if not isinstance(expression, ast.Variable) or expression.index is not None:
            return None
        index = schema.index(expression.name)
        if index is None or schema.types[index] not in KEY_TYPES:
            return None
        template = PartitionInstance(partition, None)
        try:
            kernels = []
            for query in template.queries:
                kernel = next((k for k in (c.inner(query, runtime) for c in INNER) if k is not None), None)
                if kernel is None:
                    return None
                kernels.append(kernel)
        finally:
            template.stop()
        return cls(partition, index, schema.types[index], kernels)

    def __init__(self, partition, index: int, kind: str, kernels: list):
        super().__init__(kernels[0].query)
        self.partition = partition
        self.index = index
        self.kind = kind
        self.kernels = kernels

    def blind(self) -> bool:
        return len(self.kernels) == 1 and blind_output(self.query)

    def _lanes(self, position: int, instances) -> list:
        kernel = self.kernels[position]
        return [kernel.lane(i.queries[position]) for i in instances]

    def extent(self, run, start, end):
        if not all(kernel.run_fits(run) for kernel in self.kernels):
            return start
        for position, kernel in enumerate(self.kernels):
            for lane in self._lanes(position, self.partition.instances.values()):
                if not kernel.lane_fits(lane, run):
                    return start
        return end

    def run(self, run, start, end):
        lo, hi = int(run.bounds[start]), int(run.bounds[end])
        batch = run.batch().slice(lo, hi - lo)
        encoded = pc.dictionary_encode(batch.column(self.index))  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes it at import
        codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        rows = np.flatnonzero(codes >= 0)
        codes = codes[rows]
        # lanes in order of first appearance: instances are made in that order
        present, first = np.unique(codes, return_index=True)
        order = present[np.argsort(first, kind="stable")]
        lane_of_code = np.empty(len(encoded.dictionary), np.int64)
        lane_of_code[order] = np.arange(len(order))
        lane = lane_of_code[codes]
        values = encoded.dictionary.to_pylist()
        instances = [self.partition.instance(java_str(values[c], self.kind)) for c in order.tolist()]
        # sub-chunks: runs of one key within a chunk
        chunk_of = np.repeat(np.arange(start, end), np.diff(run.bounds[start : end + 1]))[rows]
        opens = np.ones(len(rows), bool)
        opens[1:] = (chunk_of[1:] != chunk_of[:-1]) | (lane[1:] != lane[:-1])
        sub = np.cumsum(opens) - 1
        sub_chunk = chunk_of[opens]
        times = run.times[lo:hi][rows]
        keyed = batch if len(rows) == batch.num_rows else batch.take(pa.array(rows))
        outputs = []
        for position, kernel in enumerate(self.kernels):
            chunk = ArrowChunk(keyed, pa.array(times, pa.int64()))
            chunk, kept = apply_filters(chunk, kernel.filters)
            arrivals = slice(None) if kept is None else kept
            out, out_times, out_sub, split = kernel.compute(chunk.batch, times[arrivals], sub[arrivals], lane[arrivals], self._lanes(position, instances))
            outputs.append(Output(kernel.query, out, out_times, out_sub, split))
        return PartitionOutput(outputs, sub_chunk)


class PartitionOutput:
    """The inner queries' outputs of a segment, per sub-chunk: chunk by chunk, sub-chunk by sub-chunk."""

    def __init__(self, outputs: list[Output], sub_chunk: np.ndarray):
        self.outputs = outputs
        self.sub_chunk = sub_chunk

    def deliver(self, chunk: int) -> None:
        first = int(np.searchsorted(self.sub_chunk, chunk, side="left"))
        last = int(np.searchsorted(self.sub_chunk, chunk, side="right"))
        for sub in range(first, last):
            for output in self.outputs:
                output.deliver(sub)

    def deliver_all(self, send_of: np.ndarray) -> None:
        sends = send_of[self.sub_chunk]
        for output in self.outputs:  # one output (Kernel.blind)
            output.deliver_all(sends)
