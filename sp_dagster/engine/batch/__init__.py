"""The batch path: a query's outputs for a whole run of chunks at once, exactly as chunk by chunk.
A kernel (base.Kernel) computes one query's outputs over a segment of a run; `plan_stream` finds
the kernels of a stream's subscribers (cached per stream), and send_each.py drives them.
"""

from __future__ import annotations

from sp_dagster.engine.batch.base import RUNS, Kernel, Output, StreamPlan
from sp_dagster.engine.batch.eligibility import written_streams
from sp_dagster.engine.batch.join import JoinKernel
from sp_dagster.engine.batch.partition import PartitionKernel
from sp_dagster.engine.batch.patterns import PatternKernel
from sp_dagster.engine.batch.processors import StatelessKernel
from sp_dagster.engine.batch.windows.length import LengthAggregateKernel
from sp_dagster.engine.batch.windows.time import LengthBatchAggregateKernel, TimeBatchAggregateKernel

#: Kernel classes, tried in order; the first whose `build` accepts a query is used.
KERNELS: tuple[type[Kernel], ...] = (
    StatelessKernel,
    LengthAggregateKernel,
    TimeBatchAggregateKernel,
    LengthBatchAggregateKernel,
    PartitionKernel,
    PatternKernel,
    JoinKernel,
)


def plan_stream(runtime, junction) -> StreamPlan | None:
    """The kernels of `junction`'s subscribers, or None when none has one (cached)."""
    cache = runtime.batch_plans
    if junction.name not in cache:
        cache[junction.name] = _plan(runtime, junction)
    return cache[junction.name]


def _plan(runtime, junction) -> StreamPlan | None:
    if junction.name in written_streams(runtime.app):
        return None
    kernels = {}
    for receiver in junction.receivers:
        for kernel_class in KERNELS:
            kernel = kernel_class.build(receiver, runtime)
            if kernel is not None:
                kernels[id(receiver)] = kernel
                break
    timed = [k for k in kernels.values() if getattr(k, "timers", None) is not None]
    if timed and not _may_fire_timers(junction, kernels, timed):
        kernels = {key: k for key, k in kernels.items() if k not in timed}
    return StreamPlan(kernels) if kernels else None


def _may_fire_timers(junction, kernels, timed) -> bool:
    """A kernel may fire its own timers inside a segment only where nothing else can arm a timer
    during the segment's delivery: every subscriber has a kernel, no stream they write is read."""
    if len(timed) > 1 or any(id(receiver) not in kernels for receiver in junction.receivers):
        return False
    for kernel in kernels.values():
        target = getattr(kernel.query.output, "target", None)
        if target is not None and target.receivers:
            return False
    return True


__all__ = ["KERNELS", "RUNS", "Kernel", "Output", "StreamPlan", "plan_stream"]
