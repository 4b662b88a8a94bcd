"""Seed 002 end to end: an incremental aggregation run as two active-active shards on two Spark workers.

The app's aggregation has `@dist(parallel='2')` and an rdbms `@store` (a real PostgreSQL or
MariaDB): the planner makes it two shard instances, each with its own stable shard id, fed
round robin from a two-partition entry topic (the client publishes round robin, as seed 002's
clients do to its worker nodes). Retrievals read the merged totals of both shards from the
store: in process (as any reader), through `sp-dagster query <deployed app>`, and through a query
of another execution group that joins the aggregation. Killing a worker (SIGKILL) mid-stream
moves its shard to the other worker, which restores the shard's last revision and replays
the events since: no total changes.
"""

from __future__ import annotations

import collections
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from sp_dagster.deploy import load_app, plan_app
from sp_dagster.embedded.local_cluster import LocalCluster
from sp_dagster.engine import AppRuntime
from sp_dagster.engine.aggregation.timing import bucket_start
from sp_dagster.messaging import EARLIEST, RoundRobin, codec_for
from sp_dagster.siddhi import parse
from sp_dagster.topology.partial_apps import reader_view
from sp_dagster.worker.instance.plan import plan_instance
from tests.fixtures.stores import store_for
from tests.fixtures.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.broker]

APP = """@App:name('{name}')
define stream TradeStream (symbol string, price double, quantity long, timestamp long);
define stream QueryStream (symbol string, probe long);

@sink(type='kafka', topic='{name}.Totals', @map(type='json'))
define stream TotalsStream (probe long, hour long, symbol string, total long, n long, avgPrice double);

@dist(parallel='2')
{store}
define aggregation TradeAggregation
from TradeStream
select symbol, avg(price) as avgPrice, sum(quantity) as total, count() as n
group by symbol
aggregate by timestamp every sec ... year;

@info(name='lookup') @dist(execGroup='lookup', parallel='1')
from QueryStream as Q join TradeAggregation as A on Q.symbol == A.symbol
within '2017-06-** **:**:**' per 'hours'
select Q.probe, A.AGG_TIMESTAMP as hour, A.symbol, A.total, A.n, A.avgPrice
insert into TotalsStream;
"""

RETRIEVAL = "from TradeAggregation within '2017-06-** **:**:**' per '{per}' select AGG_TIMESTAMP, symbol, total, n, avgPrice"
PERS = ("seconds", "minutes", "hours")
SYMBOLS = [f"S{i}" for i in range(8)]
BASE = 1496289600000  # 2017-06-01 04:00:00 GMT: the events' own time spans two hours from here
TOTALS = [("probe", "long"), ("hour", "long"), ("symbol", "string"), ("total", "long"), ("n", "long"), ("avgPrice", "double")]


def trades(count: int, seed: int) -> list[tuple]:
    rng = random.Random(seed)
    return [(rng.choice(SYMBOLS), float(rng.randint(10, 200)), rng.randint(1, 40), BASE + rng.randrange(2 * 3_600_000)) for _ in range(count)]


def expected_totals(rows: list[tuple]) -> dict[tuple, tuple]:
    """{(hour, symbol): (total, n, sum of prices)} of the events."""
    totals: dict[tuple, list] = collections.defaultdict(lambda: [0, 0, 0.0])
    for symbol, price, quantity, at in rows:
        bucket = totals[bucket_start(at, "HOURS"), symbol]
        bucket[0] += quantity
        bucket[1] += 1
        bucket[2] += price
    return {key: tuple(value) for key, value in totals.items()}


def as_totals(rows) -> dict[tuple, tuple]:
    """Retrieved rows (bucket, symbol, total, n, avgPrice) summed per hour, in the form of expected_totals."""
    found: dict[tuple, list] = collections.defaultdict(lambda: [0, 0, 0.0])
    for at, symbol, total, n, avg in rows:
        bucket = found[bucket_start(at, "HOURS"), symbol]
        bucket[0] += total
        bucket[1] += n
        bucket[2] += avg * n
    return {key: tuple(value) for key, value in found.items()}


def per_granularity(expected: dict) -> dict:
    """The totals every granularity's retrieval must give."""
    return {(per, *key): value for per in PERS for key, value in expected.items()}


def same(found: dict, expected: dict) -> bool:
    """Equal totals and counts, and price sums equal up to float rounding."""
    return found.keys() == expected.keys() and all(found[k][:2] == expected[k][:2] and found[k][2] == pytest.approx(expected[k][2], rel=1e-9) for k in expected)


def wait_for_totals(read, expected: dict, timeout: float, what: str) -> dict:
    """Read until the totals equal `expected` (the shards flush each second; a reader merges what is
    written), then once more a few seconds later: converged totals stay put."""
    last: dict = {}

    def converged():
        last["found"] = read()
        return same(last["found"], expected)

    wait_until(converged, timeout, 1.0, lambda: f"{what}: the totals to converge:\n{_diff(last.get('found') or {}, expected)}")
    time.sleep(4)  # what converged must stay put: a late duplicate would show by now
    found = read()
    assert same(found, expected), f"{what}: the totals moved after converging:\n{_diff(found, expected)}"
    return found


def _diff(found: dict, expected: dict) -> str:
    keys = sorted(set(found) | set(expected), key=str)
    return "\n".join(f"  {k}: got {found.get(k)}, expected {expected.get(k)}" for k in keys if found.get(k) != expected.get(k))


@pytest.fixture(scope="module", params=["postgresql", "mariadb"])
def deployed(request, broker, tmp_path_factory):
    """The seed 002 app deployed on a local cluster of 2 workers, its aggregation stored in a real database."""
    from sp_dagster.messaging.kafka import KafkaTransport

    kind = request.param
    server = request.getfixturevalue("postgres_server" if kind == "postgresql" else "mariadb_server")
    home = tmp_path_factory.mktemp(f"seed002-{kind}")
    store = store_for(kind, server.create_database(), home)
    name = f"Seed002{kind.title()}"
    app_path = home / "seed002.siddhi"
    app_path.write_text(APP.format(name=name, store=store.annotation()), encoding="utf-8")
    transport = KafkaTransport(broker.bootstrap_servers, timeout=15)
    cluster = LocalCluster(home / "cluster", transport.bootstrap_servers).start()
    try:
        cluster.deploy(app_path, timeout=300)
        yield cluster, app_path, name, store, plan_app(load_app(app_path)), transport
    except Exception:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()
        transport.close()


def _entry(topology, group: str):
    instance = topology.group(group).instances[0]
    (entry,) = plan_instance(instance.name, instance.siddhi).inputs
    return entry


def publish(transport, entry, rows: list[tuple]) -> None:
    """Round robin over the entry topic's partitions, stamped with the wall clock (processing time)."""
    publisher = transport.publisher(entry.topic, codec_for(entry.codec, entry.attributes), RoundRobin())
    now = int(time.time() * 1000)
    publisher.send(rows, [now + i // 50 for i in range(len(rows))])
    publisher.flush(60)


class Reader:
    """A reader of the deployed store, as any node's runtime is: the app's reader view, on the wall clock."""

    def __init__(self, app_path: Path):
        self.runtime = AppRuntime(reader_view(parse(app_path.read_text(encoding="utf-8"))), shard_id="test-reader")

    def __call__(self) -> dict:
        """{(per, hour, symbol): totals}: every granularity's rows summed per hour (each must give the same)."""
        return {(per, *key): value for per in PERS for key, value in as_totals(e.data for e in self.runtime.query(RETRIEVAL.format(per=per))).items()}

    def close(self) -> None:
        self.runtime.shutdown()


def test_shards_on_two_workers_merge_and_a_killed_worker_changes_no_total(deployed):
    from sp_dagster.cluster.store.deployments import list_instances
    from sp_dagster.cluster.store.revisions import RevisionStore
    from sp_dagster.config.loader import load_config

    cluster, app_path, name, store, topology, transport = deployed
    group = f"{name}-aggregation-TradeAggregation"
    shards = [i.name for i in topology.group(group).instances]
    entry = _entry(topology, group)
    rows = trades(6000, seed=2)
    first, rest = rows[:2000], rows[2000:]
    reader = Reader(app_path)
    plane = cluster.plane()
    revisions = RevisionStore.from_config(load_config(cluster.worker_conf, role="worker"), plane)
    try:
        placed = {i.instance_id: i.node_id for i in list_instances(plane, name)}
        victims = [s for s in shards if placed[s] == "worker-2"]
        assert victims and len(victims) < len(shards), f"the shards are not spread over both workers: {placed}"

        publish(transport, entry, first)
        wait_for_totals(reader, per_granularity(expected_totals(first)), 240, "the first events")
        # Both shards wrote rows, each under its own shard id (the instance's name).
        with sa.create_engine(store.url).connect() as conn:
            name_ = next(t for t in sa.inspect(conn).get_table_names() if t.upper() == "TRADEAGGREGATION_SECONDS")
            table = sa.Table(name_, sa.MetaData(), autoload_with=conn)
            shard_id = next(c for c in table.columns if c.name.upper() == "SHARD_ID")
            written = {row[0] for row in conn.execute(sa.select(shard_id).distinct())}
        assert written == set(shards)
        # The victim saves a revision after that (so its move restores a state holding events).
        saved = {v: (revisions.latest(v).revision if revisions.latest(v) else 0) for v in victims}
        deadline = time.monotonic() + 60
        while any((revisions.latest(v).revision if revisions.latest(v) else 0) < saved[v] + 2 for v in victims):
            assert time.monotonic() < deadline, "the victim saved no revision for a minute"
            time.sleep(0.5)

        chunk = len(rest) // 6
        for number, start in enumerate(range(0, len(rest), chunk)):
            publish(transport, entry, rest[start : start + chunk])
            if number == 2:
                cluster.kill("worker-2")  # mid-stream: its shard wrote rows its last revision does not cover
            time.sleep(1)
        expected = expected_totals(rows)
        found = wait_for_totals(reader, per_granularity(expected), 360, "after the kill")
        moved = {i.instance_id: i.node_id for i in list_instances(plane, name)}
        assert all(moved[v] == "worker-1" for v in victims), moved
        assert sum(t[1] for t in found.values()) == len(PERS) * len(rows)

        # sp-dagster query against the deployed app (by name) reads the same merged totals.
        done = subprocess.run(
            [sys.executable, "-m", "sp_dagster.cli", "query", name, RETRIEVAL.format(per="hours"), "--json", "--conf", str(cluster.manager_conf)],
            capture_output=True, text=True, timeout=120, env=cluster.env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        queried = as_totals((r["AGG_TIMESTAMP"], r["symbol"], r["total"], r["n"], r["avgPrice"]) for r in lines)
        assert same(queried, expected), _diff(queried, expected)

        # A query of another execution group joining the aggregation sees them too.
        lookup = _entry(topology, f"{name}-lookup")
        outputs = transport.reader(f"{name}.Totals", {0: EARLIEST}, codec_for("json", TOTALS))
        try:
            joined = wait_for_totals(lambda: probe(transport, lookup, outputs), expected, 120, "the joining query")
        finally:
            outputs.close()
        assert same(joined, {key[1:]: value for key, value in found.items() if key[0] == "hours"})
    except Exception:
        print(cluster.logs())
        raise
    finally:
        reader.close()
        revisions.close()
        plane.close()


_probes = iter(range(1, 1_000_000))


def probe(transport, lookup, outputs) -> dict:
    """Send one query event per symbol to the joining group; the totals its outputs for them give."""
    number = next(_probes)
    publisher = transport.publisher(lookup.topic, codec_for(lookup.codec, lookup.attributes), RoundRobin())
    publisher.send([(s, number) for s in SYMBOLS], [int(time.time() * 1000)] * len(SYMBOLS))
    publisher.flush(30)
    rows, deadline = [], time.monotonic() + 20
    while time.monotonic() < deadline:
        rows += [e.row for e in outputs.poll(timeout=1.0).events if e.row[0] == number]
        if {r[2] for r in rows} == set(SYMBOLS):  # every symbol answered (its rows come in one output)
            rows += [e.row for e in outputs.poll(timeout=1.0).events if e.row[0] == number]
            break
    return as_totals(r[1:] for r in rows)
