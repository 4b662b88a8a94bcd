"""Option helpers shared by the `sp-dagster` subcommands: `--conf`, loading a role's configuration, `-` for stdin.
Imported when the parser is built, so whatever is heavy is imported inside the helpers; which
deployment.yaml a command reads is config/locate.py's search order.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

from sp_dagster.config.locate import SEARCH_ORDER, STACK_SOURCE, ConfLocation, find_conf

if TYPE_CHECKING:
    from sp_dagster.config.model import Config

# The commands that reach the messaging layer as soon as they have their configuration: checked first, so
# a broker that is not there is one line within seconds (not librdkafka's retries until a 10 s timeout).
# `deploy` checks after the app (`cli/deploy.py`), so an app's own errors still come first.
MESSAGING_COMMANDS = ("produce", "consume")
REACH_TIMEOUT_S = 2.0


def add_conf_option(parser: argparse.ArgumentParser, role: str = "manager", what: str = "naming the control plane and broker") -> None:
    """Add `--conf FILE|DIR` to a command (default: the search order)."""
    parser.add_argument(
        "--conf", metavar="FILE|DIR", help=f"a {role} deployment.yaml {what}, or a conf directory (default: {SEARCH_ORDER}; see `sp-dagster config where`)"
    )


def load_role_config(args: argparse.Namespace, role: str = "manager", *, node: bool = False) -> Config:
    """The `role`'s configuration that `--conf` (or the search order) names; for a `node` of that role
    (`sp-dagster manager`, `worker`), loaded as that role with `--id` as its node id. A command's Kafka
    clients log to Python logging at debug (a node's keep librdkafka's own errors on stderr)."""
    from sp_dagster.config.loader import load_config

    location = find_conf(role, args.conf)
    if node:
        return load_config(location.path, role=role, node_id=args.id)
    config = quiet_kafka_clients(load_config(location.path))
    if getattr(args, "command", None) in MESSAGING_COMMANDS:
        require_messaging(config, location)
    return config


class _DebugLog:
    """A `logger` for librdkafka: its lines (errors included) go to Python logging at debug, shown with -v."""

    def __init__(self) -> None:
        self.target = logging.getLogger("sp_dagster.librdkafka")

    def log(self, level: int, message: str, *args: Any) -> None:
        """Log librdkafka's line at debug, whatever its level."""
        self.target.debug(message, *args)


def quiet_kafka_clients(config: Config) -> Config:
    """`config` with its Kafka clients logging through Python logging at debug, unless its kafkaProperties set `logger` or `log_level`."""
    import dataclasses

    properties: dict[str, Any] = dict(config.deployment.kafka_properties)
    if "logger" in properties or "log_level" in properties:
        return config
    properties["logger"] = _DebugLog()
    return dataclasses.replace(config, deployment=dataclasses.replace(config.deployment, kafka_properties=properties))


def require_messaging(config: Config, location: ConfLocation) -> None:
    """Raise BrokerUnavailable, one line saying what to do, when no server of `config`'s messaging layer accepts a connection."""
    import socket
    from urllib.parse import urlsplit

    from sp_dagster.errors import BrokerUnavailable

    messaging = config.messaging
    nats = messaging.kind == "nats"
    reasons, shown = [], [safe_address(server) for server in messaging.servers]
    for server in messaging.servers:
        try:
            address = urlsplit(server if "://" in server else f"//{server}")
            host, port = address.hostname or "localhost", address.port or (4222 if nats else 9092)
            socket.create_connection((host, port), REACH_TIMEOUT_S).close()
            return
        except (OSError, ValueError) as exc:
            reasons.append(getattr(exc, "strerror", None) or str(exc))
    what, command, setting = ("NATS server", "nats", "natsServerUrl") if nats else ("Kafka broker", "broker", "bootstrapURLs")
    if location.source.startswith(STACK_SOURCE):
        hint = f"the stack `sp-dagster up` started ({location.source.removeprefix(STACK_SOURCE + ', ')}) is not running: run `sp-dagster down`, then `sp-dagster up`"
    else:
        hint = (
            f"start the local stack with `sp-dagster up` (or the {what} alone with `sp-dagster {command}`), or set deployment.config.{setting} "
            f"in {location.path} (`sp-dagster config where` says why that file)"
        )
    raise BrokerUnavailable(f"cannot reach the {what} at {','.join(shown)} ({'; '.join(dict.fromkeys(reasons))}); {hint}")


def add_manager_options(parser: argparse.ArgumentParser) -> None:
    """Add `--manager URL` and `--user NAME`: go through the manager API instead of the control-plane database."""
    from sp_dagster.deploy.api_client import MANAGER_ENV, PASSWORD_ENV, USER_ENV

    parser.add_argument(
        "--manager",
        metavar="URL",
        help=f"go through this manager's API (https://host:port) instead of the database (default: ${MANAGER_ENV}, else deployment.config.api.url)",
    )
    parser.add_argument("--user", metavar="NAME", help=f"the API user (default: ${USER_ENV}); its password comes from ${PASSWORD_ENV} only")


def manager_client(args: argparse.Namespace, config: Config):
    """A ManagerClient when a manager URL is given (--manager, $SP_DAGSTER_MANAGER, deployment.config.api.url), else None."""
    from sp_dagster.deploy.api_client import PASSWORD_ENV, USER_ENV, client_from

    return client_from(
        config,
        getattr(args, "manager", None),
        getattr(args, "user", None),
        None,
        user_hint=f"pass --user NAME (or set ${USER_ENV}) and export {PASSWORD_ENV}",
        password_hint=f"export {PASSWORD_ENV} (never on the command line)",
    )


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


def safe_address(server: str) -> str:
    """A server address as it may be shown: without a user:password@ part."""
    scheme, found, rest = server.rpartition("://")
    return f"{scheme}{found}{rest.rpartition('@')[2]}"
