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
    """The topic of `stream` in deployed `app`: an entry topic its instances read (writing: what comes from
    outside, never a topic between execution groups) or one they publish or read (reading)."""
    from sp_dagster.cluster.store.deployments import get_deployment
    from sp_dagster.worker.instance.plan import plan_instance

    record = get_deployment(plane, app)
    if record is None:
        raise DeployError(f"no deployment named '{app}'; `sp-dagster status` lists the deployments")
    plans = [plan_instance(group["instances"][0]["name"], group["instances"][0]["siddhi"]) for group in record.plan.get("groups", []) if group.get("instances")]
    on_cluster = lambda end: not end.bootstrap and not end.nats  # noqa: E731  (not another cluster, nor a user NATS)
    published = {(t, plan.name.rsplit("-", 1)[0]) for plan in plans for o in plan.outputs if on_cluster(o) for t in (o.topic, *o.topics) if t}
    internal = {topic for topic, _writer in published}
    ends = [end for plan in plans for end in (plan.inputs if writing else [*plan.outputs, *plan.inputs]) if on_cluster(end)]
    if writing:
        inside = next((end for end in ends if end.stream == stream and end.topic in internal), None)
        ends = [end for end in ends if end.topic not in internal]
        if inside is not None and not any(end.stream == stream for end in ends):
            writers = sorted(writer for topic, writer in published if topic == inside.topic)
            raise DeployError(
                f"stream '{stream}' of '{app}' is internal: its events come from {', '.join(writers)}, and events written there "
                f"would skip the queries before it; write to an entry stream instead: {', '.join(sorted({e.stream for e in ends})) or 'none'}"
            )
    for end in ends:
        if end.stream == stream:
            return StreamTopic(app, stream, end.topic, end.codec, end.attributes)
    verb = "read from a topic" if writing else "on a topic"
    known = ", ".join(sorted({end.stream for end in ends})) or "none"
    hint = "" if writing else _unconsumed(record, stream)
    raise DeployError(f"stream '{stream}' of '{app}' is not {verb} of the cluster's messaging layer; streams that are: {known}{hint}")


def _unconsumed(record, stream: str) -> str:
    """`; <what to add>` when `stream` is one the app writes but nothing reads or publishes, else ''."""
    from sp_dagster.siddhi import parse
    from sp_dagster.topology.analysis import unconsumed_note, unconsumed_streams

    if any(write.name == stream for write in unconsumed_streams(parse(record.source))):
        return f"; {unconsumed_note(record.app, stream)}"
    return ""
