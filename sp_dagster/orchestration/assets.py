"""Partial apps, topics and aggregations as assets, rebuilt from the deployments recorded in the control plane.
`SpDagsterTranslator` decides keys, groups and metadata; `DeploymentsLoader` reads the control
plane once, when the code location loads (docs/dagster.md, The asset graph).
"""

from __future__ import annotations

import difflib
import json
import re
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import dagster as dg
from dagster._core.definitions.definitions_load_context import StateBackedDefinitionsLoader

from sp_dagster.orchestration.aggregations import AGGREGATION_META, deployment_aggregations
from sp_dagster.orchestration.errors import TranslatorError
from sp_dagster.orchestration.graph_sync import graph_fingerprint
from sp_dagster.orchestration.ops import code_block
from sp_dagster.orchestration.resources import ControlPlaneResource
from sp_dagster.siddhi.secrets import mask_secrets
from sp_dagster.wording import counted

DEFS_KEY = "sp_dagster/deployments"
CONTROL_PLANE_KEY = dg.AssetKey(["sp_dagster", "control_plane"])
APP_META, GROUP_META = "sp_dagster/app", "sp_dagster/group"
FRESHNESS = "sink_freshness_minutes"  # a snapshot's dagster.sinkFreshness
SINK_META = "sp_dagster/sink"  # a topic's metadata: true on the app's sinks
FINGERPRINT = "fingerprint"  # a snapshot's graph_sync.graph_fingerprint, as read


def by_path(key: dg.AssetKey) -> tuple[str, ...]:
    """An asset key's sort order: its path."""
    return tuple(key.path)


def fetch_deployments(control_plane: ControlPlaneResource) -> dict[str, Any]:
    """A snapshot of the recorded deployments (plans and placements); `error` says why there is none."""
    snapshot: dict[str, Any] = {"fetched_at": time.time(), "control_plane": None, "error": None, "deployments": []}
    try:
        snapshot[FRESHNESS] = control_plane.config().dagster.sink_freshness
        snapshot["control_plane"] = control_plane.where()
        status = control_plane.status()
        snapshot["deployments"] = control_plane.deployments(status)
        snapshot["changes"] = status.get("changes", [])  # who changed what through the manager API
    except Exception as exc:  # the code location must load whatever the database does
        snapshot["error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return snapshot


def declared_receiver_urls(group: dict) -> list[str]:
    """The URLs a receiver group's instances listen at, as its partial app declares them ([] for other groups)."""
    if not group.get("receiver") or not group["instances"]:
        return []
    from sp_dagster.worker.instance.plan import plan_instance
    from sp_dagster.worker.receivers.http import receiver_urls

    first = group["instances"][0]
    return list(receiver_urls(plan_instance(first["name"], first["siddhi"])))


def _instances_siddhi(instances: list[dict]) -> dict[str, dg.MetadataValue]:
    """The first instance's SiddhiQL and, when there are others, how theirs differs (a diff: a few lines only)."""
    if not instances:
        return {"siddhi": code_block("")}
    first = instances[0]
    lines = first["siddhi"].rstrip().splitlines()
    diffs = [
        "\n".join(difflib.unified_diff(lines, other["siddhi"].rstrip().splitlines(), first["name"], other["name"], n=0, lineterm="")) for other in instances[1:]
    ]
    shown = {"siddhi": code_block(first["siddhi"])}  # short enough for the UI to show it at once, as users look for it
    if any(diffs):
        shown["siddhi_of_other_instances"] = dg.MetadataValue.md("```diff\n" + mask_secrets("\n".join(d for d in diffs if d)) + "\n```")
    return shown


def _strategy(end: dict) -> str:
    return f"{end['strategy']}({end['partition_key']})" if end.get("partition_key") else end["strategy"]


def group_name(app: str) -> str:
    """The asset group of an app's partial apps and topics (Dagster allows letters, digits and _)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", app) or "app"


def exec_group(app: str, group: dict) -> str:
    """A group's execGroup name: its planned name without the `<app>-` prefix."""
    return group["name"].removeprefix(f"{app}-")


def partial_app_key(app: str, group: str) -> dg.AssetKey:
    """The default key of one partial app: `<app>/<execGroup>`."""
    return dg.AssetKey([app, group])


def topic_key(topic: str) -> dg.AssetKey:
    """The default key of one topic: `topics/<topic>`."""
    return dg.AssetKey(["topics", topic])


def aggregation_key(app: str, aggregation: str) -> dg.AssetKey:
    """The default key of one incremental aggregation: `<app>/aggregations/<name>`."""
    return dg.AssetKey([app, "aggregations", aggregation])


@dataclass(frozen=True)
class SiddhiAssetProps:
    """What one asset stands for, as `SpDagsterTranslator.get_asset_spec` receives it."""

    kind: str  # "partial_app", "topic" or "aggregation"
    app: str
    deployment: dict  # app, content_hash, generation, status, plan, placement
    group: dict | None = None  # a partial app's execution group (from the plan)
    aggregation: dict | None = None  # an aggregation (see aggregations.deployment_aggregations)
    topic: dict | None = None  # a topic: name, partitions
    producers: tuple[dg.AssetKey, ...] = ()  # a topic's publishing partial apps (default keys)
    read: bool = False  # a topic: some partial app of a deployed app reads it
    freshness_minutes: int = 0  # dagster.sinkFreshness (0: none)

    @property
    def sink(self) -> bool:
        """A topic the app publishes to and none of its partial apps reads: where its results land."""
        return self.topic is not None and bool(self.producers) and not self.read

    @property
    def default_key(self) -> dg.AssetKey:
        """The key the default translator gives this asset (what other specs' deps name)."""
        if self.group is not None:  # kind partial_app
            return partial_app_key(self.app, exec_group(self.app, self.group))
        if self.aggregation is not None:
            return aggregation_key(self.app, self.aggregation["name"])
        assert self.topic is not None  # one of the three is set, by kind
        return topic_key(self.topic["name"])


class SpDagsterTranslator:
    """How deployed (or planned) apps become asset specs; `get_asset_spec` is the one hook, and lineage follows the keys it returns.

    Subclass it to change keys, groups, owners or metadata::

        class StreamingTranslator(SpDagsterTranslator):
            def get_asset_spec(self, props: SiddhiAssetProps) -> dg.AssetSpec:
                spec = super().get_asset_spec(props)
                return spec.replace_attributes(key=spec.key.with_prefix("streaming"), owners=["team:streaming"])
    """

    def get_asset_spec(self, props: SiddhiAssetProps) -> dg.AssetSpec:
        """The spec of one partial app, topic or aggregation (deps named by their default keys)."""
        return {"partial_app": _partial_app_spec, "aggregation": _aggregation_spec, "topic": _topic_spec}[props.kind](props)


def _partial_app_spec(props: SiddhiAssetProps) -> dg.AssetSpec:
    """One execution group's partial app, depending on the topics it reads."""
    deployment, group, app = props.deployment, props.group, props.app
    assert group is not None, "a partial app's props carry its group"
    instances = [i["name"] for i in group["instances"]]
    placement = {name: deployment["placement"].get(name) or "not placed" for name in instances}
    inputs = {stream: _strategy(s) + (f" <- {s['topic']}" if s.get("topic") else " (no topic)") for stream, s in group["inputs"].items()}
    outputs = {f"{stream} -> {p['topic']}": _strategy(p) for stream, pubs in group["outputs"].items() for p in pubs}
    return dg.AssetSpec(
        key=props.default_key,
        deps=sorted({topic_key(s["topic"]) for s in group["inputs"].values() if s.get("topic")}, key=by_path),
        group_name=group_name(app),
        description=f"Partial app `{group['name']}` of {app}: {counted(group['parallelism'], 'parallel instance')}"
        + (", receiver (passthrough)" if group.get("receiver") else "")
        + ".",
        kinds={"siddhi", "spark"},
        code_version=f"{deployment['content_hash'][:12]}-g{deployment['generation']}",
        metadata={
            APP_META: app,
            GROUP_META: exec_group(app, group),
            "parallelism": group["parallelism"],
            "receiver": bool(group.get("receiver")),
            **({"receiver_urls": dg.MetadataValue.json(urls)} if (urls := declared_receiver_urls(group)) else {}),
            "instances": instances,
            "strategies": dg.MetadataValue.json({"in": inputs, "out": outputs}),
            "placement": dg.MetadataValue.json(placement),
            **_instances_siddhi(group["instances"]),
            "deployment": dg.MetadataValue.json({k: deployment[k] for k in ("generation", "status", "content_hash")}),
        },
        tags={"sp-dagster/app": group_name(app)},
    )


def _aggregation_spec(props: SiddhiAssetProps) -> dg.AssetSpec:
    """One aggregation, depending on the partial app that feeds it."""
    deployment, aggregation, app = props.deployment, props.aggregation, props.app
    assert aggregation is not None, "an aggregation's props carry it"
    store, shards = aggregation["store"], aggregation["shards"]
    return dg.AssetSpec(
        key=props.default_key,
        deps=[partial_app_key(app, exec_group(app, {"name": aggregation["group"]}))],
        group_name=group_name(app),
        description=f"Incremental aggregation `{aggregation['name']}` of {app}: "
        + (f"{shards} active-active shards" if shards > 1 else "one instance")
        + (f", its tables in an {store} store." if store else ", in memory (inside its instance)."),
        kinds={"siddhi", store} if store else {"siddhi"},
        code_version=f"{deployment['content_hash'][:12]}-g{deployment['generation']}",
        metadata={
            APP_META: app,
            AGGREGATION_META: aggregation["name"],
            "fed_by": aggregation["group"],
            "read_by": aggregation["readers"],
            "shards": shards,
            "store": store or "in memory",
            "siddhi": code_block(aggregation["reader"]),
        },
        tags={"sp-dagster/app": group_name(app)},
    )


def _topic_spec(props: SiddhiAssetProps) -> dg.AssetSpec:
    """One topic, depending on the partial apps that publish to it."""
    topic = props.topic
    assert topic is not None, "a topic's props carry the topic"
    return dg.AssetSpec(
        key=props.default_key,
        deps=sorted(set(props.producers), key=by_path),
        group_name=group_name(props.app),
        description=f"Topic `{topic['name']}` ({counted(topic['partitions'], 'partition')})"
        + ("" if props.producers else ": an entry topic, fed from outside the app")
        + ".",
        kinds={"kafka"},
        metadata={"topic": topic["name"], "partitions": topic["partitions"], APP_META: props.app, SINK_META: props.sink},
        # A sink "materializes" when the health checks see new events on it (health.topic_materialization).
        freshness_policy=dg.FreshnessPolicy.time_window(fail_window=timedelta(minutes=props.freshness_minutes))
        if props.sink and props.freshness_minutes
        else None,
    )


def _user_sinks(group: dict) -> list[dict]:
    """The cluster topics a group's own kafka @sink annotations publish to (the plan lists only its internal ones)."""
    from sp_dagster.worker.instance.plan import InstancePlanError, plan_instance

    instances = group.get("instances") or []
    if not instances:
        return []
    internal = {p["topic"] for publications in group["outputs"].values() for p in publications}
    try:
        outputs = plan_instance(instances[0]["name"], instances[0]["siddhi"]).outputs
    except InstancePlanError:  # a sink workers cannot run is reported by the worker, not here
        return []
    return [{"topic": o.topic, "partitions": o.partitions} for o in outputs if not o.bootstrap and not o.nats and o.topic not in internal]


def build_asset_specs(snapshot: dict, translator: SpDagsterTranslator | None = None) -> list[dg.AssetSpec]:
    """Partial-app, aggregation and topic specs of every deployment in a snapshot (a topic two apps share appears once)."""
    translator = translator or SpDagsterTranslator()
    props: list[SiddhiAssetProps] = []
    topics: dict[str, tuple[dict, dict]] = {}
    producers: dict[str, list[dg.AssetKey]] = {}
    reads: dict[dg.AssetKey, list[dg.AssetKey]] = {}
    read: set[str] = set()  # topics some partial app reads
    for deployment in sorted(snapshot["deployments"], key=lambda d: d["app"]):
        app, plan = deployment["app"], deployment["plan"]
        for topic in plan.get("topics", []):
            topics.setdefault(topic["name"], (topic, deployment))
        aggregations = deployment_aggregations(deployment)
        props += [SiddhiAssetProps("aggregation", app, deployment, aggregation=a) for a in aggregations]
        for group in plan.get("groups", []):
            partial = SiddhiAssetProps("partial_app", app, deployment, group=group)
            props.append(partial)
            # a group joining an aggregation of another group reads it through the store
            reads[partial.default_key] = [aggregation_key(app, a["name"]) for a in aggregations if group["name"] in a["readers"]]
            for publication in [p for publications in group["outputs"].values() for p in publications] + _user_sinks(group):
                producers.setdefault(publication["topic"], []).append(partial.default_key)
                topics.setdefault(publication["topic"], ({"name": publication["topic"], "partitions": publication["partitions"]}, deployment))
            for subscription in group["inputs"].values():
                if subscription.get("topic"):
                    topics.setdefault(subscription["topic"], ({"name": subscription["topic"], "partitions": 0}, deployment))
                    read.add(subscription["topic"])
    props += [
        SiddhiAssetProps(
            "topic",
            deployment["app"],
            deployment,
            topic=topic,
            producers=tuple(producers.get(name, ())),
            read=name in read,
            freshness_minutes=snapshot.get(FRESHNESS) or 0,
        )
        for name, (topic, deployment) in sorted(topics.items())
    ]
    return _translate(props, translator, reads)


def _translate(props: list[SiddhiAssetProps], translator: SpDagsterTranslator, reads: dict) -> list[dg.AssetSpec]:
    """Each props' spec from the translator, its deps renamed from default keys to translated ones."""
    specs = [translator.get_asset_spec(p) for p in props]
    renamed = {p.default_key: s.key for p, s in zip(props, specs)}
    seen: dict[dg.AssetKey, int] = {}
    for spec in specs:
        seen[spec.key] = seen.get(spec.key, 0) + 1
    clashes = sorted(k.to_user_string() for k, n in seen.items() if n > 1)
    if clashes:
        raise TranslatorError(f"two partial apps or topics map to one asset key: {', '.join(clashes)}; change the translator's keys")
    return [
        spec.replace_attributes(deps=[renamed.get(d.asset_key, d.asset_key) for d in spec.deps] + [renamed[k] for k in reads.get(p.default_key, [])])
        for p, spec in zip(props, specs)
    ]


def control_plane_spec(snapshot: dict) -> dg.AssetSpec:
    """An asset that says where the graph came from, and why it is empty when it is."""
    apps = [d["app"] for d in snapshot["deployments"]]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snapshot["fetched_at"]))
    if snapshot["error"]:
        text = f"The partial-app graph is empty: the control plane could not be read ({snapshot['error']})."
    elif not apps:
        text = "No app is deployed yet: drop a .siddhi file into the app repository, or run `sp-dagster deploy APP.siddhi`."
    else:
        text = f"The partial-app graph shows {counted(len(apps), 'deployment')}: {', '.join(apps)}."
    return dg.AssetSpec(
        key=CONTROL_PLANE_KEY,
        group_name="sp_dagster",
        description=f"{text} Read at {when}; reload the code location to read it again.",
        metadata={
            "control_plane": snapshot["control_plane"] or "unknown",
            "deployments": dg.MetadataValue.json(apps),
            "error": snapshot["error"] or "",
            "read_at": dg.MetadataValue.timestamp(snapshot["fetched_at"]),
            "recent_changes": dg.MetadataValue.md(_changes_table(snapshot.get("changes", []))),
        },
    )


def _changes_table(changes: list[dict]) -> str:
    """The recent changes made through the manager API (who, what, when) as a Markdown table."""
    if not changes:
        return "none through the manager API"
    rows = ["| when (UTC) | user | action | app |", "| --- | --- | --- | --- |"]
    rows += [f"| {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(c['at_ms'] / 1000))} | {c['user']} | {c['action']} | {c['app'] or '-'} |" for c in changes]
    return "\n".join(rows)


class DeploymentsLoader(StateBackedDefinitionsLoader[str]):
    """Definitions from the recorded deployments: read at code-location load, replayed in run workers."""

    def __init__(self, control_plane: ControlPlaneResource, build, translator: SpDagsterTranslator | None = None):
        self.control_plane = control_plane
        self.build = build  # (snapshot, specs) -> Definitions holding the specs and what depends on them
        self.translator = translator or SpDagsterTranslator()

    @property
    def defs_key(self) -> str:
        """Where the snapshot sits in the reconstruction metadata."""
        return DEFS_KEY

    def fetch_state(self) -> str:
        """Read the control plane (only when the code location initializes)."""
        return json.dumps(fetch_deployments(self.control_plane), sort_keys=True)

    def defs_from_state(self, state: str) -> dg.Definitions:
        """The definitions of a snapshot (at load, and again in every run worker)."""
        snapshot = json.loads(state)
        snapshot[FINGERPRINT] = graph_fingerprint(snapshot)  # of what was read, even when it cannot be shown
        try:
            specs = build_asset_specs(snapshot, self.translator)
        except Exception as exc:  # a plan this version cannot read must not break the code location
            snapshot = {**snapshot, "deployments": [], "error": f"the recorded plans could not be turned into assets: {exc}"}
            specs = []
        return self.build(snapshot, [control_plane_spec(snapshot), *specs])
