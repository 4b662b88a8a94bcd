"""Aggregation retrieval latency: on-demand `within ... per ...` over 1M aggregated events.

Run: python bench/aggregation.py [--events N] [--symbols S] [--spacing MS] [--jdbc URL] [--repeat R]
Loads N events (default 1,000,000; S symbols, default 100, event times MS apart, default 1 ms,
so 1M events span 1000 s) into `define aggregation ... group by symbol aggregate by ts every
sec ... year` in playback, kept in memory or, with --jdbc (e.g. jdbc:sqlite:/tmp/agg.db or a
jdbc:postgresql:// URL), in a database through @store(type='rdbms'). Then runs each retrieval
R times (default 20) and prints one JSON line per retrieval: rows returned, p50/p99/max
latency in ms; a first line gives the load rate. Never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import pyarrow as pa

from sp_dagster.engine import AppRuntime

START = 1_496_275_200_000  # 2017-06-01 00:00:00 GMT
APP = """@app:playback
define stream Trades (symbol string, price double, volume long, ts long);
{store}
define aggregation TradeAgg from Trades
select symbol, sum(volume) as total, avg(price) as average, count() as trades, max(price) as high
group by symbol
aggregate by ts every sec ... year;
"""
RETRIEVALS = {
    "seconds_in_one_minute": "from TradeAgg within '2017-06-01 00:01:**' per 'seconds' select symbol, total, trades",
    "seconds_in_range_one_symbol": "from TradeAgg on symbol == 'S7' within {start}L, {end}L per 'seconds' select AGG_TIMESTAMP, total",
    "minutes_in_one_hour": "from TradeAgg within '2017-06-01 00:**:**' per 'minutes' select symbol, total, average",
    "hours_in_one_day_top5": "from TradeAgg within '2017-06-01 **:**:**' per 'hours' select symbol, sum(total) as volume "
    "group by symbol order by volume desc limit 5",
    "days_in_the_year": "from TradeAgg within '2017-**-** **:**:**' per 'days' select symbol, trades, high",
}


def load(runtime: AppRuntime, events: int, symbols: int, spacing: int, size: int = 10_000) -> float:
    """Send the events as record batches; the seconds it took."""
    rng = np.random.default_rng(7)
    names = np.array([f"S{i}" for i in range(symbols)], dtype=object)
    started = time.perf_counter()
    for first in range(0, events, size):
        index = np.arange(first, min(first + size, events))
        times = START + index * spacing
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(names[index % symbols], pa.string()),
                pa.array(100.0 + rng.random(len(index)) * 100.0, pa.float64()),
                pa.array(rng.integers(1, 1000, len(index)), pa.int64()),
                pa.array(times, pa.int64()),
            ],
            names=["symbol", "price", "volume", "ts"],
        )
        runtime.send("Trades", batch, pa.array(times, pa.int64()))
    return time.perf_counter() - started


def main() -> None:
    """Load the events, then time every retrieval."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--symbols", type=int, default=100)
    parser.add_argument("--spacing", type=int, default=1, help="ms between event times (default 1)")
    parser.add_argument("--jdbc", help="keep the tables in this database (@store(type='rdbms', jdbc.url=...))")
    parser.add_argument("--username", default="")
    parser.add_argument("--password", default="")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    store = ""
    if args.jdbc:
        store = f"@store(type='rdbms', jdbc.url='{args.jdbc}', username='{args.username}', password='{args.password}')"
    runtime = AppRuntime(APP.format(store=store))
    try:
        seconds = load(runtime, args.events, args.symbols, args.spacing)
        print(
            json.dumps(
                {
                    "bench": "aggregation",
                    "figure": "load",
                    "events": args.events,
                    "seconds": round(seconds, 3),
                    "events_per_s": round(args.events / seconds),
                    "rows": runtime.context.aggregations["TradeAgg"].counts(),
                    "store": "rdbms" if args.jdbc else "memory",
                }
            ),
            flush=True,
        )
        end = START + args.events * args.spacing
        for name, query in RETRIEVALS.items():
            text = query.format(start=START, end=min(end, START + 60_000))
            latencies, rows = [], 0
            for _ in range(args.repeat):
                began = time.perf_counter()
                rows = len(runtime.query(text))
                latencies.append((time.perf_counter() - began) * 1000)
            latencies.sort()
            print(
                json.dumps(
                    {
                        "bench": "aggregation",
                        "figure": "retrieval",
                        "retrieval": name,
                        "rows": rows,
                        "repeat": args.repeat,
                        "p50_ms": round(statistics.median(latencies), 2),
                        "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 2),
                        "max_ms": round(latencies[-1], 2),
                    }
                ),
                flush=True,
            )
    finally:
        runtime.shutdown()


if __name__ == "__main__":
    main()
