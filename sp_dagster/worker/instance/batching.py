"""Inter-group topics carry batches: what an instance reads there is cut into its events, what it publishes there is packed.

An instance publishes what one turn produced for a partition of an inter-group topic as one
message (`messaging/batches.py`), and its reader hands the engine each event of a batch as the
message it once was: its own timestamp, key and origin, and its place in the batch (`index`).
Single-event messages (`sp-dagster produce`, an app planned before batches) read as before. The
plan records each topic's wire format on its map (`wire`); an app planned before batches has
none, so its instances go on publishing one event per message, which workers of that time read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from sp_dagster.errors import EventDecodeError
from sp_dagster.messaging import batches
from sp_dagster.messaging.maps import MapSpec
from sp_dagster.siddhi.transports import BATCH_WIRE, EVENT_WIRE
from sp_dagster.worker.instance.plan import InstancePlan
from sp_dagster.worker.instance.runtime import Message

_new = tuple.__new__  # makes a Message without its __new__'s keyword handling: one per event

log = logging.getLogger(__name__)

#: The map of inter-group topics (topology/partial_apps.MAPPING): their messages are batches.
BATCHED_MAP = "binary"


def batched_inputs(plan: InstancePlan) -> frozenset[str]:
    """The input topics whose messages may be batches (those between execution groups)."""
    return frozenset(i.topic for i in plan.inputs if i.codec == BATCHED_MAP)


def batched_outputs(plan: InstancePlan) -> frozenset[str]:
    """The output topics the instance publishes batches to (those between execution groups whose plan says so)."""
    return frozenset(t for o in plan.outputs if o.codec == BATCHED_MAP and wire_of(o.mapping) == BATCH_WIRE for t in (o.topic, *o.topics) if t)


def wire_of(mapping: MapSpec | None) -> str:
    """The wire format a binary map records (one event per message when it records none)."""
    return (mapping.option("wire") if mapping is not None else None) or EVENT_WIRE


def expand(topic: str, raws: Iterable[Sequence]) -> list[Message]:
    """Messages from raw (partition, offset, timestamp, key, value, origin) ones of an inter-group topic,
    each batch cut into its events; a batch that cannot be read stays whole (the engine rejects it, with the reason logged)."""
    out: list[Message] = []
    for partition, offset, stamp, key, value, origin in raws:
        if origin is not None or not batches.is_batch(value):
            out.append(Message(topic, partition, offset, stamp, key, value, origin))
            continue
        try:
            stamps, keys, origins, values = batches.decode(value)
        except EventDecodeError as exc:
            log.error("%s[%d]@%d: %s", topic, partition, offset, exc)
            out.append(Message(topic, partition, offset, stamp, key, value, origin))
            continue
        out += [_new(Message, (topic, partition, offset, *event, index)) for index, event in enumerate(zip(stamps, keys, values, origins))]
    return out


def pack(messages: list[Message], topics: frozenset[str], max_bytes: int = batches.MAX_BYTES) -> list[Message]:
    """`messages` with those to `topics` packed into one batch per partition (more when larger than `max_bytes`), in their order."""
    if not topics:
        return messages
    kept: list[Message] = []
    groups: dict[tuple[str, int], list[Message]] = {}
    for message in messages:
        if message.topic in topics and message.partition >= 0:
            groups.setdefault((message.topic, message.partition), []).append(message)
        else:
            kept.append(message)
    for (topic, partition), group in groups.items():
        _t, _p, _o, stamps, keys, values, origins, _i = zip(*group)
        kept += [Message(topic, partition, -1, stamp, None, body) for stamp, body in batches.encode_all(stamps, keys, origins, values, max_bytes)]
    return kept
