"""Health of the partial apps: observations of throughput, lag and worker heartbeats, and their checks.
One check op, `partial_app_health`, reads the control plane once per run, observes the
selected partial apps and their apps' topics, and evaluates `live_worker`, `lag_not_growing` and
`parallelism_advice`; docs/dagster.md (Health observations and checks) says what each holds.
"""

import time
from dataclasses import dataclass
from typing import Any

import dagster as dg

from sp_dagster.cluster.rates import per_second
from sp_dagster.cluster.status import receiver_urls
from sp_dagster.orchestration.ops import user_errors
from sp_dagster.orchestration.resources import ControlPlaneResource, MessagingResource
from sp_dagster.wording import counted

LIVE_WORKER, LAG_NOT_GROWING, PARALLELISM_ADVICE = "live_worker", "lag_not_growing", "parallelism_advice"
# What workers report per instance: cumulative rows, the rate, the lag, processing latency (ms from
# an event's arrival to its outputs' acknowledgement; a micro-batch's duration in micro-batch mode).
METRICS = ("rows_in_total", "rows_out_total", "rows_per_s", "lag", "latency_ms_p50", "latency_ms_p99", "batch_ms")
TOTALS = ("rows_in_total", "rows_out_total", "lag")


def instance_rows(status: dict, app: str, exec_group: str) -> list[dict]:
    """The instances of one partial app in `sp-dagster status --json` form ([] when not deployed)."""
    deployment = deployment_of(status, app)
    return [] if deployment is None else [i for i in deployment["instances"] if i["group"] == exec_group]


def deployment_of(status: dict, app: str) -> dict | None:
    """The app's deployment in `sp-dagster status --json` form (None when not deployed)."""
    return next((d for d in status["deployments"] if d["app"] == app), None)


def worker_problems(instances: list[dict], nodes: dict[str, dict], max_age_ms: int) -> list[str]:
    """Why instances lack a live worker: not placed, worker dead or gone, worker silent too long."""
    problems = []
    for i in instances:
        node = nodes.get(i["node"]) if i["node"] else None
        if not i["node"]:
            problems.append(f"{i['instance']}: not placed" + (f" ({i['detail']})" if i.get("detail") else ""))
        elif node is None:
            problems.append(f"{i['instance']}: its worker {i['node']} is not registered")
        elif node["state"] != "alive":
            problems.append(f"{i['instance']}: its worker {i['node']} is {node['state']}")
        elif node["last_heartbeat_ago_ms"] > max_age_ms:
            problems.append(f"{i['instance']}: its worker {i['node']} has been silent for {node['last_heartbeat_ago_ms'] / 1000:.1f} s")
    return problems


def growing_lags(history: list[dict[str, int]], current: dict[str, int], samples: int) -> dict[str, list[int]]:
    """Instances whose lag rose at each of the last `samples` observations (oldest history first)."""
    growing = {}
    for instance, lag in current.items():
        series = [h[instance] for h in history if instance in h][-(samples - 1) :] + [lag]
        if len(series) >= samples and all(a < b for a, b in zip(series, series[1:])):
            growing[instance] = series
    return growing


def _metric(instance: dict, name: str) -> int | float | None:
    value = (instance.get("metrics") or {}).get(name)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def lags(instances: list[dict]) -> dict[str, int]:
    """Each instance's lag, where its worker reports one."""
    return {i["instance"]: int(lag) for i in instances if (lag := _metric(i, "lag")) is not None}


def _previous(instance: dg.DagsterInstance, key: dg.AssetKey, limit: int) -> list[tuple[float, dict[str, Any]]]:
    """(timestamp, metadata values) of the asset's last `limit` observations, oldest first."""
    records = instance.fetch_observations(key, limit=limit).records
    found = []
    for record in reversed(records):
        observation = record.asset_observation
        if observation is not None:
            found.append((record.timestamp, {k: getattr(v, "value", v) for k, v in observation.metadata.items()}))
    return found


def observe(key: dg.AssetKey, instances: list[dict], nodes: dict[str, dict], previous: list[tuple[float, dict]], now: float) -> dg.AssetObservation:
    """The observation of one partial app: per-instance metrics, totals, rates, and its workers' heartbeats."""
    per_instance = {}
    for i in instances:
        node = nodes.get(i["node"]) if i["node"] else None
        per_instance[i["instance"]] = {
            "worker": i["node"],
            "status": i["status"],
            **{m: _metric(i, m) for m in METRICS},
            "worker_heartbeat_s": round(node["last_heartbeat_ago_ms"] / 1000, 1) if node else None,
            **({"receiver_urls": receiver_urls(i)} if receiver_urls(i) else {}),
        }
    totals = {m: sum(v[m] for v in per_instance.values() if v[m] is not None) for m in TOTALS}
    metadata: dict[str, Any] = {
        "running": f"{sum(1 for i in instances if i['status'] == 'running')}/{len(instances)}",
        **totals,
        "batch_ms": max((v["batch_ms"] for v in per_instance.values() if v["batch_ms"] is not None), default=0),
        "latency_ms_p50": max((v["latency_ms_p50"] for v in per_instance.values() if v["latency_ms_p50"] is not None), default=0),
        "latency_ms_p99": max((v["latency_ms_p99"] for v in per_instance.values() if v["latency_ms_p99"] is not None), default=0),
        "instances": dg.MetadataValue.json(per_instance),
        "lag_by_instance": dg.MetadataValue.json(lags(instances)),
        "workers": dg.MetadataValue.json(
            {
                n["node"]: {"state": n["state"], "heartbeat_s": round(n["last_heartbeat_ago_ms"] / 1000, 1)}
                for n in nodes.values()
                if n["node"] in {i["node"] for i in instances}
            }
        ),
    }
    urls = sorted({url for i in instances for url in receiver_urls(i)})
    if urls:
        metadata["receiver_urls"] = dg.MetadataValue.json(urls)
    if previous:
        then, last = previous[-1]
        for metric, name in (("rows_in_total", "events_in_per_s"), ("rows_out_total", "events_out_per_s")):
            before = last.get(metric)
            rate = per_second(before, then, totals[metric], now) if isinstance(before, (int, float)) else None
            if rate is not None:
                metadata[name] = round(rate, 2)
    return dg.AssetObservation(asset_key=key, metadata=metadata)


@dataclass(frozen=True)
class TopicTarget:
    """A topic asset to observe: its app, its name, and the execGroups that read only it (their lag is its readers' lag)."""

    app: str
    topic: str
    readers: tuple[str, ...] = ()
    sink: bool = False  # where the app's results land (assets.SiddhiAssetProps.sink): it materializes on new events


def topic_targets(snapshot: dict, specs: list[dg.AssetSpec]) -> dict[dg.AssetKey, TopicTarget]:
    """The topic assets among `specs`, each with the execGroups of its app that read only it (from the snapshot's plans)."""
    from sp_dagster.orchestration.assets import APP_META, SINK_META, exec_group

    groups = {d["app"]: (d.get("plan") or {}).get("groups") or [] for d in snapshot["deployments"]}
    found = {}
    for spec in specs:
        app, topic = spec.metadata.get(APP_META), spec.metadata.get("topic")
        if isinstance(app, str) and isinstance(topic, str):
            only = [g for g in groups.get(app, []) if {s.get("topic") for s in (g.get("inputs") or {}).values()} == {topic}]
            found[spec.key] = TopicTarget(app, topic, tuple(exec_group(app, g) for g in only), spec.metadata.get(SINK_META) is True)
    return found


def observe_topic(key: dg.AssetKey, ends: dict[int, int], lag: float | None, previous: list[tuple[float, dict]], now: float) -> dg.AssetObservation:
    """The observation of one topic: end offset per partition, events held, their rate since the previous observation, its readers' lag."""
    total = sum(ends.values())
    metadata: dict[str, Any] = {"end_offsets": dg.MetadataValue.json({str(p): o for p, o in sorted(ends.items())}), "events_total": total}
    if lag is not None:
        metadata["consumer_lag"] = lag
    if previous:
        then, last = previous[-1]
        before = last.get("events_total")
        rate = per_second(before, then, total, now) if isinstance(before, (int, float)) else None
        if rate is not None:
            metadata["events_per_s"] = round(rate, 2)
    return dg.AssetObservation(asset_key=key, metadata=metadata)


def _observe_topics(context, messaging, status: dict, topics: dict[dg.AssetKey, TopicTarget], apps: set[str], now: float) -> None:
    """Log an observation of every topic of `apps`; a broker that does not answer skips them, with a warning."""
    from sp_dagster.errors import SpDagsterError

    for key, target in sorted(topics.items(), key=lambda item: item[0].to_user_string()):
        if target.app not in apps:
            continue
        try:
            ends = messaging.transport.end_offsets(target.topic)
        except SpDagsterError as exc:
            context.log.warning(f"topics not observed: {exc}")
            return
        lags = [_metric(i, "lag") for group in target.readers for i in instance_rows(status, target.app, group)]
        lag = sum(v for v in lags if v is not None) if lags and None not in lags else None
        context.op_execution_context.log_event(observe_topic(key, ends, lag, _previous(context.instance, key, 1), now))
        if target.sink and (materialization := topic_materialization(context.instance, key, ends)) is not None:
            context.op_execution_context.log_event(materialization)


def topic_materialization(instance: dg.DagsterInstance, key: dg.AssetKey, ends: dict[int, int]) -> dg.AssetMaterialization | None:
    """A materialization of a sink topic when it holds other events than at its last one (None when not): its
    freshness policy then measures how long ago results last landed, to the health schedule's interval."""
    total = sum(ends.values())
    records = instance.fetch_materializations(key, limit=1).records
    latest = records[0].asset_materialization if records else None
    before = getattr(latest.metadata.get("events_total"), "value", None) if latest is not None else None
    if not total or total == before:
        return None
    grown = total - before if isinstance(before, int) and total > before else None
    return dg.AssetMaterialization(
        asset_key=key,
        description=f"{counted(grown, 'new event')} since the last check" if grown else f"holds {counted(total, 'event')}",
        metadata={"events_total": total, **({"new_events": grown} if grown else {})},
    )


def build_health_checks(targets: dict[dg.AssetKey, tuple[str, str]], topics: dict[dg.AssetKey, TopicTarget] | None = None) -> dg.AssetChecksDefinition:
    """One op evaluating both checks for every partial app (`targets`: asset key -> (app, execGroup)) and observing the apps' `topics`."""
    topics = dict(topics or {})
    specs = []
    for key in targets:
        specs.append(dg.AssetCheckSpec(LIVE_WORKER, asset=key, description="every instance runs on a live, heartbeating worker"))
        specs.append(dg.AssetCheckSpec(LAG_NOT_GROWING, asset=key, description="no instance's lag keeps growing"))
        specs.append(dg.AssetCheckSpec(PARALLELISM_ADVICE, asset=key, description="the group runs at the parallelism its load advises"))

    @dg.multi_asset_check(specs=specs, name="partial_app_health", can_subset=True, description="Observe the partial apps and check their workers and lag.")
    def partial_app_health(context: dg.AssetCheckExecutionContext, control_plane: ControlPlaneResource, messaging: MessagingResource):
        """Observe each selected partial app and its app's topics, and evaluate its selected checks."""
        with user_errors():
            status = control_plane.status()
            config = control_plane.config()
            advice = control_plane.advice() if any(c.name == PARALLELISM_ADVICE for c in context.selected_asset_check_keys) else {"apps": []}
        max_age_ms = config.deployment.heartbeat_interval * config.deployment.heartbeat_max_retry
        samples = config.dagster.lag_growth_samples
        nodes = {n["node"]: n for n in status["nodes"]}
        now = time.time()  # the clock of Dagster's observation timestamps
        selected = context.selected_asset_check_keys
        for key in sorted({check.asset_key for check in selected}, key=lambda k: tuple(k.path)):
            app, exec_group = targets[key]
            instances = instance_rows(status, app, exec_group)
            deployment = deployment_of(status, app)
            if deployment is not None and (deployed := deployed_materialization(context.instance, key, deployment, exec_group, len(instances))) is not None:
                context.op_execution_context.log_event(deployed)  # before the checks: their results then count for this version
            previous = _previous(context.instance, key, samples - 1)
            observation = observe(key, instances, nodes, previous, now)
            context.op_execution_context.log_event(observation)
            if dg.AssetCheckKey(key, LIVE_WORKER) in selected:
                yield live_worker_result(key, app, instances, nodes, max_age_ms)
            if dg.AssetCheckKey(key, LAG_NOT_GROWING) in selected:
                history = [m.get("lag_by_instance") or {} for _, m in previous]
                current = lags(instances)
                yield lag_result(key, app, instances, history, current, samples)
            if dg.AssetCheckKey(key, PARALLELISM_ADVICE) in selected:
                yield advice_result(key, app, exec_group, advice)
        _observe_topics(context, messaging, status, topics, {targets[c.asset_key][0] for c in selected}, now)

    return partial_app_health


def deployed_materialization(
    instance: dg.DagsterInstance, key: dg.AssetKey, deployment: dict, exec_group: str, parallel: int
) -> dg.AssetMaterialization | None:
    """A materialization of the partial app as its deployment now stands (generation, text), or None when the event
    log has it already. A partial app "materializes" when a deploy changes it: the graph and the catalog then show
    when, and the health checks count for that version instead of an asset never materialized."""
    generation, content_hash = deployment["generation"], deployment["content_hash"]
    records = instance.fetch_materializations(key, limit=1).records
    latest = records[0].asset_materialization if records else None
    if latest is not None:
        seen = {name: getattr(value, "value", value) for name, value in latest.metadata.items()}
        if seen.get("generation") == generation and seen.get("content_hash") == content_hash:
            return None
    return dg.AssetMaterialization(
        asset_key=key,
        description=f"{deployment['app']} generation {generation} deployed: {counted(parallel, 'instance')} of {exec_group}",
        metadata={"generation": generation, "content_hash": content_hash, "parallelism": parallel},
    )


def live_worker_result(key, app: str, instances: list[dict], nodes: dict, max_age_ms: int) -> dg.AssetCheckResult:
    """live_worker: passed when every instance of the partial app has a live worker."""
    if not instances:
        return dg.AssetCheckResult(asset_key=key, check_name=LIVE_WORKER, passed=False, description=f"{app} is not deployed any more; reload the code location")
    problems = worker_problems(instances, nodes, max_age_ms)
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=LIVE_WORKER,
        passed=not problems,
        description="; ".join(problems) if problems else f"{counted(len(instances), 'instance')} on live workers",
        metadata={"without_live_worker": len(problems), "workers": sorted({i["node"] for i in instances if i["node"]})},
    )


def lag_result(key, app: str, instances: list[dict], history: list[dict], current: dict[str, int], samples: int) -> dg.AssetCheckResult:
    """lag_not_growing: passed unless some instance does not run or its lag rose at each of the last `samples` observations."""
    if not instances:
        return dg.AssetCheckResult(
            asset_key=key, check_name=LAG_NOT_GROWING, passed=False, severity=dg.AssetCheckSeverity.WARN, description=f"{app} is not deployed any more"
        )
    growing = growing_lags(history, current, samples)
    idle = {i["instance"]: i["status"] if i["node"] else "not placed" for i in instances if i["status"] != "running"}
    series_text = "; ".join(f"{name}: lag {' -> '.join(map(str, series))}" for name, series in sorted(growing.items()))
    problems = [f"lag keeps growing: {series_text}"] if growing else []
    if idle:
        problems.append(
            f"{counted(len(idle), 'instance')} not running, so nothing reads {'its' if len(idle) == 1 else 'their'} input and the lag there is "
            f"not known: {', '.join(f'{name} ({why})' for name, why in sorted(idle.items()))}"
        )
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=LAG_NOT_GROWING,
        passed=not problems,
        severity=dg.AssetCheckSeverity.WARN,
        description="; ".join(problems) if problems else (f"lag {sum(current.values())}" if current else "no lag reported yet"),
        metadata={"lag": sum(current.values()), "growing": dg.MetadataValue.json(growing), "not_running": dg.MetadataValue.json(sorted(idle))},
    )


def advice_result(key, app: str, exec_group: str, advice: dict) -> dg.AssetCheckResult:
    """parallelism_advice: passed while the group runs at the parallelism its load advises (`advice`: `sp-dagster advise --json`)."""
    found = next((g for a in advice["apps"] if a["app"] == app for g in a["groups"] if g["group"] == exec_group), None)
    if found is None:
        return dg.AssetCheckResult(
            asset_key=key, check_name=PARALLELISM_ADVICE, passed=False, severity=dg.AssetCheckSeverity.WARN, description=f"{app} is not deployed any more"
        )
    same = found["advised"] == found["parallel"]
    decision = found.get("autoscaling")
    said = f"; autoscaling {'applied' if decision['applied'] else 'held back'}: {decision['reason']}" if decision else ""
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=PARALLELISM_ADVICE,
        passed=same,
        severity=dg.AssetCheckSeverity.WARN,
        description=f"{'runs at' if same else 'advised ' + str(found['advised']) + ', runs at'} parallel {found['parallel']}: {found['reason']}{said}",
        metadata={k: dg.MetadataValue.json(v) if isinstance(v, dict) else v for k, v in found.items() if k != "group" and v is not None},
    )
