"""`sp-dagster up` and `sp-dagster down`: the one-command local system."""

from __future__ import annotations

import argparse

from sp_dagster.cli.options import add_conf_option, say


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `up` and `down` commands."""
    up = subparsers.add_parser(
        "up",
        help="start the embedded broker, a manager, workers and the Dagster UI; deploy the sample app",
        description="Start everything on this machine in the background: the embedded broker, a manager and workers on the "
        "SQLite control plane the shipped confs name, and the Dagster UI; deploy the sample app in apps/ and feed it events. "
        "Prints where to look. Until `sp-dagster down` stops it all, every command run with the same $SP_DAGSTER_HOME and no --conf "
        "or $SP_DAGSTER_CONF reaches this stack (it reads the confs `up` wrote; `sp-dagster config where` says so).",
    )
    up.add_argument("--workers", type=int, default=2, metavar="N", help="how many workers (default 2)")
    up.add_argument(
        "--receivers",
        type=int,
        default=0,
        metavar="N",
        help="how many receiver nodes (isReceiverNode: true) to host the apps' HTTP receivers (default 0: workers host them)",
    )
    up.add_argument("--no-ui", action="store_true", help="do not start the Dagster UI")
    up.add_argument("--no-demo", action="store_true", help="no sample deployment and no event generator")
    up.add_argument("--port", type=int, metavar="PORT", help="the Dagster UI's port (default dagster.port, 3000)")
    up.add_argument(
        "--messaging",
        choices=("kafka", "nats"),
        default="kafka",
        help="the messaging layer: the embedded Kafka-protocol broker (default) or the embedded NATS server with JetStream",
    )
    up.add_argument("--broker-port", type=int, metavar="PORT", help="the embedded broker's port (default 9092, NATS 4222; a free one if taken)")
    add_conf_option(up, "manager", "for the manager (a directory: the workers' too)")
    up.add_argument("--worker-conf", metavar="FILE", help="the workers' deployment.yaml (default: --conf when a directory, else the search order)")
    up.add_argument("--timeout", type=float, default=300.0, metavar="S", help="seconds to wait for each stage (default 300)")
    up.set_defaults(handler=run_up)

    down = subparsers.add_parser(
        "down",
        help="stop everything `sp-dagster up` started",
        description="Stop, newest first, every process `sp-dagster up` started (recorded in $SP_DAGSTER_HOME/up.json), then every "
        "`sp-dagster manager` or `worker` started by hand under the same $SP_DAGSTER_HOME, and remove that record: "
        "commands then read their confs by the search order again.",
    )
    down.set_defaults(handler=run_down)


def run_up(args: argparse.Namespace) -> int:
    """Bring the system up."""
    import logging

    from sp_dagster.errors import ConfigError
    from sp_dagster.orchestration.demo import up

    if args.workers < 1:
        raise ConfigError("--workers must be at least 1")
    if args.receivers < 0:
        raise ConfigError("--receivers cannot be negative")
    if not getattr(args, "verbose", False):
        logging.getLogger("sp_dagster.messaging").setLevel(logging.WARNING)  # one line per topic is noise here
    up(
        workers=args.workers,
        ui=not args.no_ui,
        demo=not args.no_demo,
        port=args.port,
        broker_port=args.broker_port,
        conf=args.conf,
        worker_conf=args.worker_conf or _directory(args.conf),
        timeout=args.timeout,
        messaging=args.messaging,
        receivers=args.receivers,
        say=say,
    )
    return 0


def _directory(conf: str | None) -> str | None:
    """--conf when it names a conf directory (the workers read its worker/deployment.yaml)."""
    from pathlib import Path

    return conf if conf and Path(conf).expanduser().is_dir() else None


def run_down(args: argparse.Namespace) -> int:
    """Stop what `up` started."""
    from sp_dagster.orchestration.demo import down

    down(say=say)
    return 0
