"""The single-send fast paths against their references, on random inputs.

Inline aggregator updates (sum, avg, count) against Aggregator.process; small record batches
taken as rows and output buffers drained into record batches against pyarrow's own conversions;
single sends against the same events sent through the general path.
"""

from __future__ import annotations

import numpy as np
import pytest

from sp_dagster.engine.aggregators import AGGREGATORS, AggregationContext, Aggregator
from sp_dagster.engine.events import CURRENT, EXPIRED, RESET, StreamEvent
from sp_dagster.engine.executor import Executor
from sp_dagster.siddhi import ast

LONG = 2**63


def _aggregator(name: str, kind: str | None):
    args = [Executor(kind, lambda e: e.data[0])] if kind is not None else []
    node = ast.FunctionCall(name=name, args=[ast.Variable(name="x")] if kind else [])
    return AGGREGATORS[name](node, args, AggregationContext())


def _value(rng, kind: str):
    if rng.random() < 0.1:
        return None
    if kind == "double":
        return float(rng.choice([0.0, -0.0, 1.5, -2.25, 1e300, -1e300, rng.normal() * 100]))
    big = rng.random() < 0.2
    return int(rng.integers(-LONG, LONG - 1)) if big else int(rng.integers(-5, 6))


@pytest.mark.parametrize(("name", "kind"), [("sum", "long"), ("sum", "int"), ("sum", "double"), ("avg", "double"), ("avg", "long"), ("count", None)])
@pytest.mark.parametrize("seed", range(6))
def test_inline_aggregator_updates_equal_the_reference(name, kind, seed):
    rng = np.random.default_rng(seed)
    fast, reference = _aggregator(name, kind), _aggregator(name, kind)
    for _ in range(400):
        key = int(rng.integers(0, 3))
        kind_of_event = int(rng.choice([CURRENT, CURRENT, EXPIRED, EXPIRED, RESET]))
        event = StreamEvent(0, (_value(rng, kind or "long"),), kind_of_event)
        outcomes = []
        for aggregator, process in ((fast, fast.process), (reference, lambda e, k: Aggregator.process(reference, e, k))):
            try:
                result = process(event, key)
            except ZeroDivisionError:
                result = "ZeroDivisionError"
            outcomes.append((result, repr(result), aggregator.snapshot()))
        assert outcomes[0] == outcomes[1], (event, key)
        if rng.random() < 0.02:
            fast.reset()
            reference.reset()
