"""`sp-dagster config ...`: check deployment.yaml files."""

from __future__ import annotations

import argparse

from sp_dagster.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `config` command group."""
    parser = subparsers.add_parser("config", help="check deployment.yaml files", description="Work with deployment.yaml files.")
    actions = parser.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check",
        help="check deployment.yaml files",
        description="Load each file as a manager or worker would; print OK or the error. Exit 1 if any file is invalid.",
    )
    check.add_argument("files", nargs="+", metavar="FILE", help="deployment.yaml files")
    check.add_argument("--role", choices=("manager", "worker"), help="check as this role (default: from the file's directory)")
    check.set_defaults(handler=check_files)
    reference = actions.add_parser("reference", help="print every configuration key", description="Print every key, its type, default and meaning (Markdown).")
    reference.set_defaults(handler=print_reference)
    where = actions.add_parser(
        "where",
        help="say which deployment.yaml each role reads",
        description="Print the manager's and the worker's deployment.yaml and which step of the search order found it: "
        "--conf, $SP_DAGSTER_CONF ($SP_DAGSTER_WORKER_CONF for workers), ./conf/, $SP_DAGSTER_HOME/conf/, the packaged defaults.",
    )
    where.add_argument("--conf", metavar="FILE|DIR", help="as the other commands' --conf")
    where.set_defaults(handler=print_where)


def print_reference(args: argparse.Namespace) -> int:
    """Print the configuration reference."""
    from sp_dagster.config.reference import reference_markdown

    print(reference_markdown())
    return 0


def print_where(args: argparse.Namespace) -> int:
    """Print each role's deployment.yaml and where it was found."""
    from sp_dagster.config.locate import find_conf

    for role in ("manager", "worker"):
        print(f"{role:8} {find_conf(role, args.conf).describe()}")
    return 0


def check_files(args: argparse.Namespace) -> int:
    """Print OK or the error for each file; 1 when any failed."""
    from sp_dagster.config.loader import load_config

    failed = 0
    for path in args.files:
        try:
            config = load_config(path, role=args.role)
        except ConfigError as exc:
            failed += 1
            print(f"FAIL {exc}")
        else:
            print(
                f"OK   {path} ({config.role} '{config.node_id}', {config.messaging.kind} at {','.join(config.messaging.servers)}, control plane {config.control_plane.safe_url})"
            )
    return 1 if failed else 0
