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


# --------------------------------------------------------------------------- rows compiled


def test_compiled_rows_equal_evaluating_each_executor():
    from sp_dagster.engine import AppRuntime

    app = (
        "define stream S (symbol string, price double, volume long);\n"
        "@info(name='q') from S#window.length(3) select volume, symbol, price * 2.0 + volume as w, sum(volume) as total, "
        "count() as n, avg(price) as a, 'k' as k, symbol as again group by symbol insert into Out;"
    )
    runtime = AppRuntime(app)
    selector = runtime.queries["q"].selector
    rng = np.random.default_rng(3)
    for _ in range(200):
        event = StreamEvent(1, (str(rng.integers(0, 3)), float(rng.random() * 10), int(rng.integers(0, 100))))
        selector.aggregation.apply(event, event.data[0])
        assert selector.build_row(event) == tuple(executor.row(event) for executor in selector.executors)
    runtime.shutdown()


# --------------------------------------------------------------------------- small Arrow conversions


@pytest.mark.parametrize("seed", range(8))
def test_timestamps_packed_equal_pa_array(seed):
    import pyarrow as pa

    from sp_dagster.engine.junction import int64_array

    rng = np.random.default_rng(seed)
    for _ in range(100):
        count = int(rng.integers(0, 20))
        values = [int(v) for v in rng.integers(-(2**62), 2**62, count)]
        if count and rng.random() < 0.2:
            values[int(rng.integers(0, count))] = int(rng.choice([2**63, -(2**63) - 1, 2**63 - 1, -(2**63)]))
        try:
            expected = pa.array(values, pa.int64())
        except (OverflowError, pa.ArrowInvalid) as error:
            with pytest.raises(type(error)):
                int64_array(values)
            continue
        got = int64_array(values)
        assert got.type == expected.type and got.equals(expected) and got.to_pylist() == values


@pytest.mark.parametrize("seed", range(8))
def test_small_batches_taken_column_wise_equal_to_pydict(seed):
    import pyarrow as pa

    from sp_dagster.engine import AppRuntime

    runtime = AppRuntime("define stream S (s string, d double, l long, i int, f float, b bool); from S select * insert into O;")
    schema = runtime.schema("S")
    arrow = schema.arrow_schema()
    rng = np.random.default_rng(seed)

    def value(kind):
        if rng.random() < 0.2:
            return None
        return {
            "s": str(rng.integers(0, 99)),
            "d": float(rng.normal()),
            "l": int(rng.integers(-(2**62), 2**62)),
            "i": int(rng.integers(-100, 100)),
            "f": 0.5,
            "b": bool(rng.random() < 0.5),
        }[kind]

    for _ in range(50):
        count = int(rng.integers(1, 12))
        rows = [{name: value(name) for name in arrow.names} for _ in range(count)]
        batch = pa.RecordBatch.from_pylist(rows, schema=arrow)
        start = int(rng.integers(0, count))
        batch = batch.slice(start, int(rng.integers(0, count - start + 1)))
        taken, whole = runtime.conform("S", schema, batch)
        if batch.num_rows > 8:
            assert taken is None and whole is not None
            continue
        assert taken == list(zip(*batch.to_pydict().values()))
    runtime.shutdown()
