"""Incremental aggregations as assets: one per `define aggregation` of a deployed app, observed from its store.
The health job's `aggregation_store` op reads an rdbms `@store`'s tables from the Dagster side and
logs what they hold; its check `store_readable` fails when they cannot be read. An in-memory
aggregation lives only inside its instances, so its asset has no observation.
"""

import dataclasses
import functools
from datetime import UTC, datetime

import dagster as dg

from sp_dagster.orchestration.ops import user_errors
from sp_dagster.wording import counted

AGGREGATION_META = "sp_dagster/aggregation"
READER_META = "sp_dagster/aggregation_reader"
STORE_READABLE = "store_readable"
#: The shard id the observer reads sharded aggregations with; it never writes.
OBSERVER_SHARD = "sp-dagster-observer"


@functools.lru_cache(maxsize=256)
def _parsed(siddhi: str):
    from sp_dagster.siddhi import parse

    return parse(siddhi)


def deployment_aggregations(deployment: dict) -> list[dict]:
    """The aggregations of a recorded deployment: name, the group feeding it, the groups reading it,
    whether it has a store, and the SiddhiQL of a reader of it (the aggregation and its input stream)."""
    from sp_dagster.siddhi import ast
    from sp_dagster.topology.partial_apps import is_aggregation_view

    found: dict[str, dict] = {}
    readers: dict[str, set[str]] = {}
    for group in deployment["plan"].get("groups", []):
        if not group.get("instances"):
            continue
        try:
            app = _parsed(group["instances"][0]["siddhi"])
        except Exception:  # a partial app this version cannot parse shows as a partial app only
            continue
        for element in app.elements:
            if not isinstance(element, ast.AggregationDefinition):
                continue
            if is_aggregation_view(element, group["name"]):
                readers.setdefault(element.name, set()).add(group["name"])
                continue
            found[element.name] = {
                "name": element.name,
                "group": group["name"],
                "shards": group["parallelism"] if _sharded(element) else 1,
                "store": _store_kind(element),
                "reader": _reader_siddhi(app, element),
            }
    return [{**a, "readers": sorted(readers.get(name, ()))} for name, a in sorted(found.items())]


def _sharded(aggregation) -> bool:
    annotation = aggregation.annotation("PartitionById")
    return annotation is not None and (annotation.get("enable") or "true").lower() == "true"


def _store_kind(aggregation) -> str | None:
    store = aggregation.annotation("store")
    kind = (store.get("type") or "").lower() if store is not None else ""
    return None if kind in ("", "in-memory", "inmemory") else kind


def _reader_siddhi(app, aggregation) -> str:
    """A partial app holding only the aggregation, its input stream and functions: it reads the store and
    can write nothing (no query, no trigger, no transport)."""
    from sp_dagster.siddhi import ast
    from sp_dagster.siddhi.render import render

    keep = []
    for element in app.elements:
        if isinstance(element, ast.StreamDefinition) and element.name == aggregation.input.stream:
            keep.append(dataclasses.replace(element, annotations=()))
        elif isinstance(element, ast.FunctionDefinition) or element is aggregation:
            keep.append(element)
    return render(dataclasses.replace(app, elements=tuple(keep)))


def read_store(reader_siddhi: str, datasources: dict | None) -> dict:
    """What an aggregation's store holds: rows and newest bucket per granularity, rows per shard."""
    from sp_dagster.engine import AppRuntime
    from sp_dagster.engine.clock import DrivenClock

    runtime = AppRuntime(reader_siddhi, clock=DrivenClock(), datasources=datasources, shard_id=OBSERVER_SHARD)
    try:
        (seen,) = runtime.aggregations().values()
    finally:
        runtime.shutdown()
    return seen


def _when(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S GMT")


def observation(key: dg.AssetKey, seen: dict) -> dg.AssetObservation:
    """The observation of one aggregation: rows per granularity (one number each, so Dagster plots them),
    the newest bucket per granularity, rows per shard."""
    metadata = {f"rows_{duration.lower()}": count for duration, count in seen["rows"].items()}
    metadata["rows"] = sum(seen["rows"].values())
    metadata["newest_bucket"] = dg.MetadataValue.json({d: _when(ms) for d, ms in seen["newest_bucket"].items()})
    metadata["newest_bucket_ms"] = dg.MetadataValue.json(seen["newest_bucket"])
    if seen.get("rows_by_shard") is not None:
        metadata["rows_by_shard"] = dg.MetadataValue.json(seen["rows_by_shard"])
    return dg.AssetObservation(asset_key=key, metadata=metadata)


def build_aggregation_checks(targets: dict[dg.AssetKey, dict], worker_conf: str) -> dg.AssetChecksDefinition:
    """One op observing every aggregation with a store (`targets`: asset key -> its deployment_aggregations entry)."""
    specs = [dg.AssetCheckSpec(STORE_READABLE, asset=key, description="the aggregation's tables can be read") for key in targets]

    @dg.multi_asset_check(specs=specs, name="aggregation_store", can_subset=True, description="Observe each aggregation's tables.")
    def aggregation_store(context: dg.AssetCheckExecutionContext):
        """Read each selected aggregation's tables, log an observation, and pass unless they cannot be read."""
        from sp_dagster.orchestration.resources import load_conf

        with user_errors():
            datasources = load_conf(worker_conf, role="worker").datasources
        for key in sorted({check.asset_key for check in context.selected_asset_check_keys}, key=lambda k: tuple(k.path)):
            target = targets[key]
            try:
                seen = read_store(target["reader"], datasources)
            except Exception as exc:  # the store is the user's: say why it cannot be read, do not fail the run
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                yield dg.AssetCheckResult(asset_key=key, check_name=STORE_READABLE, passed=False, description=f"cannot read the tables: {reason}")
                continue
            context.op_execution_context.log_event(observation(key, seen))
            filled = [d for d, n in seen["rows"].items() if n]
            yield dg.AssetCheckResult(
                asset_key=key,
                check_name=STORE_READABLE,
                passed=True,
                description=f"{counted(sum(seen['rows'].values()), 'row')} in {len(filled)} of {counted(len(seen['rows']), 'granularity table')}",
                metadata={"rows": sum(seen["rows"].values())},
            )

    return aggregation_store
