"""send_each against the event path: every conformance case and random apps, replayed both ways.

The reference is one AppRuntime.send per send; send_each must give the same callbacks (content,
order, chunks), the same `before` marks between them, the same buffers and the same state.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from sp_dagster.engine import AppRuntime, EngineError
from sp_dagster.engine.conformance import load_cases
from sp_dagster.engine.values import coerce
from sp_dagster.siddhi import SiddhiQLError
from tests.engine.sequential_harness import assert_same, random_sizes
from tests.fixtures.conformance import FILES


def _cases():
    """Every case whose app builds on one runtime with default settings: the rest (apps that must
    not build, several runtimes sharing a store, Siddhi properties) have no single send path to compare."""
    params = []
    for path in FILES:
        for case in load_cases(path):
            if case.runtimes or case.siddhi_config:
                continue
            try:
                AppRuntime(case.app).shutdown()
            except (SiddhiQLError, EngineError):
                continue
            params.append(pytest.param(case, id=f"{path.stem}:{case.id}"))
    return params


def _groups(case, rng):
    """The case's inputs as runs of consecutive inputs to one stream, cut into random sends."""
    runtime = AppRuntime(case.app)
    schemas = runtime.streams
    runtime.shutdown()
    groups, current = [], None
    for event in case.inputs:
        stream, timestamp = event["stream"], event.get("timestamp")
        row = [coerce(value, kind) for value, kind in zip(event["data"], schemas[stream].types)]
        if current is None or current[0] != stream or (current[2] is None) != (timestamp is None):
            current = [stream, [], None if timestamp is None else []]
            groups.append(current)
        current[1].append(row)
        if timestamp is not None:
            current[2].append(timestamp)
    return [(stream, rows, times, random_sizes(rng, len(rows))) for stream, rows, times in groups]


@pytest.mark.skipif(not FILES, reason="no conformance files")
@pytest.mark.parametrize("case", _cases())
def test_conformance_case_gives_the_same_both_ways(case):
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    wall = any(event.get("timestamp") is None for event in case.inputs)
    for _ in range(2):
        assert_same(case.app, _groups(case, rng), wall_times=wall)


# --------------------------------------------------------------------------- random apps

STREAM = "define stream S (symbol string, price double, volume long, qty int);\n"


def _random_query(rng, index: int) -> str:
    """One random query over S: filters, a window, aggregates or projections, maybe group by."""
    source = "S"
    if rng.random() < 0.5:
        source += f"[price > {rng.integers(90, 160)}.0]"
    window = rng.choice(
        [
            "",
            f"#window.length({rng.integers(1, 12)})",
            f"#window.lengthBatch({rng.integers(1, 6)})",
            f"#window.time({rng.integers(1, 20)})",
            f"#window.timeBatch({rng.integers(1, 20)})",
        ]
    )
    if rng.random() < 0.3 and window:
        source += f"[volume < {rng.integers(200, 1000)}]"
    source += window if not (rng.random() < 0.3 and window) else ""
    aggregates = ["sum(volume) as v", "count() as n", "avg(price) as p", "sum(price) as sp", "max(qty) as m", "avg(qty) as aq"]
    if rng.random() < 0.6:
        chosen = list(rng.choice(aggregates, size=int(rng.integers(1, 4)), replace=False))
        group = rng.random() < 0.6
        attributes = ", ".join((["symbol"] if group or rng.random() < 0.5 else []) + chosen)
        selector = f"select {attributes}" + (" group by symbol" if group else "")
        if rng.random() < 0.15:
            selector += " having " + chosen[0].split(" as ")[1] + " > 1"
    else:
        selector = rng.choice(
            ["select symbol, price", "select symbol, price * 2.0 + volume as w, volume - 10 as lots", "select *", "select qty / 3 as third, symbol"]
        )
    kind = rng.choice(["", "", "expired ", "all "]) if window else ""
    return f"from {source} {selector} insert {kind}events into Out{index};\n"


def _random_app(rng) -> str:
    body = "".join(_random_query(rng, i) for i in range(int(rng.integers(1, 3))))
    if rng.random() < 0.25:
        body = f"partition with (symbol of S) begin {body} end;\n"
    playback = rng.random() < 0.7 or "#window.time" in body  # wall-clock timers would race the test
    return ("@app:playback\n" if playback else "") + STREAM + body


def _random_events(rng, count: int, nulls: float):
    symbols = np.array(["IBM", "WSO2", "ORCL", None], dtype=object)
    rows = []
    for _ in range(count):
        volume = None if rng.random() < nulls else int(rng.integers(1, 1000))
        rows.append((symbols[rng.integers(0, 3 if rng.random() >= nulls else 4)], float(rng.integers(0, 4000)) / 20, volume, int(rng.integers(-5, 50))))
    steps = rng.choice([0, 0, 1, 1, 2, 5, 30], size=count)
    times = (1000 + np.cumsum(steps)).tolist()
    return rows, times


def _assert_same_on_random_runs(app: str, rng, sends: int, events: int, nulls: float) -> None:
    """`sends` random runs of up to `events` events, one after the other in time: the same both ways."""
    groups = []
    for _ in range(sends):
        rows, times = _random_events(rng, int(rng.integers(1, events)), nulls)
        if groups:
            shift = groups[-1][2][-1]
            times = [t - 1000 + shift for t in times]
        groups.append(("S", rows, times, random_sizes(rng, len(rows))))
    try:
        assert_same(app, groups, wall_times="@app:playback" not in app)
    except AssertionError as error:
        raise AssertionError(f"{app}\n{error}") from None


@pytest.mark.parametrize("seed", range(100))
def test_random_app_gives_the_same_both_ways(seed):
    rng = np.random.default_rng(seed)
    app = _random_app(rng)
    _assert_same_on_random_runs(app, rng, sends=3, events=120, nulls=(0.0, 0.03)[seed % 2])


def test_sizes_must_cover_the_rows():
    runtime = AppRuntime(STREAM + "from S select symbol insert into Out;")
    with pytest.raises(EngineError, match="add up"):
        runtime.send_each("S", [("a", 1.0, 1, 1)] * 3, [1, 2, 3], sizes=[1, 1])
    runtime.shutdown()


def test_before_is_called_once_per_send_in_order():
    runtime = AppRuntime(STREAM + "from S[price > 10.0] select symbol insert into Out;")
    seen = []
    runtime.add_callback("Out", lambda events: seen.append([e.data[0] for e in events]))
    runtime.send_each("S", [("a", 1.0, 1, 1), ("b", 20.0, 1, 1), ("c", 30.0, 1, 1), ("d", 40.0, 1, 1)], [1, 2, 3, 4], sizes=[1, 2, 1], before=seen.append)
    assert seen == [0, 1, ["b", "c"], 2, ["d"]]
    runtime.shutdown()


def test_blind_receivers_are_told_each_rows_send_when_a_run_comes_whole():
    # A receiver that cannot tell chunks apart, on the stream sent to and on the query's output:
    # send_each may deliver the run at once, and then names every row's send (add_receiver).
    class Blind:
        blind = True

        def __init__(self):
            self.sends = []

        def receive(self, chunk):
            self.sends += chunk.sends.tolist()

    runtime = AppRuntime(STREAM + "from S[price > 10.0] select symbol insert into Out;")
    into, out = Blind(), Blind()
    runtime.add_receiver("S", into)
    runtime.add_receiver("Out", out)
    runtime.send_each("S", [("a", 1.0, 1, 1), ("b", 20.0, 1, 1), ("c", 30.0, 1, 1), ("d", 40.0, 1, 1)], [1, 2, 3, 4], sizes=[1, 2, 1])
    assert (into.sends, out.sends) == ([0, 1, 1, 2], [1, 1, 2])
    runtime.shutdown()


def _windowed_aggregate_app(rng) -> str:
    """A length window under sum/count/avg, maybe filtered first, maybe grouped (what kernels compute)."""
    source = "S" + (f"[price > {rng.integers(20, 150)}.0]" if rng.random() < 0.4 else "")
    source += f"#window.length({rng.integers(1, 15)})"
    aggregates = ["sum(volume) as v", "count() as n", "avg(price) as p", "sum(price) as sp", "avg(qty) as aq", "sum(qty) as sq"]
    chosen = list(rng.choice(aggregates, size=int(rng.integers(1, 5)), replace=False))
    group = rng.random() < 0.7
    attributes = (["symbol"] if group or rng.random() < 0.5 else []) + chosen + (["price"] if rng.random() < 0.3 else [])
    rng.shuffle(attributes)
    selector = "select " + ", ".join(attributes) + (" group by symbol" if group else "")
    playback = "@app:playback\n" if rng.random() < 0.5 else ""
    return playback + STREAM + f"from {source} {selector} insert into Out;\n"


def _assert_same_with_kernel(kernel: str, app: str, rng, nulls: float, expected: bool = True) -> None:
    """Random runs give the same both ways, and (if `expected`, without nulls, which make kernels
    fall back) `kernel` ran."""
    from sp_dagster.engine.batch import RUNS

    before = RUNS[kernel]
    _assert_same_on_random_runs(app, rng, sends=4, events=150, nulls=nulls)
    if expected and not nulls:
        assert RUNS[kernel] > before, f"{kernel} did not run"


@pytest.mark.parametrize("seed", range(40))
def test_windowed_aggregates_give_the_same_both_ways(seed):
    rng = np.random.default_rng(1000 + seed)
    app = _windowed_aggregate_app(rng)
    _assert_same_with_kernel("LengthAggregateKernel", app, rng, (0.0, 0.0, 0.0, 0.02)[seed % 4])


SNAPSHOT_APPS = {
    "length": "from S#window.length(5) select symbol, sum(volume) as v, avg(price) as p group by symbol insert into Out;",
    "partition": "partition with (symbol of S) begin from S#window.length(3) select symbol, avg(price) as p insert into Out; end;",
    "time_batch": "from S#window.timeBatch(7) select symbol, sum(volume) as v, count() as n group by symbol insert into Out;",
    "pattern": "partition with (symbol of S) begin from every e1=S[price > 100.0] -> e2=S[price > e1.price] within 20 milliseconds "
    "select e1.price as a, e2.price as b insert into Out; end;",
}


@pytest.mark.parametrize("kind", sorted(SNAPSHOT_APPS))
def test_a_snapshot_after_send_each_restores_and_goes_on_like_the_event_path(kind):
    app = "@app:playback\n" + STREAM + SNAPSHOT_APPS[kind]
    rng = np.random.default_rng(5)
    rows, times = _random_events(rng, 80, 0.0)
    fast, slow = AppRuntime(app), AppRuntime(app)
    fast.send_each("S", rows[:40], times[:40])
    for row, time in zip(rows[:40], times[:40]):
        slow.send("S", [row], [time])
    restored = AppRuntime(app)
    restored.restore(fast.snapshot())
    seen = {"restored": [], "slow": [], "fast": []}
    for name, runtime in (("restored", restored), ("slow", slow), ("fast", fast)):
        runtime.add_callback("Out", lambda events, n=name: seen[n].append([(e.timestamp, e.data) for e in events]))
    restored.send_each("S", rows[40:], times[40:])
    fast.send_each("S", rows[40:], times[40:])  # the snapshot took back what kernels held: on from there
    for row, time in zip(rows[40:], times[40:]):
        slow.send("S", [row], [time])
    assert seen["restored"] == seen["slow"] == seen["fast"] and seen["slow"]
    for runtime in (fast, slow, restored):
        runtime.shutdown()


def _partitioned_app(rng) -> str:
    """A value partition (on a string or an int) of length-window aggregate queries (the partition kernel)."""
    key = "symbol" if rng.random() < 0.75 else "qty"
    queries = [_windowed_aggregate_app(rng).split(STREAM)[1].replace("Out", f"Out{i}") for i in range(int(rng.integers(1, 3)))]
    if rng.random() < 0.3:  # a second query into the same stream: outputs interleave per sub-chunk
        queries.append(queries[0].replace("#window.length(", "#window.length(1"))
    queries = "".join(queries)
    playback = "@app:playback\n" if rng.random() < 0.5 else ""
    return playback + STREAM + f"partition with ({key} of S) begin\n{queries}end;\n"


@pytest.mark.parametrize("seed", range(40))
def test_partitioned_aggregates_give_the_same_both_ways(seed):
    rng = np.random.default_rng(2000 + seed)
    _assert_same_with_kernel("PartitionKernel", _partitioned_app(rng), rng, (0.0, 0.0, 0.05, 0.02)[seed % 4])


def _time_batch_app(rng) -> tuple[str, bool]:
    """timeBatch windows under sum/count/avg in playback (the timeBatch kernel), sometimes beside other queries."""
    query = _windowed_aggregate_app(rng).split(STREAM)[1]
    start = f", {rng.integers(0, 2000)}" if rng.random() < 0.3 else ""
    query = (
        query.replace("#window.length(", "#window.timeBatch(").replace(")", f"{start})", 1)
        if "[" not in query.split("#")[0]
        else query.replace("#window.length(", "#window.timeBatch(")
    )
    extra = ""
    if rng.random() < 0.3:  # a kernel beside it; reading Out, or a query without a kernel: no timeBatch kernel then
        extra = rng.choice(
            [
                "from S[price > 100.0] select symbol insert into Other;\n",
                "from Out select * insert into Again;\n",
                "from S#window.time(5) select count() as n insert into Other;\n",
            ]
        )
    return "@app:playback\n" + STREAM + query + extra, extra in ("", "from S[price > 100.0] select symbol insert into Other;\n")


@pytest.mark.parametrize("seed", range(40))
def test_time_batch_aggregates_give_the_same_both_ways(seed):
    rng = np.random.default_rng(3000 + seed)
    app, expected = _time_batch_app(rng)
    _assert_same_with_kernel("TimeBatchAggregateKernel", app, rng, (0.0, 0.0, 0.0, 0.02)[seed % 4], expected)


def _pattern_app(rng) -> tuple[str, str]:
    """`every e1=S[c1] -> e2=S[c2] within t` (the pattern kernel), maybe inside a partition; and the kernel expected."""
    c1 = rng.choice(["price > 150.0", "volume < 300", "price > 120.0 and qty > 10", "not (price < 140.0)", "symbol == 'IBM'", "qty >= 40 or price > 190.0"])
    c2 = rng.choice(
        [
            "price > e1.price",
            "symbol == e1.symbol and price > e1.price",
            "e2.volume >= e1.volume",
            "qty != e1.qty and price < e1.price",
            "symbol == e1.symbol",
            "price > e1.price + 10.0",
            "symbol != e1.symbol or volume > 900",
        ]
    )
    within = f" within {rng.integers(1, 40)} milliseconds" if rng.random() < 0.8 else ""
    selected = rng.choice(["e1.symbol as symbol, e1.price as first, e2.price as second", "e2.volume as v, e1.qty as q, e2.symbol as s", "e1.price as p"])
    query = f"from every e1=S[{c1}] -> e2=S[{c2}]{within} select {selected} insert into Out;\n"
    playback = "@app:playback\n" if rng.random() < 0.5 else ""
    if rng.random() < 0.5:
        key = "symbol" if rng.random() < 0.75 else "qty"
        if rng.random() < 0.4:  # beside a length-window aggregate: both kernels per key, outputs interleaved per sub-chunk
            query += "from S#window.length(3) select symbol, avg(price) as p insert into Out2;\n"
        return playback + STREAM + f"partition with ({key} of S) begin\n{query}end;\n", "PartitionKernel"
    return playback + STREAM + query, "PatternKernel"


@pytest.mark.parametrize("seed", range(60))
def test_patterns_give_the_same_both_ways(seed):
    rng = np.random.default_rng(4000 + seed)
    app, kernel = _pattern_app(rng)
    expected = "+ 10.0" not in app  # arithmetic in a condition: the event path
    _assert_same_with_kernel(kernel, app, rng, (0.0, 0.0, 0.0, 0.02)[seed % 4], expected)


def _join_app(rng) -> str:
    """A length-window join on an equality (the join kernel on each triggering side)."""
    left = "S" + (f"[price > {rng.integers(20, 150)}.0]" if rng.random() < 0.3 else "") + f"#window.length({rng.integers(1, 12)})"
    right = "T" + rng.choice([f"#window.length({rng.integers(1, 12)})", f"#window.lengthBatch({rng.integers(1, 4)})", f"#window.time({rng.integers(1, 20)})"])
    key = rng.choice(["S.symbol == T.symbol", "T.qty == S.qty", "S.volume == T.volume"])
    kind = rng.choice(["join", "join", "join", "unidirectional join", "left outer join"])
    selected = rng.choice(["S.symbol as symbol, S.price as price, T.price as quote", "T.volume + S.volume as v, S.qty as q", "T.symbol as ts, S.symbol as ss"])
    playback = "@app:playback\n" if rng.random() < 0.7 or "time" in right else ""
    return playback + STREAM + STREAM.replace("stream S", "stream T") + f"from {left} {kind} {right} on {key} select {selected} insert into Out;\n"


@pytest.mark.parametrize("seed", range(40))
def test_joins_give_the_same_both_ways(seed):
    from sp_dagster.engine.batch import RUNS

    rng = np.random.default_rng(5000 + seed)
    app = _join_app(rng)
    groups, shift = [], 0
    for turn in range(6):
        rows, times = _random_events(rng, int(rng.integers(1, 60)), (0.0, 0.03)[seed % 2])
        times = [t - 1000 + shift for t in times]
        shift = times[-1]
        groups.append(("ST"[turn % 2], rows, times, random_sizes(rng, len(rows))))
    before = RUNS["JoinKernel"]
    try:
        assert_same(app, groups, wall_times="@app:playback" not in app)
    except AssertionError as error:
        raise AssertionError(f"{app}\n{error}") from None
    if "outer" not in app:
        assert RUNS["JoinKernel"] > before, "the join kernel did not run"


@pytest.mark.parametrize("seed", range(30))
def test_length_batch_aggregates_give_the_same_both_ways(seed):
    rng = np.random.default_rng(6000 + seed)
    app = _windowed_aggregate_app(rng).replace("#window.length(", "#window.lengthBatch(")
    _assert_same_with_kernel("LengthBatchAggregateKernel", app, rng, (0.0, 0.0, 0.0, 0.02)[seed % 4])
