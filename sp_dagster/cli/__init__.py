"""`sp-dagster`: one command-line entry point with a subcommand per task.
Each module of this package holds the subcommands of one layer it drives (`cli/deploy.py`:
`deploy`, `undeploy`, `produce`, ...) and exposes ``register(subparsers)``; this file only wires
them together, and heavy imports wait inside the handlers so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from sp_dagster.errors import SpDagsterError

# (module, ...) in the order they appear in `sp-dagster --help`.
COMMAND_MODULES = (
    "sp_dagster.cli.config",
    "sp_dagster.cli.embedded",
    "sp_dagster.cli.siddhi",
    "sp_dagster.cli.cluster",
    "sp_dagster.cli.topology",
    "sp_dagster.cli.engine",
    "sp_dagster.cli.deploy",
    "sp_dagster.cli.worker",
    "sp_dagster.cli.orchestration",
)


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="sp-dagster",
        description="Distributed SiddhiQL streaming apps on Kafka and Spark, orchestrated by Dagster.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; user-facing errors become one line on stderr and a non-zero exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # A pooled connection that fails its reset while the database is away is logged with its traceback;
        # whoever meets the outage reports it in one line (shown with -v all the same).
        logging.getLogger("sqlalchemy.pool").setLevel(logging.CRITICAL)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except SpDagsterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        if exc.filename is None:  # not about a file the user named: a real failure, keep its traceback
            raise
        print(f"error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
