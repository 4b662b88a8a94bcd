"""Chaos for longer runs: a steady stream through a two-group stateful app while workers die, pause and the leader dies.

Run: python bench/chaos.py [--minutes N] [--rate EVENTS_PER_S] [--seed S] [--bootstrap HOST:PORT]
Prints one JSON line per fault (its kind, target, longest output gap after it) and one with
the totals (events in, outputs, expected, lost, duplicated, exact per key). Without
--bootstrap it starts an embedded broker of its own. The faults cycle through
worker-kill, worker-pause (SIGSTOP past the heartbeat window), leader-kill, one every
8-15 s, for about N minutes (sp_dagster.embedded.chaos).
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
from pathlib import Path

from sp_dagster.embedded import EmbeddedBroker
from sp_dagster.embedded.chaos import FAULTS, ChaosRun

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "tests" / "worker" / "apps" / "trades.siddhi"
SECONDS_PER_FAULT = 20  # the settle time before it, and the fault itself, on average


def main() -> None:
    """Run the chaos for --minutes and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--rate", type=int, default=200, help="events per second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bootstrap", help="a Kafka broker to use (default: an embedded one)")
    args = parser.parse_args()
    count = max(len(FAULTS), int(args.minutes * 60 / SECONDS_PER_FAULT))
    faults = list(itertools.islice(itertools.cycle(FAULTS), count))
    home = Path(tempfile.mkdtemp(prefix="sp-dagster-chaos-"))
    broker = None if args.bootstrap else EmbeddedBroker(log_path=home / "broker.log").start()
    try:
        run = ChaosRun(home, args.bootstrap or broker.bootstrap_servers, APP.read_text().replace("Trades", "TradesChaos"), rate=args.rate)
        report = run.run(faults, seed=args.seed)
        for line in report.lines():
            print(json.dumps({"bench": "chaos", "minutes": args.minutes, "rate": args.rate, **line}), flush=True)
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
