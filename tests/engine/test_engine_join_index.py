"""Joins indexed by an `L.a == R.b` conjunct give exactly what the unindexed scan gives.

The same app is run twice on the same random input, sent in chunks: once with the equality
written plainly (indexed) and once written as `(L.a == R.b) == true` (the same condition, which
the index does not recognise, so every held event is tested). Outputs must be identical, in
order, for inner and outer joins, with null keys and keys that repeat.
"""

from __future__ import annotations

import random

import pytest

from sp_dagster.engine import AppRuntime
from sp_dagster.engine.join import JoinSide

APP = """
@app:playback
define stream A (symbol string, price double, n int);
define stream B (symbol string, price double, n int);
@info(name='q')
from A#window.length({a}) {join} B#window.length({b})
  on {condition} and A.price >= B.price
select A.symbol as s, A.n as an, B.n as bn, B.price as bp
insert all events into Out;
"""


def run(app: str, inputs) -> list:
    out = []
    runtime = AppRuntime(app)
    runtime.add_callback("Out", lambda events: out.extend((e.timestamp, e.is_expired, e.data) for e in events))
    try:
        for stream, rows, times in inputs:
            runtime.send(stream, rows, times)
    finally:
        runtime.shutdown()
    return out


def random_inputs(seed: int):
    rng = random.Random(seed)
    symbols = ["IBM", "WSO2", "ORCL", None]
    inputs, now, n = [], 1_000, 0
    for _ in range(60):
        stream = rng.choice("AB")
        rows, times = [], []
        for _ in range(rng.randint(1, 12)):  # a chunk of events, as a worker's micro-batch sends them
            n += 1
            now += rng.randint(0, 3)
            rows.append([rng.choice(symbols), float(rng.randint(1, 20)), n])
            times.append(now)
        inputs.append((stream, rows, times))
    return inputs


@pytest.mark.parametrize("join", ["join", "left outer join", "right outer join", "full outer join"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_indexed_join_equals_the_full_scan(join, seed):
    inputs = random_inputs(seed)
    indexed = APP.format(a=7, b=5, join=join, condition="A.symbol == B.symbol")
    scanned = APP.format(a=7, b=5, join=join, condition="(A.symbol == B.symbol) == true")
    expected = run(scanned, inputs)
    matched = [data for _, _, data in expected if data[1] is not None and data[2] is not None]
    assert len(matched) > 20 and len(expected) > len(matched) - (join == "join") * len(matched)  # it joins
    assert run(indexed, inputs) == expected


def test_the_index_is_used_only_for_a_required_equality_of_one_attribute_per_side():
    def keys(condition):
        app = APP.format(a=3, b=3, join="join", condition=condition)
        runtime = AppRuntime(app)
        try:
            sides = [p for q in runtime.queries.values() for p in q.join_sides if isinstance(p, JoinSide)]
            return [side.keys for side in sides]
        finally:
            runtime.shutdown()

    assert keys("A.symbol == B.symbol") == [(0, 0), (0, 0)]
    assert keys("B.n == A.n") == [(2, 2), (2, 2)]
    assert keys("(A.symbol == B.symbol) == true") == [None, None]
    assert keys("A.price == B.n") == [None, None]  # double vs int: compared after widening, not indexed
    assert keys("A.symbol == A.symbol") == [None, None]  # one side only
