"""`sp-dagster worker`: run a worker (resource) node."""

from __future__ import annotations

import argparse

from sp_dagster.cli.options import add_conf_option, load_role_config


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `worker` command."""
    parser = subparsers.add_parser(
        "worker",
        help="run a worker node (a Spark application running partial apps)",
        description="Run a worker until Ctrl-C or SIGTERM: register with the control plane, heartbeat, and run the "
        "partial-app instances the leader assigns to it as Spark streaming queries.",
    )
    add_conf_option(parser, "worker", "for this worker")
    parser.add_argument("--id", metavar="ID", help="this worker's node id (default: wso2.carbon.id)")
    parser.set_defaults(handler=run_worker)


def run_worker(args: argparse.Namespace) -> int:
    """Run a worker until SIGINT/SIGTERM."""
    from sp_dagster.orchestration.demo import registered_node
    from sp_dagster.subprocesses import on_stop_signal
    from sp_dagster.worker.node import Worker

    config = load_role_config(args, "worker", node=True)
    worker = Worker(config)
    on_stop_signal(worker.stop)
    print(
        f"worker {config.node_id} starting (control plane {config.control_plane.safe_url}, messaging {config.messaging.bootstrap_servers}); Ctrl-C to stop",
        flush=True,
    )
    with registered_node(config.node_id, "worker"):  # `sp-dagster down` stops it with the stack of this home
        worker.run()
    print(f"worker {config.node_id} stopped", flush=True)
    return 0
