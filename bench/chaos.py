"""Chaos for longer runs: a steady stream through a two-group stateful app while workers die, pause and the leader dies.

Run: python bench/chaos.py [--minutes N] [--rate EVENTS_PER_S] [--seed S] [--faults K,K,...] [--bootstrap HOST:PORT]
Prints one JSON line per fault (its kind, target, longest output gap after it) and one with
the totals (events in, outputs, expected, lost, duplicated, exact per key). Without
--bootstrap it starts an embedded broker of its own. The faults cycle through --faults
(default worker-kill, worker-pause (SIGSTOP past the heartbeat window), leader-kill), each
2-6 s after every key's outputs flow again, for about N minutes (sp_dagster.embedded.chaos). broker-pause and broker-restart
need the broker this bench starts (no --bootstrap); for broker-restart it keeps its data in an
S3 server of its own (sp_dagster.embedded.s3); db-outage starts a PostgreSQL server of
its own for the cluster, as the chaos tests do.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
import tempfile
from pathlib import Path

from sp_dagster.embedded import EmbeddedBroker
from sp_dagster.embedded.chaos import DURABLE_FAULTS, FAULTS, SERVER_FAULTS, ChaosRun
from sp_dagster.embedded.s3 import EmbeddedS3

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "tests" / "worker" / "apps" / "trades.siddhi"
SECONDS_PER_FAULT = 15  # the recovery from the one before, the settle time and the fault itself, on average


def main() -> None:
    """Run the chaos for --minutes and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--rate", type=int, default=200, help="events per second")
    parser.add_argument("--seed", type=int, default=1)
    known = FAULTS + SERVER_FAULTS + DURABLE_FAULTS
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, from {', '.join(known)}")
    parser.add_argument("--bootstrap", help="a Kafka broker to use (default: an embedded one)")
    args = parser.parse_args()
    kinds = tuple(args.faults.split(","))
    if unknown := set(kinds) - set(known):
        parser.error(f"unknown fault(s) {', '.join(sorted(unknown))}; choose from {', '.join(known)}")
    if args.bootstrap and {"broker-pause", *DURABLE_FAULTS} & set(kinds):
        parser.error("broker-pause and broker-restart need the broker this bench starts; leave out --bootstrap")
    count = max(len(kinds), int(args.minutes * 60 / SECONDS_PER_FAULT))
    faults = list(itertools.islice(itertools.cycle(kinds), count))
    home = Path(tempfile.mkdtemp(prefix="sp-dagster-chaos-"))
    sys.path.insert(0, str(ROOT))  # the servers the tests start (tests/fixtures)
    with contextlib.ExitStack() as stack:
        handles: dict = {}
        if "db-outage" in kinds:
            from tests.fixtures.databases import start_server

            database = start_server("postgresql")
            stack.callback(database.remove)
            handles.update(database=database, database_url=database.create_database())
        broker = None
        if not args.bootstrap:
            if set(DURABLE_FAULTS) & set(kinds):
                broker = stack.enter_context(EmbeddedS3(log_path=home / "s3.log")).broker(log_path=home / "broker.log")
            else:
                broker = EmbeddedBroker(log_path=home / "broker.log")
            handles["broker"] = broker.start()
            stack.callback(broker.stop)
        run = ChaosRun(home, args.bootstrap or broker.bootstrap_servers, APP.read_text().replace("Trades", "TradesChaos"), rate=args.rate, **handles)
        report = run.run(faults, seed=args.seed)
        for line in report.lines():
            print(json.dumps({"bench": "chaos", "minutes": args.minutes, "rate": args.rate, **line}), flush=True)


if __name__ == "__main__":
    main()
