"""`sp-dagster validate FILE.siddhi...`: parse and validate SiddhiQL apps."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `validate` command."""
    parser = subparsers.add_parser(
        "validate",
        help="check SiddhiQL apps",
        description="Parse, validate and plan each app (the checks of `plan` and `deploy`); print OK, or every error with file:line:column. "
        "Exit 1 if any file is invalid.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help=".siddhi files")
    parser.set_defaults(handler=validate_files)


def validate_files(args: argparse.Namespace) -> int:
    """Print OK or the errors for each file (the checks `plan` and `deploy` make); 1 when any is invalid."""
    from sp_dagster.cli.topology import print_notes
    from sp_dagster.deploy.steps import load_app
    from sp_dagster.errors import SpDagsterError

    failed = 0
    for path in args.files:
        try:
            loaded = load_app(path)
        except SpDagsterError as exc:
            failed += 1
            print(exc, file=sys.stderr)
        else:
            queries = sum(1 for _ in loaded.app.queries())
            print(f"OK   {path} ({len(loaded.app.definitions)} definitions, {queries} queries)")
            print_notes(loaded)
    return 1 if failed else 0
