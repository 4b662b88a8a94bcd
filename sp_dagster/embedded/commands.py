"""`sp-dagster broker`: run the embedded Kafka-protocol broker in the foreground."""

from __future__ import annotations

import argparse
import signal
import threading

from sp_dagster.embedded.broker import DEFAULT_PORT


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `broker` command."""
    parser = subparsers.add_parser(
        "broker",
        help="run the embedded Kafka-protocol broker (tansu)",
        description="Run a local Kafka-protocol broker (tansu, in memory) until Ctrl-C. "
        "The shipped conf/ files point at localhost:9092.",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--storage",
        default="memory://tansu/",
        help="tansu storage engine: memory://tansu/ (default; lost on stop) or postgres://user:pass@host/db",
    )
    parser.set_defaults(handler=run_broker)


def run_broker(args: argparse.Namespace) -> int:
    """Start the broker, print its address, and wait for Ctrl-C or SIGTERM."""
    from sp_dagster.embedded.broker import EmbeddedBroker

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    with EmbeddedBroker(port=args.port, host=args.host, storage=args.storage) as broker:
        print(f"broker ready at {broker.bootstrap_servers} (bootstrapURLs: {broker.bootstrap_servers}); Ctrl-C to stop", flush=True)
        while not stop.wait(0.5):
            if broker.process is None or broker.process.poll() is not None:
                print("the broker stopped unexpectedly", flush=True)
                return 1
    print("broker stopped", flush=True)
    return 0
