"""`sp-dagster broker` and `sp-dagster nats`: run the embedded Kafka-protocol broker or NATS server in the foreground."""

from __future__ import annotations

import argparse
import threading

from sp_dagster.embedded.broker import DEFAULT_PORT
from sp_dagster.embedded.nats_server import DEFAULT_PORT as NATS_PORT
from sp_dagster.subprocesses import on_stop_signal


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `broker` and `nats` commands."""
    parser = subparsers.add_parser(
        "broker",
        help="run the embedded Kafka-protocol broker (tansu)",
        description="Run a local Kafka-protocol broker (tansu, in memory) until Ctrl-C. The shipped conf/ files point at localhost:9092.",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    parser.add_argument(
        "--advertised-host",
        metavar="ADDRESS",
        help="address clients and workers reach the broker at, as it tells them (default: --host; needed with 0.0.0.0)",
    )
    parser.add_argument(
        "--storage",
        default="memory://tansu/",
        help="tansu storage engine: memory://tansu/ (default; lost on stop) or postgres://user:pass@host/db",
    )
    parser.set_defaults(handler=run_broker)

    nats = subparsers.add_parser(
        "nats",
        help="run the embedded NATS server (JetStream on)",
        description="Run a local nats-server with JetStream on until Ctrl-C, keeping its streams under $SP_DAGSTER_HOME/nats. "
        "Point deployment.config.natsServerUrl at it (with a clusterId).",
    )
    nats.add_argument("--port", type=int, default=NATS_PORT, help=f"port to listen on (default {NATS_PORT})")
    nats.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    nats.add_argument("--store-dir", metavar="DIR", help="where JetStream keeps its data (default $SP_DAGSTER_HOME/nats)")
    nats.set_defaults(handler=run_nats)


def run_broker(args: argparse.Namespace) -> int:
    """Start the broker, print its address, and wait for Ctrl-C or SIGTERM."""
    from sp_dagster.embedded.broker import EmbeddedBroker

    broker = EmbeddedBroker(port=args.port, host=args.host, storage=args.storage, advertised_host=args.advertised_host)
    return _serve(broker, "broker", lambda: f"{broker.bootstrap_servers} (bootstrapURLs: {broker.bootstrap_servers})")


def run_nats(args: argparse.Namespace) -> int:
    """Start the NATS server, print its address, and wait for Ctrl-C or SIGTERM."""
    from sp_dagster.embedded.nats_server import EmbeddedNatsServer

    server = EmbeddedNatsServer(port=args.port, host=args.host, store_dir=args.store_dir)
    return _serve(server, "NATS server", lambda: f"{server.url} (natsServerUrl: {server.url}; JetStream data in {server.store_dir})")


def _serve(server, name: str, where) -> int:
    """Run an embedded server in the foreground until Ctrl-C or SIGTERM."""
    stop = threading.Event()
    on_stop_signal(stop.set)
    with server:
        print(f"{name} ready at {where()}; Ctrl-C to stop", flush=True)
        while not stop.wait(0.5):
            if server.process is None or server.process.poll() is not None:
                print(f"the {name} stopped unexpectedly", flush=True)
                return 1
    print(f"{name} stopped", flush=True)
    return 0
