"""Incremental aggregations as assets: lineage from the partial app feeding them, and observations of their tables."""

from __future__ import annotations

import dagster as dg

from sp_dagster.deploy import load_app, plan_app, record
from sp_dagster.engine import AppRuntime
from sp_dagster.orchestration.definitions import build_definitions
from tests.fixtures.partial_apps import engine_only
from tests.fixtures.stores import store_for

K = dg.AssetKey
APP = """@App:name('Seed')
define stream TradeStream (symbol string, price double, quantity long, ts long);
define stream QueryStream (symbol string);
@sink(type='kafka', topic='Seed.Totals', @map(type='json'))
define stream TotalsStream (symbol string, total long);

@dist(parallel='2') {store}
define aggregation TradeAgg from TradeStream
select symbol, sum(quantity) as total group by symbol aggregate by ts every sec ... hour;

@info(name='lookup') @dist(execGroup='lookup', parallel='1')
from QueryStream as Q join TradeAgg as A on Q.symbol == A.symbol within '2017-06-** **:**:**' per 'hours'
select A.symbol, A.total insert into TotalsStream;
"""
AGG, FEEDER, LOOKUP = K(["Seed", "aggregations", "TradeAgg"]), K(["Seed", "aggregation-TradeAgg"]), K(["Seed", "lookup"])
BASE = 1496289950000  # 2017-06-01 04:05:50 GMT


def deploy_record(cluster, plane, store_annotation: str):
    loaded = load_app(cluster.add_app("seed.siddhi", APP.format(store=store_annotation)))
    topology = plan_app(loaded)
    record(plane, loaded, topology)
    return topology


def write_as_the_shards(topology) -> None:
    """Run each shard's partial app as its worker would (its own shard id), events round robin."""
    shards = topology.group("Seed-aggregation-TradeAgg").instances
    runtimes = [AppRuntime(engine_only(s.app), shard_id=s.shard_id) for s in shards]
    try:
        events = [("IBM", 1.0, 10, BASE), ("ORCL", 1.0, 20, BASE + 1000), ("IBM", 1.0, 30, BASE + 61_000)]
        for number, row in enumerate(events):
            runtimes[number % 2].send("TradeStream", [row], [row[3]])
        for runtime in runtimes:
            runtime.advance_time(BASE + 3_700_000)  # every second, minute and hour is written
    finally:
        for runtime in runtimes:
            runtime.shutdown()


def health_results(cluster):
    defs = build_definitions(str(cluster.manager_conf), str(cluster.worker_conf))
    instance = dg.DagsterInstance.ephemeral()
    result = defs.get_job_def("health").execute_in_process(instance=instance)
    assert result.success
    checks = {
        (e.event_specific_data.asset_key, e.event_specific_data.check_name): e.event_specific_data
        for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"
    }  # fmt: skip
    return defs, instance, checks


def test_an_aggregation_is_an_asset_fed_by_its_partial_app_and_observed_from_its_tables(cluster, plane, postgres_url, tmp_path):
    store = store_for("postgresql", postgres_url, tmp_path)
    topology = deploy_record(cluster, plane, store.annotation())
    write_as_the_shards(topology)

    defs, instance, checks = health_results(cluster)
    assets = defs.get_repository_def().asset_graph
    assert set(assets.get(AGG).parent_keys) == {FEEDER}
    assert AGG in set(assets.get(LOOKUP).parent_keys)  # the joining group reads it through the store
    assert assets.get(AGG).group_name == assets.get(FEEDER).group_name == "Seed"
    meta = {k: getattr(v, "value", v) for k, v in defs.resolve_assets_def(AGG).specs_by_key[AGG].metadata.items()}
    assert meta["shards"] == 2 and meta["store"] == "rdbms" and meta["fed_by"] == "Seed-aggregation-TradeAgg"
    assert meta["read_by"] == ["Seed-lookup"] and "define aggregation TradeAgg" in meta["siddhi"]

    readable = checks[AGG, "store_readable"]
    assert readable.passed, readable.description
    (record,) = instance.fetch_observations(AGG, limit=5).records
    seen = {k: getattr(v, "value", v) for k, v in record.asset_observation.metadata.items()}
    # IBM and ORCL in second 04:05:50 and 04:05:51, IBM in 04:06:51; per shard (round robin): IBM 10 + IBM 30, ORCL 20.
    assert (seen["rows_seconds"], seen["rows_minutes"], seen["rows_hours"]) == (3, 3, 2)
    assert seen["rows"] == 8
    minute = BASE - BASE % 60_000
    assert seen["newest_bucket_ms"] == {"SECONDS": BASE + 61_000, "MINUTES": minute + 60_000, "HOURS": minute - 5 * 60_000}
    assert seen["newest_bucket"]["HOURS"] == "2017-06-01 04:00:00 GMT"
    assert seen["rows_by_shard"] == {"Seed-aggregation-TradeAgg-1": 5, "Seed-aggregation-TradeAgg-2": 3}


def test_a_store_that_cannot_be_read_fails_its_check_with_the_reason(cluster, plane, postgres_server):
    from sp_dagster.embedded.broker import free_port

    nowhere = f"@store(type='rdbms', jdbc.url='jdbc:postgresql://127.0.0.1:{free_port()}/gone', username='sp')"
    deploy_record(cluster, plane, nowhere)
    _, instance, checks = health_results(cluster)
    failed = checks[AGG, "store_readable"]
    assert not failed.passed and failed.severity == dg.AssetCheckSeverity.ERROR
    assert "cannot read the tables" in failed.description and "TradeAgg" in failed.description
    assert not instance.fetch_observations(AGG, limit=5).records
