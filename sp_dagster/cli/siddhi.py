"""`sp-dagster validate FILE.siddhi...`: parse and validate SiddhiQL apps."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `validate` command."""
    parser = subparsers.add_parser(
        "validate",
        help="check SiddhiQL apps",
        description="Parse and validate each app; print OK, or every error with file:line:column. Exit 1 if any file is invalid.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help=".siddhi files")
    parser.set_defaults(handler=validate_files)


def validate_files(args: argparse.Namespace) -> int:
    """Print OK or the errors for each file; 1 when any is invalid."""
    from sp_dagster.siddhi.errors import SiddhiQLError
    from sp_dagster.siddhi.validate import load_file

    failed = 0
    for path in args.files:
        try:
            app = load_file(path)
        except OSError as exc:
            failed += 1
            print(f"{path}: cannot be read: {exc.strerror or exc}", file=sys.stderr)
        except SiddhiQLError as exc:
            failed += 1
            print(exc, file=sys.stderr)
        else:
            queries = sum(1 for _ in app.queries())
            print(f"OK   {path} ({len(app.definitions)} definitions, {queries} queries)")
    return 1 if failed else 0
