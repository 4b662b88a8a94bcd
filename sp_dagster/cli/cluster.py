"""`sp-dagster manager`, `status` and `advise`: run a manager node; show the cluster and the parallelism its load advises."""

from __future__ import annotations

import argparse

from sp_dagster.cli.options import add_conf_option, add_manager_options, load_role_config, manager_client


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `manager`, `status` and `advise` commands."""
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
    add_manager_options(status)
    status.set_defaults(handler=show_status)

    apps = subparsers.add_parser(
        "apps",
        help="list the deployed apps and their plans",
        description="List every deployed app with its status and execution groups (--json: with its whole plan, SiddhiQL secrets masked).",
    )
    add_conf_option(apps, "manager", "naming the control plane")
    apps.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_manager_options(apps)
    apps.set_defaults(handler=show_apps)

    advise = subparsers.add_parser(
        "advise",
        help="show the parallelism each execution group's load advises",
        description="Show, per execution group of each deployed app, its parallelism, maximum and the parallelism its load "
        "advises (deployment.config.autoscaling), with the reason and the latest load the leader sampled: arrival and "
        "processed events/s, the busiest instance's busy fraction and the lag.",
    )
    advise.add_argument("app", nargs="?", metavar="APP", help="only this app (default: every deployed app)")
    add_conf_option(advise, "manager", "naming the control plane and the autoscaling settings")
    advise.add_argument("--json", action="store_true", help="print JSON instead of text")
    advise.set_defaults(handler=show_advice)


def run_manager(args: argparse.Namespace) -> int:
    """Run a manager until SIGINT/SIGTERM."""
    from sp_dagster.cluster.manager import Manager, run_until_signalled
    from sp_dagster.orchestration.demo import registered_node

    config = load_role_config(args, "manager", node=True)
    if config.deployment.api.enabled:
        from sp_dagster.deploy.api import check_settings

        check_settings(config)  # before the manager joins its group: a refused API is one line and no leadership taken
    made: list = []  # the transport, made by the first load sample that reads topics (the manager starts without it)

    def topic_ends(topic: str) -> dict[int, int]:
        if not made:
            from sp_dagster.messaging import transport_for

            made.append(transport_for(config.messaging))
        return made[0].end_offsets(topic)

    manager = Manager(config, journal=args.journal, topic_ends=topic_ends)
    api = None
    try:
        if config.deployment.api.enabled:
            from sp_dagster.cluster.election import leader_address
            from sp_dagster.deploy.api import serve_api

            api = serve_api(
                config,
                manager.plane,
                leading=lambda: manager.elector.leadership is not None,
                leader_address=lambda: leader_address(manager.plane, manager.group_id),
            )
        with registered_node(config.node_id, "manager"):  # `sp-dagster down` stops it with the stack of this home
            run_until_signalled(manager)
    finally:
        if api is not None:
            api.stop()
        manager.plane.close()  # closed by the run already; here when the API could not start
        for transport in made:
            transport.close()
    return 0


def _show(value, as_json: bool, render, *, sort_keys: bool = True) -> int:
    """Print a command's result as JSON (indented) or as its text rendering (which ends its own lines)."""
    import json

    print(json.dumps(value, indent=2, sort_keys=sort_keys) if as_json else render(value), end="\n" if as_json else "")
    return 0


def show_status(args: argparse.Namespace) -> int:
    """Print the cluster status (text or JSON)."""
    from sp_dagster.cluster.db import ControlPlane
    from sp_dagster.cluster.status import cluster_status, render_status

    config = load_role_config(args)
    client = manager_client(args, config)
    if client is not None:
        status = client.status()
    else:
        with ControlPlane.from_config(config, migrate=False) as plane:
            status = cluster_status(plane)
    return _show(status, args.json, render_status)


def show_apps(args: argparse.Namespace) -> int:
    """Print the deployed apps and their execution groups (text or JSON)."""
    from sp_dagster.cluster.db import ControlPlane
    from sp_dagster.cluster.status import deployed_apps, render_apps

    config = load_role_config(args)
    client = manager_client(args, config)
    if client is not None:
        apps = client.apps()
    else:
        with ControlPlane.from_config(config, migrate=False) as plane:
            apps = deployed_apps(plane)
    return _show(apps, args.json, render_apps)


def show_advice(args: argparse.Namespace) -> int:
    """Print each group's advised parallelism (text or JSON)."""
    from sp_dagster.cluster.advising import group_advice, render_advice
    from sp_dagster.cluster.db import ControlPlane

    config = load_role_config(args)
    with ControlPlane.from_config(config, migrate=False) as plane:
        advice = group_advice(plane, config.deployment.autoscaling, args.app)
    return _show(advice, args.json, render_advice, sort_keys=False)
