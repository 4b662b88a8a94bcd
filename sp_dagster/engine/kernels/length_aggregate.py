"""length(n) windows under sum/count/avg selectors (with or without group by), over a whole segment."""

from __future__ import annotations

from sp_dagster.engine.kernels.base import Kernel


class LengthAggregateKernel(Kernel):
    """`from S[...]#window.length(n) select <attributes, sum/count/avg> [group by ...]`."""

    @classmethod
    def build(cls, receiver, runtime):
        return None
