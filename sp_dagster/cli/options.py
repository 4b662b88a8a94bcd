"""Option helpers shared by the `sp-dagster` subcommands: `--conf`, loading a role's configuration, `-` for stdin.

Imported when the parser is built, so it stays light: whatever is heavy is imported inside the helpers.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

from sp_dagster.config.locate import SEARCH_ORDER, conf_path

if TYPE_CHECKING:
    from sp_dagster.config.model import Config


def add_conf_option(parser: argparse.ArgumentParser, role: str = "manager", what: str = "naming the control plane and broker") -> None:
    """Add `--conf FILE|DIR` to a command (default: the search order)."""
    parser.add_argument(
        "--conf", metavar="FILE|DIR", help=f"a {role} deployment.yaml {what}, or a conf directory (default: {SEARCH_ORDER}; see `sp-dagster config where`)"
    )


def load_role_config(args: argparse.Namespace, role: str = "manager", *, node: bool = False) -> Config:
    """The `role`'s configuration that `--conf` (or the search order) names; for a `node` of that role
    (`sp-dagster manager`, `worker`), loaded as that role with `--id` as its node id."""
    from sp_dagster.config.loader import load_config

    path = conf_path(role, args.conf)
    return load_config(path, role=role, node_id=args.id) if node else load_config(path)


@contextlib.contextmanager
def open_input(name: str) -> Iterator[IO[str]]:
    """The text file `name`, or standard input for '-'; closed afterwards (standard input is left open)."""
    if name == "-":
        yield sys.stdin
        return
    with open(name, encoding="utf-8") as source:
        yield source


def say(line: str) -> None:
    """Print one progress line at once (the commands that run for long flush every line)."""
    print(line, flush=True)
