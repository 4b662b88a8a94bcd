"""Inter-group topics carry batches: what an instance reads there is cut into its events (`expand`),
what it publishes there is packed (`pack`), per the wire format the plan records on each topic's
map. The reader hands the engine each event of a batch as the message it once was, with its own
timestamp, key, origin and place in the batch (docs/messaging.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from sp_dagster.errors import EventDecodeError
from sp_dagster.messaging import batches
from sp_dagster.messaging.codecs import BinaryCodec
from sp_dagster.siddhi.transports import BATCH_WIRE, COLUMN_WIRE
from sp_dagster.worker.instance.plan import InstancePlan, wire_of
from sp_dagster.worker.instance.runtime import Message

_new = tuple.__new__  # makes a Message without its __new__'s keyword handling: one per event

log = logging.getLogger(__name__)

#: The map of inter-group topics (topology/partial_apps.MAPPING): their messages are batches.
BATCHED_MAP = "binary"


def batched_inputs(plan: InstancePlan) -> dict[str, BinaryCodec]:
    """The input topics whose messages may be batches (those between execution groups), with the codec that reads their events."""
    return {i.topic: BinaryCodec(i.attributes) for i in plan.inputs if i.codec == BATCHED_MAP}


def batched_outputs(plan: InstancePlan) -> dict[str, BinaryCodec | None]:
    """The output topics the instance publishes batches to (those between execution groups whose plan says so), with
    the codec that writes their columns (None: batches of events the runtime encoded, BATCH_WIRE)."""
    return {
        t: BinaryCodec(o.attributes) if o.by_column else None
        for o in plan.outputs
        if o.codec == BATCHED_MAP and wire_of(o.mapping) in (BATCH_WIRE, COLUMN_WIRE)
        for t in (o.topic, *o.topics)
        if t
    }


def expand(topic: str, raws: Iterable[Sequence], codec: BinaryCodec) -> list[Message]:
    """Messages from raw (partition, offset, timestamp, key, value, origin) ones of an inter-group topic, each batch
    cut into its events (by column: each event's row as its value, read by `codec`); a batch that cannot be read
    stays whole (the engine rejects it, with the reason logged). Single-event messages (an app planned before batches,
    which goes on publishing one event per message) and batches of encoded events (BATCH_WIRE) read as before."""
    out: list[Message] = []
    for partition, offset, stamp, key, value, origin in raws:
        if origin is not None or not batches.is_batch(value):
            out.append(Message(topic, partition, offset, stamp, key, value, origin))
            continue
        try:
            stamps, keys, origins, values = batches.decode(value, codec)
        except EventDecodeError as exc:
            log.error("%s[%d]@%d: %s", topic, partition, offset, exc)
            out.append(Message(topic, partition, offset, stamp, key, value, origin))
            continue
        out += [_new(Message, (topic, partition, offset, *event, index)) for index, event in enumerate(zip(stamps, keys, values, origins))]
    return out


def pack(messages: list[Message], topics: Mapping[str, BinaryCodec | None], max_bytes: int = batches.MAX_BYTES) -> list[Message]:
    """`messages` with those to `topics` packed into one batch per partition (more when larger than `max_bytes`), in their
    order: by column where `topics` gives a codec (their values are rows: COLUMN_WIRE, what plans record now, so no
    event is encoded on its own), else of the encoded values."""
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
        columns = topics[topic]
        made = (
            batches.encode_rows(stamps, keys, origins, values, columns, max_bytes) if columns else batches.encode_all(stamps, keys, origins, values, max_bytes)
        )
        kept += [Message(topic, partition, -1, stamp, None, body) for stamp, body in made]
    return kept
