"""`sp-dagster conformance` and `sp-dagster run`: the engine from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `conformance` and `run` commands."""
    conformance = subparsers.add_parser(
        "conformance",
        help="replay conformance cases through the engine",
        description="Replay each case of a conformance file (JSON lines: app, inputs, Siddhi's output) "
        "and compare. Prints PASS or FAIL with the differences per case and a final 'N passed, N failed' line; "
        "exit 1 if any case failed.",
    )
    conformance.add_argument("file", metavar="FILE.jsonl", help="a conformance case file")
    conformance.add_argument("--json", action="store_true", help="print one JSON object per case with the actual events")
    conformance.add_argument("--only", metavar="ID", help="run only the case with this id")
    conformance.set_defaults(handler=run_conformance)

    run = subparsers.add_parser(
        "run",
        help="replay events through an app in process",
        description="Send the events of a JSON-lines file ({\"stream\": \"S\", \"data\": [...] or {...}, "
        "\"timestamp\": ms}) through an app and print every event its output streams receive, one JSON line each.",
    )
    run.add_argument("app", metavar="APP.siddhi", help="the Siddhi app")
    run.add_argument("--input", required=True, metavar="EVENTS.jsonl", help="events to send ('-' for standard input)")
    run.set_defaults(handler=run_app)


def run_conformance(args: argparse.Namespace) -> int:
    """Replay a conformance file; 1 when any case failed."""
    from sp_dagster.engine.conformance import run_file, summary

    outcomes = []
    for outcome in run_file(args.file, args.only):
        outcomes.append(outcome)
        if args.json:
            print(json.dumps(outcome.to_json()), flush=True)
            continue
        print(f"{'PASS' if outcome.passed else 'FAIL'} {outcome.id}", flush=True)
        for line in ([outcome.error] if outcome.error else outcome.differences):
            for part in line.splitlines():
                print(f"     {part}")
    line = summary(outcomes)
    print(line, file=sys.stderr if args.json else sys.stdout)
    return 0 if all(o.passed for o in outcomes) else 1


def run_app(args: argparse.Namespace) -> int:
    """Replay an event file through an app, printing what its output streams receive."""
    from sp_dagster.engine.replay import replay_file

    text = Path(args.app).read_text(encoding="utf-8")
    source = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")
    try:
        replay_file(text, args.app, source, args.input, sys.stdout)
    finally:
        if source is not sys.stdin:
            source.close()
    return 0
