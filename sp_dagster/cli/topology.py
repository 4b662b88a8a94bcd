"""`sp-dagster plan APP.siddhi`: show how a distributed app is split, as text, JSON or Mermaid."""

from __future__ import annotations

import argparse
import json
import sys

from sp_dagster.cli.options import add_conf_option, load_role_config
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
    add_conf_option(parser, what="whose deployment.config.maxParallelism gives groups running in parallel their room")
    parser.set_defaults(handler=plan_command)


def plan_command(args: argparse.Namespace) -> int:
    """Print the plan of one app; an invalid app prints its error (as JSON with --format json)."""
    from sp_dagster.deploy.steps import load_app, plan_app
    from sp_dagster.siddhi import SiddhiQLError
    from sp_dagster.topology import output

    try:
        loaded = load_app(args.app)
        topology = plan_app(loaded, load_role_config(args).deployment.max_parallelism)
    except SpDagsterError as exc:
        if args.format != "json":
            raise
        error = output.error_dict(exc) if isinstance(exc, SiddhiQLError) else {"error": {"line": 0, "column": 0, "message": str(exc)}}
        print(json.dumps(error, indent=2))
        return 1
    renderers = {"text": output.render_text, "json": output.render_json, "mermaid": output.render_mermaid}
    print(renderers[args.format](topology), end="" if args.format != "json" else "\n")
    print_notes(loaded)
    return 0


def print_notes(loaded) -> None:
    """One line on standard error per stream users cannot consume (a warning: the app still deploys)."""
    from sp_dagster.topology.analysis import unconsumed_note, unconsumed_streams

    for write in unconsumed_streams(loaded.app):
        print(f"{loaded.source}:{write.node.line}:{write.node.column}: note: {unconsumed_note(loaded.name, write.name)}", file=sys.stderr)
