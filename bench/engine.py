"""Engine throughput: events per second through AppRuntime, in process, one JSON line per workload.

Run: python bench/engine.py [--events N] [--batch B] [--only NAME ...]
Workloads (1,000,000 events each by default, sent as Arrow record batches of B rows):
filter; projection with arithmetic; length(1000) sum/count group by symbol; timeBatch(1 sec)
avg group by symbol in playback; partitioned length(10) avg; a length(100) stream-stream
join on symbol (Trades and Quotes, each batch sent in slices of 100 rows taking turns); a
pattern `every e1 -> e2 ... within 1 sec` on one stream; an absent pattern (`every e1 -> not
... for 100 ms`) in playback; an incremental aggregation `every sec ... year` with group by
in playback (events/s into it; its Out query passes nothing). Events carry one of 100
symbols and timestamps 1 ms apart.
Workloads with a SCALE below 1 run on that fraction of the events (said in their line).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pyarrow as pa

from sp_dagster.engine import AppRuntime

STREAM = "define stream Trades (symbol string, price double, volume long);\n"
QUOTES = "define stream Quotes (symbol string, price double, volume long);\n"
WORKLOADS = {
    "filter": STREAM + "from Trades[price > 150.0] select symbol, price insert into Out;",
    "projection": STREAM + "from Trades select symbol, price * 2.0 + volume as weighted, volume - 10 as lots insert into Out;",
    "length_window_group_by": STREAM
    + "from Trades#window.length(1000) select symbol, sum(volume) as total, count() as trades group by symbol insert into Out;",
    "time_batch_avg_playback": "@app:playback\n"
    + STREAM
    + "from Trades#window.timeBatch(1 sec) select symbol, avg(price) as average group by symbol insert into Out;",
    "partitioned_length_avg": STREAM
    + "partition with (symbol of Trades) begin from Trades#window.length(10) select symbol, avg(price) as average insert into Out; end;",
    "length_window_join": STREAM
    + QUOTES
    + "from Trades#window.length(100) join Quotes#window.length(100) on Trades.symbol == Quotes.symbol "
    "select Trades.symbol as symbol, Trades.price as price, Quotes.price as quote insert into Out;",
    "pattern_within": STREAM
    + "from every e1=Trades[price > 190.0] -> e2=Trades[symbol == e1.symbol and price > e1.price] within 1 sec "
    "select e1.symbol as symbol, e1.price as first, e2.price as second insert into Out;",
    "absent_pattern_playback": "@app:playback\n"
    + STREAM
    + "from every e1=Trades[price > 198.0] -> not Trades[symbol == e1.symbol and price > e1.price] for 100 milliseconds "
    "select e1.symbol as symbol, e1.price as price insert into Out;",
    "aggregation_sec_to_year_playback": "@app:playback\n"
    + STREAM
    + "define aggregation TradeAgg from Trades select symbol, sum(volume) as total, avg(price) as average, count() as trades "
    "group by symbol aggregate every sec ... year;\nfrom Trades[volume < 0] select symbol insert into Out;",
}
#: Streams a workload's events go to, taking turns in slices of SLICE rows (default: Trades).
TARGETS = {"length_window_join": ("Trades", "Quotes")}
SLICE = 100
#: Workloads run on a fraction of --events (Python's per-partial-match work is slow).
SCALE: dict[str, float] = {"pattern_within": 0.1}


def batches(events: int, size: int, symbols: int = 100):
    """(record batch, timestamps) pairs: symbols round-robin, prices 100..200, 1 ms apart."""
    rng = np.random.default_rng(7)
    names = np.array([f"S{i}" for i in range(symbols)], dtype=object)
    for start in range(0, events, size):
        n = min(size, events - start)
        index = np.arange(start, start + n)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(names[index % symbols], pa.string()),
                pa.array(100.0 + rng.random(n) * 100.0, pa.float64()),
                pa.array(rng.integers(1, 1000, n), pa.int64()),
            ],
            names=["symbol", "price", "volume"],
        )
        yield batch, pa.array(1_700_000_000_000 + index, pa.int64())


def sends(name: str, events: int, size: int):
    """(stream, record batch, timestamps) in send order for workload `name`."""
    targets = TARGETS.get(name, ("Trades",))
    turn = 0
    for batch, timestamps in batches(events, size):
        if len(targets) == 1:
            yield targets[0], batch, timestamps
            continue
        for offset in range(0, batch.num_rows, SLICE):
            yield targets[turn % len(targets)], batch.slice(offset, SLICE), timestamps.slice(offset, SLICE)
            turn += 1


def run(name: str, events: int, size: int) -> dict:
    """Send `events` events (scaled down for some workloads) through `name`; return its figures."""
    scale = SCALE.get(name, 1.0)
    events = int(events * scale)
    runtime = AppRuntime(WORKLOADS[name])
    output = runtime.add_buffer("Out")
    data = list(sends(name, events, size))
    outputs = 0
    start = time.perf_counter()
    for stream, batch, timestamps in data:
        runtime.send(stream, batch, timestamps)
        outputs += output.drain()[0].num_rows  # as a worker does after each input batch
    seconds = time.perf_counter() - start
    runtime.shutdown()
    figures = {
        "bench": "engine",
        "workload": name,
        "events": events,
        "batch": size,
        "seconds": round(seconds, 3),
        "events_per_s": round(events / seconds),
        "outputs": outputs,
    }
    if scale != 1.0:
        figures["scaled"] = f"{scale:g} of --events: {name} is slow in pure Python"
    return figures


def main() -> None:
    """Run the workloads named on the command line (all by default)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events per workload (default 1,000,000)")
    parser.add_argument("--batch", type=int, default=10_000, help="rows per record batch sent (default 10,000)")
    parser.add_argument("--only", nargs="*", choices=sorted(WORKLOADS), help="run only these workloads")
    args = parser.parse_args()
    for name in args.only or WORKLOADS:
        print(json.dumps(run(name, args.events, args.batch)), flush=True)


if __name__ == "__main__":
    main()
