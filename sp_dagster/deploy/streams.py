"""Find the topic behind a stream of a deployed app, with its codec and attributes."""

from __future__ import annotations

from dataclasses import dataclass

from sp_dagster.deploy.errors import DeployError
from sp_dagster.messaging.codecs import Attribute


@dataclass(frozen=True)
class StreamTopic:
    """The topic that carries a stream, how its events are encoded, and their attributes."""

    app: str
    stream: str
    topic: str
    codec: str
    attributes: tuple[Attribute, ...]


def parse_target(target: str) -> tuple[str, str]:
    """APP:STREAM -> (app, stream)."""
    app, sep, stream = target.partition(":")
    if not sep or not app or not stream:
        raise DeployError(f"expected APP:STREAM (for example StockAlerts:TradeStream), got {target!r}")
    return app, stream


def stream_topic(plane, app: str, stream: str, *, writing: bool) -> StreamTopic:
    """The topic of `stream` in deployed `app`: one its instances read (writing) or publish (reading)."""
    from sp_dagster.cluster.store.deployments import get_deployment
    from sp_dagster.worker.instance_plan import plan_instance

    record = get_deployment(plane, app)
    if record is None:
        raise DeployError(f"no deployment named '{app}'; `sp-dagster status` lists the deployments")
    streams: set[str] = set()
    for group in record.plan.get("groups", []):
        for instance in group.get("instances", [])[:1]:
            plan = plan_instance(instance["name"], instance["siddhi"])
            ends = list(plan.outputs) + list(plan.inputs) if not writing else list(plan.inputs)
            for end in ends:
                streams.add(end.stream)
                if end.stream == stream and not end.bootstrap and not end.nats:  # not another cluster, nor a user NATS
                    return StreamTopic(app, stream, end.topic, end.codec, end.attributes)
    verb = "read from a topic" if writing else "on a topic"
    known = ", ".join(sorted(streams)) or "none"
    hint = "" if writing else _unconsumed(record, stream)
    raise DeployError(f"stream '{stream}' of '{app}' is not {verb} of the cluster's messaging layer; streams that are: {known}{hint}")


def _unconsumed(record, stream: str) -> str:
    """`; <what to add>` when `stream` is one the app writes but nothing reads or publishes, else ''."""
    from sp_dagster.siddhi import parse
    from sp_dagster.topology.analysis import unconsumed_note, unconsumed_streams

    if any(write.name == stream for write in unconsumed_streams(parse(record.source))):
        return f"; {unconsumed_note(record.app, stream)}"
    return ""
