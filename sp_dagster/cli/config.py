"""`sp-dagster config ...`: check deployment.yaml files."""

from __future__ import annotations

import argparse
from pathlib import Path

from sp_dagster.config.locate import SEARCH_ORDER
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
    check.add_argument("--role", choices=("manager", "worker"), help="check as this role (default: from the file's name or directory, else its sections)")
    check.set_defaults(handler=check_files)
    reference = actions.add_parser("reference", help="print every configuration key", description="Print every key, its type, default and meaning (Markdown).")
    reference.set_defaults(handler=print_reference)
    where = actions.add_parser(
        "where",
        help="say which deployment.yaml each role reads",
        description="Print the manager's and the worker's deployment.yaml, which step of the search order found it "
        f"({SEARCH_ORDER}; $SP_DAGSTER_WORKER_CONF before $SP_DAGSTER_CONF for workers), and the messaging layer it names.",
    )
    where.add_argument("--conf", metavar="FILE|DIR", help="as the other commands' --conf")
    where.set_defaults(handler=print_where)


def print_reference(args: argparse.Namespace) -> int:
    """Print the configuration reference."""
    from sp_dagster.config.reference import reference_markdown

    print(reference_markdown())
    return 0


def print_where(args: argparse.Namespace) -> int:
    """Print each role's deployment.yaml, where it was found, the messaging layer it names and the manager API commands go through."""
    import os

    from sp_dagster.cli.options import safe_address
    from sp_dagster.config.loader import load_config
    from sp_dagster.config.locate import STACK_SOURCE, find_conf, stack_conf, stack_record
    from sp_dagster.deploy.api_client import MANAGER_ENV

    locations = {role: find_conf(role, args.conf) for role in ("manager", "worker")}
    for role, location in locations.items():
        print(f"{role:8} {location.describe()}")
    manager = locations["manager"]
    if manager.path.is_file():
        try:
            config = load_config(manager.path, role="manager")
            messaging = config.messaging
            print(f"{'':8} {messaging.kind} at {','.join(safe_address(server) for server in messaging.servers)}")
            if os.environ.get(MANAGER_ENV) or config.deployment.api.url:
                source = f"${MANAGER_ENV}" if os.environ.get(MANAGER_ENV) else "deployment.config.api.url"
                print(
                    f"{'':8} deploy, undeploy, status and apps go through the manager API at {os.environ.get(MANAGER_ENV) or config.deployment.api.url} (from {source})"
                )
        except ConfigError as exc:
            print(f"{'':8} does not load: {exc}")
    if stack_conf("manager") and not manager.source.startswith(STACK_SOURCE):
        print(f"note: {STACK_SOURCE} ({stack_record()}) is not used: {manager.source} comes first")
    return 0


def check_files(args: argparse.Namespace) -> int:
    """Print OK or the error for each file; 1 when any failed."""
    from sp_dagster.cli.options import safe_address
    from sp_dagster.config.loader import load_config
    from sp_dagster.config.tls import receiver_tls_files

    failed = 0
    for path in args.files:
        try:
            config = load_config(path, role=args.role or file_role(path))
            if config.role == "worker":
                receiver_tls_files(config)
        except ConfigError as exc:
            failed += 1
            print(f"FAIL {exc}")
        else:
            print(
                f"OK   {path} ({config.role} '{config.node_id}', {config.messaging.kind} at {','.join(map(safe_address, config.messaging.servers))}, control plane {config.control_plane.safe_url})"
            )
    return 1 if failed else 0


# Sections and deployment.config keys only one role's file has (WSO2's files and conf/ alike).
_WORKER_ONLY = ("state.persistence", "spark", "leaderRetryInterval", "resourceManagers", "isReceiverNode", "receiverUsers", "receiverTls")
_MANAGER_ONLY = ("cluster.config", "dagster", "minResourceCount")


def file_role(path: str) -> str | None:
    """The role a deployment.yaml is for: named by the file or its two parent directories, else told by its sections; None if unsure."""
    import re

    from sp_dagster.config.yamlsource import load_yaml

    for part in reversed(Path(path).parts[-3:]):
        words = set(re.split(r"[^a-z]+", Path(part).stem.lower()))
        if len(named := words & {"manager", "worker"}) == 1:
            return named.pop()
    try:
        document = load_yaml(path)
    except ConfigError:
        return None  # load_config reports it
    deployment = document.get("deployment.config")
    keys = set(document) | (set(deployment) if isinstance(deployment, dict) else set())
    worker, manager = keys.intersection(_WORKER_ONLY), keys.intersection(_MANAGER_ONLY)
    return "worker" if worker and not manager else "manager" if manager and not worker else None
