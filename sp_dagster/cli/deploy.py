"""`sp-dagster deploy`, `scale`, `undeploy`, `produce` and `consume`."""

from __future__ import annotations

import argparse
import sys

from sp_dagster.cli.options import add_conf_option, add_manager_options, load_role_config, manager_client, require_messaging
from sp_dagster.config.locate import find_conf


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the deploy-path commands."""
    deploy = subparsers.add_parser(
        "deploy",
        help="deploy a distributed SiddhiQL app",
        description="Parse and plan an app, create its topics, record the deployment and wait until every "
        "partial-app instance runs (or say which could not be placed and why).",
    )
    deploy.add_argument("app", metavar="APP.siddhi")
    add_conf_option(deploy)
    deploy.add_argument("--no-wait", action="store_true", help="record the deployment and return at once")
    deploy.add_argument("--fresh", action="store_true", help="let stateful groups whose parallelism changes start empty (otherwise refused)")
    deploy.add_argument("--timeout", type=float, default=180.0, metavar="S", help="seconds to wait for every instance to run (default 180)")
    add_manager_options(deploy)
    deploy.set_defaults(handler=run_deploy)

    undeploy = subparsers.add_parser(
        "undeploy",
        help="stop and remove a deployed app",
        description="Remove a deployment; its workers stop its instances. Topics and state are kept unless --delete-topics / --drop-state.",
    )
    undeploy.add_argument("name", metavar="NAME", help="the app's name (@App:name)")
    add_conf_option(undeploy)
    undeploy.add_argument("--delete-topics", action="store_true", help="also delete the app's topics and the events in them")
    undeploy.add_argument(
        "--drop-state", action="store_true", help="also drop its instances' saved state (revisions and checkpoints), once its workers stopped them"
    )
    add_manager_options(undeploy)
    undeploy.set_defaults(handler=run_undeploy)

    scale = subparsers.add_parser(
        "scale",
        help="run one execution group of a deployed app at a new parallelism",
        description="Deploy the running app again with GROUP at N instances; keyed state moves with its keys. Within the "
        "group's @dist(maxParallel) no topic changes. The app's file keeps its own parallel, which its next deploy applies.",
    )
    scale.add_argument("name", metavar="APP", help="the app's name (@App:name)")
    scale.add_argument("group", metavar="GROUP", help="the execution group (@dist(execGroup))")
    scale.add_argument("parallel", metavar="N", type=int, help="how many instances it runs")
    add_conf_option(scale)
    scale.add_argument("--no-wait", action="store_true", help="record the change and return at once")
    scale.add_argument("--timeout", type=float, default=180.0, metavar="S", help="seconds to wait for every instance to run (default 180)")
    add_manager_options(scale)
    scale.set_defaults(handler=run_scale)

    produce = subparsers.add_parser(
        "produce",
        help="send JSON-line events to a stream of a deployed app",
        description='Read events from standard input, one JSON line each ({"data": [...], "timestamp": ms}, or the '
        '`sp-dagster run` form with "stream"), and publish them to the topic behind APP:STREAM.',
    )
    produce.add_argument("target", metavar="APP:STREAM")
    add_conf_option(produce)
    produce.add_argument("--key", metavar="ATTR", help="route by this attribute (keeps each key's events in order)")
    produce.set_defaults(handler=run_produce)

    consume = subparsers.add_parser(
        "consume",
        help="print the events of a stream of a deployed app",
        description="Print the events on the topic behind APP:STREAM as JSON lines (the `sp-dagster run` form).",
    )
    consume.add_argument("target", metavar="APP:STREAM")
    add_conf_option(consume)
    consume.add_argument("--from-beginning", action="store_true", help="start at the oldest retained event (default: only new events)")
    consume.add_argument("--count", type=int, metavar="N", help="stop after N events")
    consume.add_argument("--timeout", type=float, metavar="S", help="stop when no event arrived for S seconds")
    consume.set_defaults(handler=run_consume)


def _context(args):
    from sp_dagster.cluster.db import ControlPlane
    from sp_dagster.messaging import transport_for

    config = load_role_config(args)
    return config, ControlPlane.from_config(config), transport_for(config.messaging)


def _stream_target(args, *, writing: bool):
    """(stream, StreamTopic, transport) for the APP:STREAM of a produce or consume command."""
    from sp_dagster.deploy.streams import parse_target, stream_topic

    app, stream = parse_target(args.target)
    _config, plane, transport = _context(args)
    try:
        return stream, stream_topic(plane, app, stream, writing=writing), transport
    finally:
        plane.close()


def run_deploy(args: argparse.Namespace) -> int:
    """Deploy an app and report where its instances run."""
    from sp_dagster.deploy.errors import DeployError
    from sp_dagster.deploy.steps import deploy, load_app

    config = load_role_config(args)
    client = manager_client(args, config)
    if client is not None:  # the manager runs the same checks (deploy.steps.load_app) and the deploy
        from sp_dagster.siddhi.validate import read_text

        try:
            text = read_text(args.app)
        except OSError as exc:
            raise DeployError(f"{args.app}: cannot be read: {exc.strerror}") from None
        print("\n".join(client.deploy(text, args.app, wait=None if args.no_wait else args.timeout, fresh=args.fresh)["lines"]))
        _refresh_dagster(config)
        return 0
    loaded = load_app(args.app)  # the app's own errors first, then the configuration's and the broker's
    require_messaging(config, find_conf("manager", args.conf))
    result = deploy(loaded, config, wait=not args.no_wait, timeout=args.timeout, progress=_progress, fresh=args.fresh)
    print("\n".join(result.summary()))
    _refresh_dagster(config)
    return 0


def _progress(state) -> None:
    running = sum(1 for i in state.instances if i.status == "running")
    waiting = f" - {state.waiting_reason}" if state.waiting_reason else ""
    print(f"  {state.app}: {running}/{len(state.instances)} instances running{waiting}", flush=True)


def run_scale(args: argparse.Namespace) -> int:
    """Run one group of a deployed app at a new parallelism."""
    from sp_dagster.deploy.scaling import scale

    config = load_role_config(args)
    client = manager_client(args, config)
    if client is not None:
        lines = client.scale(args.name, args.group, args.parallel, wait=None if args.no_wait else args.timeout)["lines"]
    else:
        require_messaging(config, find_conf("manager", args.conf))
        lines = scale(config, args.name, args.group, args.parallel, wait=not args.no_wait, timeout=args.timeout, progress=_progress).summary()
    print("\n".join(lines))
    _refresh_dagster(config)
    return 0


def _refresh_dagster(config) -> None:
    """Have a Dagster UI at dagster.host/port show the change at once (nothing when no webserver answers there)."""
    from sp_dagster.orchestration.processes import refresh_ui

    said = refresh_ui(config.dagster.host, config.dagster.port)
    if said is not None:
        print(f"Dagster: {said}", flush=True)


def run_undeploy(args: argparse.Namespace) -> int:
    """Remove a deployment."""
    from sp_dagster.cluster.db import ControlPlane
    from sp_dagster.deploy.state import remove_app

    config = load_role_config(args)
    client = manager_client(args, config)
    if client is not None:
        lines = client.undeploy(args.name, delete_topics=args.delete_topics, drop_state=args.drop_state)["lines"]
    else:
        with ControlPlane.from_config(config) as plane:
            lines = remove_app(plane, config, args.name, delete_topics=args.delete_topics, drop=args.drop_state)
    print("\n".join(lines))
    _refresh_dagster(config)
    return 0


def run_produce(args: argparse.Namespace) -> int:
    """Publish standard input's event lines to a stream's topic."""
    from sp_dagster.errors import EventDecodeError, SpDagsterError
    from sp_dagster.messaging import RoundRobin, codec_for, strategy_for
    from sp_dagster.messaging.errors import MessageTooLarge
    from sp_dagster.messaging.eventlines import decode_event_line

    stream, target, transport = _stream_target(args, writing=True)
    names = [a.name for a in target.attributes]
    strategy = strategy_for("partitioned", names, args.key) if args.key else RoundRobin()
    publisher = transport.publisher(target.topic, codec_for(target.codec, target.attributes), strategy)
    sent = 0
    for number, line in enumerate(sys.stdin, 1):
        if not line.strip():
            continue
        try:
            name, row, stamp = decode_event_line(line, lambda s: target.attributes if s == stream else _wrong_stream(s, stream), stream)
            publisher.send([row], [stamp])
        except (EventDecodeError, MessageTooLarge) as exc:
            publisher.flush()  # the events before the line are sent, as the message says
            raise SpDagsterError(
                f"<stdin>:{number}: {exc} (this line is {len(line.encode())} bytes; nothing from it on was sent, "
                f"{'the 1 event before it was' if sent == 1 else f'the {sent} events before it were'}: resume from line {number})"
            ) from None
        sent += 1
    publisher.flush()
    print(f"sent {sent} event{'' if sent == 1 else 's'} to {target.topic}", file=sys.stderr)
    return 0


def _wrong_stream(given: str, expected: str):
    from sp_dagster.errors import EventDecodeError

    raise EventDecodeError(f"this producer writes stream '{expected}', not '{given}'")


def run_consume(args: argparse.Namespace) -> int:
    """Print a stream's events as JSON lines."""
    import time

    from sp_dagster.messaging import EARLIEST, LATEST, codec_for
    from sp_dagster.messaging.eventlines import encode_event_line

    stream, target, transport = _stream_target(args, writing=False)
    info = transport.require_topic(target.topic)
    start = EARLIEST if args.from_beginning else LATEST
    reader = transport.reader(target.topic, {p: start for p in range(info.partitions)}, codec_for(target.codec, target.attributes))
    printed, last = 0, time.monotonic()
    try:
        while args.count is None or printed < args.count:
            batch = reader.poll(timeout=0.5)
            for event in batch.events:
                print(encode_event_line(stream, event.row, event.timestamp, [a.type for a in target.attributes]), flush=True)
                printed += 1
                last = time.monotonic()
                if args.count is not None and printed >= args.count:
                    break
            for reject in batch.rejects:
                print(f"skipped {target.topic}[{reject.partition}]@{reject.offset}: {reject.reason}", file=sys.stderr)
            if args.timeout is not None and time.monotonic() - last > args.timeout:
                break
    except KeyboardInterrupt:
        pass
    finally:
        reader.close()
    return 0
