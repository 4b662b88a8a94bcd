"""`sp-dagster conformance`, `sp-dagster run` and `sp-dagster query`: the engine from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sp_dagster.cli.options import add_conf_option, load_role_config, open_input
from sp_dagster.errors import SpDagsterError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `conformance` and `run` commands."""
    conformance = subparsers.add_parser(
        "conformance",
        help="replay conformance cases through the engine",
        description="Replay each case of a conformance file (JSON lines: app, inputs, Siddhi's output) "
        "and compare. Prints PASS or FAIL with the differences per case and a final 'N passed, N failed' line; "
        "exit 1 if any case failed.",
    )
    conformance.add_argument("file", metavar="FILE.jsonl", help="a conformance case file")
    conformance.add_argument("--json", action="store_true", help="print one JSON object per case with the actual events")
    conformance.add_argument("--only", metavar="ID", help="run only the case with this id")
    conformance.set_defaults(handler=run_conformance)

    run = subparsers.add_parser(
        "run",
        help="replay events through an app in process",
        description='Send the events of a JSON-lines file ({"stream": "S", "data": [...] or {...}, '
        '"timestamp": ms}) through an app and print every event its output streams receive, one JSON line each.',
    )
    run.add_argument("app", metavar="APP.siddhi", help="the Siddhi app")
    run.add_argument("--input", required=True, metavar="EVENTS.jsonl", help="events to send ('-' for standard input)")
    run.add_argument("--conf", metavar="FILE", help="a deployment.yaml whose datasources @store(datasource='NAME') refers to")
    run.set_defaults(handler=run_app)

    query = subparsers.add_parser(
        "query",
        help="run an on-demand query against an app's tables",
        description="Build an app's runtime and run one on-demand query against its tables: "
        "'from T [on cond] select ... [group by/having/order by/limit]' prints the rows found; "
        "'delete T on ...', 'update T set ... on ...' and 'select ... insert into T' change the table. "
        "Tables with @store(type='rdbms') are read from (and changed in) their database; in-memory "
        "tables start empty, or hold what --events sends first. Aggregations answer "
        "'from A [on cond] within <start>, <end> | within '2017-06-** **:**:**' per 'hours' select ...' "
        "from their tables (and what --events sent); the deployment.yaml (--conf, else the search order "
        "`sp-dagster config where` shows) gives the datasources, shard id and partitionById. "
        "APP may name a deployed app instead of a file: its recorded SiddhiQL is read from that file's control plane, "
        "and a query reads the stores its workers write (an aggregation with @dist(parallel='N') "
        "merges its N shards).",
    )
    query.add_argument("app", metavar="APP", help="the Siddhi app's file, or the name of an app deployed on the control plane of the deployment.yaml")
    query.add_argument("query", metavar="QUERY", help='the on-demand query, e.g. "from StockTable on price > 10 select symbol, price"')
    query.add_argument("--events", metavar="EVENTS.jsonl", help="events to send before the query, as for `run` ('-' for standard input)")
    query.add_argument("--json", action="store_true", help="print one JSON object per row, keyed by attribute name")
    add_conf_option(query, "manager", "naming the control plane of deployed apps and the datasources @store(datasource='NAME') refers to")
    query.set_defaults(handler=run_query)


def run_conformance(args: argparse.Namespace) -> int:
    """Replay a conformance file; 1 when any case failed."""
    from sp_dagster.engine.conformance import run_file, summary

    outcomes = []
    for outcome in run_file(args.file, args.only):
        outcomes.append(outcome)
        if args.json:
            print(json.dumps(outcome.to_json()), flush=True)
            continue
        print(f"{'PASS' if outcome.passed else 'FAIL'} {outcome.id}", flush=True)
        for line in [outcome.error] if outcome.error else outcome.differences:
            for part in line.splitlines():
                print(f"     {part}")
    line = summary(outcomes)
    print(line, file=sys.stderr if args.json else sys.stdout)
    return 0 if all(o.passed for o in outcomes) else 1


def run_app(args: argparse.Namespace) -> int:
    """Replay an event file through an app, printing what its output streams receive."""
    from sp_dagster.engine.replay import replay_file
    from sp_dagster.messaging import eventlines

    text = Path(args.app).read_text(encoding="utf-8")
    with open_input(args.input) as source:
        replay_file(text, args.app, source, args.input, sys.stdout, eventlines, _datasources(args.conf))
    return 0


def _datasources(conf: str | None) -> dict | None:
    if conf is None:
        return None
    from sp_dagster.config.loader import load_config

    return load_config(conf).datasources


def run_query(args: argparse.Namespace) -> int:
    """Run one on-demand query against an app's tables and print the rows it returns."""
    from sp_dagster.engine.ondemand import run_on_demand
    from sp_dagster.engine.replay import send_lines
    from sp_dagster.messaging import eventlines

    config = load_role_config(args)
    text, deployed = _app_text(args.app, config)
    if deployed and args.events:
        raise SpDagsterError(f"--events would write into the stores of the deployed app {args.app}; produce them to its topics instead")
    runtime = _query_runtime(text, args.app, config)
    try:
        if args.events:
            with open_input(args.events) as source:
                send_lines(runtime, source, args.events, eventlines)
        with runtime.lock:
            result = run_on_demand(runtime, args.query, "query")
    finally:
        runtime.shutdown()
    schema = result.schema
    if args.json:
        from sp_dagster.messaging.eventlines import json_value

        for event in result.events:
            row = {n: json_value(v, t) for n, t, v in zip(schema.names, schema.types, event.data)}
            print(json.dumps(row, default=str))
    elif schema.names:
        _print_table(schema, [event.data for event in result.events])
    return 0


def _app_text(app: str, config) -> tuple[str, bool]:
    """(SiddhiQL, deployed?): the file `app`, else the app of that name deployed on the control plane of `config`."""
    path = Path(app)
    if path.exists() or path.suffix == ".siddhi" or config is None:  # a missing APP.siddhi is a missing file, not an app name
        return path.read_text(encoding="utf-8"), False
    from sp_dagster.cluster.db import ControlPlane
    from sp_dagster.cluster.store.deployments import get_deployment, list_deployments

    plane = ControlPlane.from_config(config, migrate=False)
    try:
        record = get_deployment(plane, app)
        names = [] if record else [d.app for d in list_deployments(plane)]
    finally:
        plane.close()
    if record is None:
        raise SpDagsterError(f"{app}: no such file, and no app of that name is deployed on {plane.safe_url} (deployed: {', '.join(names) or 'none'})")
    return record.source, True


def _query_runtime(text: str, source: str, config):
    """The runtime a query reads through: the app as a reader of its deployed stores sees it (an aggregation
    planned as N > 1 shards merges them), with the datasources, shard id and partitionById of `config`."""
    from sp_dagster.engine.runtime import AppRuntime
    from sp_dagster.siddhi import parse
    from sp_dagster.topology.partial_apps import reader_view

    settings = {}
    if config is not None:
        from sp_dagster.engine.aggregation.settings import runtime_settings

        settings = runtime_settings(config)
    parsed = parse(text, source)
    app = reader_view(parsed)
    if any(a is not b for a, b in zip(app.elements, parsed.elements)) and not settings.get("shard_id"):
        settings["shard_id"] = QUERY_SHARD  # a reader of shards writes nothing unless --events sends some
    return AppRuntime(app, source=source, **settings)


#: The shard id of `sp-dagster query` reading a sharded aggregation with no shard id configured.
QUERY_SHARD = "sp-dagster-query"


def _print_table(schema, rows: list[tuple]) -> None:
    from sp_dagster.javatext import java_str

    cells = [list(schema.names)] + [[java_str(v, t) for v, t in zip(row, schema.types)] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(schema.names))]
    for line in cells:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    print(f"({len(rows)} row{'' if len(rows) == 1 else 's'})")
