"""`sp-dagster manager` and `sp-dagster status`: run a manager node; show the cluster."""

from __future__ import annotations

import argparse

from sp_dagster.cli.options import add_conf_option, load_role_config


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `manager` and `status` commands."""
    manager = subparsers.add_parser(
        "manager",
        help="run a manager node (leader election, membership, placement)",
        description="Run a manager node until Ctrl-C or SIGTERM: take part in the leader election of its group and, "
        "while leader, watch the resource nodes and place every recorded deployment's instances on them.",
    )
    add_conf_option(manager, "manager", "for this manager")
    manager.add_argument("--id", metavar="ID", help="this manager's node id (default: wso2.carbon.id)")
    manager.add_argument("--journal", metavar="FILE", help="append a JSON line per leadership change and leader write (for audits)")
    manager.set_defaults(handler=run_manager)

    status = subparsers.add_parser(
        "status",
        help="show the leader, nodes, deployments and placements",
        description="Show the cluster as its control-plane database has it: the leader and its term, the managers, "
        "the resource nodes with their state and last heartbeat, and every deployment with its placements.",
    )
    add_conf_option(status, "manager", "naming the control plane")
    status.add_argument("--json", action="store_true", help="print JSON instead of text")
    status.set_defaults(handler=show_status)


def run_manager(args: argparse.Namespace) -> int:
    """Run a manager until SIGINT/SIGTERM."""
    from sp_dagster.cluster.manager import Manager, run_until_signalled

    run_until_signalled(Manager(load_role_config(args, "manager", node=True), journal=args.journal))
    return 0


def show_status(args: argparse.Namespace) -> int:
    """Print the cluster status (text or JSON)."""
    import json

    from sp_dagster.cluster.db import ControlPlane
    from sp_dagster.cluster.status import cluster_status, render_status

    config = load_role_config(args)
    with ControlPlane.from_config(config, migrate=False) as plane:
        status = cluster_status(plane)
    print(json.dumps(status, indent=2, sort_keys=True) if args.json else render_status(status), end="\n" if args.json else "")
    return 0
