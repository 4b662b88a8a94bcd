"""`sp-dagster plan APP.siddhi`: show how a distributed app is split, as text, JSON or Mermaid."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sp_dagster.errors import SpDagsterError

FORMATS = ("text", "json", "mermaid")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `plan` command."""
    parser = subparsers.add_parser(
        "plan",
        help="split a distributed app into execution groups, topics and partial apps",
        description="Parse a distributed Siddhi app and print its plan: execution groups in data-flow order, "
        "their subscriptions and publications, the topics, and every partial app. Exit 1 when the app is invalid.",
    )
    parser.add_argument("app", metavar="APP.siddhi", help="the distributed Siddhi app")
    parser.add_argument("--format", choices=FORMATS, default="text", help="output format (default: text)")
    parser.set_defaults(handler=plan_command)


def plan_command(args: argparse.Namespace) -> int:
    """Print the plan of one app; an invalid app prints its error (as JSON with --format json)."""
    from sp_dagster.siddhi import SiddhiQLError, parse
    from sp_dagster.topology import output, plan

    path = Path(args.app)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        if args.format == "json":
            print(json.dumps({"error": {"line": 0, "column": 0, "message": f"cannot read {path}: {exc.strerror}"}}))
            return 1
        raise SpDagsterError(f"cannot read {path}: {exc.strerror}") from None
    try:
        topology = plan(parse(text, source=str(path)), name=path.stem)
    except SiddhiQLError as exc:
        if args.format == "json":
            print(json.dumps(output.error_dict(exc), indent=2))
            return 1
        raise exc.attach(text, str(path)) from None
    renderers = {"text": output.render_text, "json": output.render_json, "mermaid": output.render_mermaid}
    print(renderers[args.format](topology), end="" if args.format != "json" else "\n")
    return 0
