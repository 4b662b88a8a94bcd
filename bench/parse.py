"""SiddhiQL parsing speed: apps of many queries through parse, validate and render.

Run: python bench/parse.py [--queries N ...]
Prints one JSON line per figure; grammar loading is measured on its own.
"""

from __future__ import annotations

import argparse
import json
import time

from sp_dagster.siddhi.parser import _parser, parse
from sp_dagster.siddhi.render import render
from sp_dagster.siddhi.validate import validate

QUERY_SHAPES = (
    "@info(name = 'filter{i}')\nfrom Trades[price > {i} and symbol != 'X{i}']\nselect symbol, price * 2 as doubled, volume\ninsert into Filtered{i};",
    "@info(name = 'window{i}')\nfrom Trades#window.time({i} sec)\n"
    "select symbol, avg(price) as avgPrice, count() as trades\ngroup by symbol\nhaving avgPrice > {i}.5\n"
    "output last every 5 events\ninsert into Stats{i};",
    "@info(name = 'join{i}')\nfrom Trades#window.length({i}) as t join Quotes#window.length(10) as q\n"
    "on t.symbol == q.symbol\nselect t.symbol, t.price, q.bid\ninsert into Joined{i};",
    "@info(name = 'pattern{i}')\nfrom every e1=Trades[price > {i}] -> e2=Trades[price > e1.price] within 1 min\n"
    "select e1.symbol, e2.price\ninsert into Rising{i};",
)


def make_app(queries: int) -> str:
    """A valid app with `queries` queries of mixed shapes (filter, window, join, pattern)."""
    head = "@app:name('Bench')\ndefine stream Trades (symbol string, price double, volume long);\ndefine stream Quotes (symbol string, bid double);\n"
    body = "\n".join(QUERY_SHAPES[i % len(QUERY_SHAPES)].format(i=i) for i in range(queries))
    return head + body


def best_of(runs: int, action) -> float:
    """The shortest wall time of `runs` calls of `action`."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    """Print the grammar load time, then parse/validate/render times per app size."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queries", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    start = time.perf_counter()
    _parser()
    print(json.dumps({"bench": "grammar_load", "seconds": round(time.perf_counter() - start, 4)}), flush=True)
    for count in args.queries:
        text = make_app(count)
        app = parse(text)
        figures = {
            "parse": best_of(args.runs, lambda: parse(text)),
            "validate": best_of(args.runs, lambda: validate(app)),
            "render": best_of(args.runs, lambda: render(app)),
        }
        for name, seconds in figures.items():
            line = {"bench": name, "queries": count, "chars": len(text), "seconds": round(seconds, 4)}
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
