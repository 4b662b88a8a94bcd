"""Event batches, the wire format of inter-group topics: the events one turn of an instance published
to one topic partition, in one message, each with its own timestamp, key and origin. Version 1
(`batch/1`) holds each value encoded on its own, version 2 (`batch/2`) the values column by column.
A message's first byte tells a batch (0xB2) from a single event (0xB1).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import accumulate
from typing import Any, Protocol

from sp_dagster.messaging.errors import EventDecodeError
from sp_dagster.siddhi.transports import BATCH_WIRE, COLUMN_WIRE

MAGIC = 0xB2
VERSION = int(BATCH_WIRE.rpartition("/")[2])  # the plans' names for these formats: `BATCH_WIRE`, `COLUMN_WIRE`
COLUMNS = int(COLUMN_WIRE.rpartition("/")[2])


class Columns(Protocol):
    """What writes and reads the events' values of a version-2 batch column by column (`BinaryCodec`)."""

    def encode_columns(self, rows: Sequence[Sequence[Any]]) -> bytes: ...

    def decode_columns(self, data: bytes, pos: int, count: int) -> list[tuple]: ...


# The layout, all little-endian: magic 0xB2, the version, u32 count (_HEAD); then count i64 timestamps
# (-1: none), i32 key lengths and i32 origin lengths (-1: none). Version 1 goes on with u32 value lengths,
# the keys, the origins and the values (each event as `BinaryCodec` encodes it), each concatenated;
# version 2 with the keys and origins, then the values column by column (`BinaryCodec.encode_columns`):
# no per-event encoding either way. 0xB1 starts a single event instead (what publishers wrote before batches).
_HEAD = struct.Struct("<BBI")
#: Largest batch body aimed at (bytes): well below the 1 MB that brokers and clients take by default.
MAX_BYTES = 256 * 1024
_PER_EVENT = 20  # the bytes a batch spends on one event besides its key, origin and value


def is_batch(data: bytes | None) -> bool:
    """True when a message's value is a batch (not a single event)."""
    return bool(data) and data[0] == MAGIC  # type: ignore[index]


def encode_all(
    stamps: Sequence[int | None], keys: Sequence[bytes | None], origins: Sequence[bytes | None], values: Sequence[bytes], max_bytes: int = MAX_BYTES
) -> list[tuple[int | None, bytes]]:
    """Events as batches of at most about `max_bytes` each (one event at least): (the first event's timestamp, the batch)."""
    total = sum(map(len, values)) + sum(len(k) for k in keys if k) + sum(len(o) for o in origins if o) + _PER_EVENT * len(values)
    if total <= max_bytes:  # the common case: all in one batch
        return [(stamps[0], encode(stamps, keys, origins, values))] if values else []
    out, first, size = [], 0, 0
    for index, value in enumerate(values):
        key, origin = keys[index], origins[index]
        grown = size + len(value) + _PER_EVENT + (len(key) if key else 0) + (len(origin) if origin else 0)
        if grown > max_bytes and index > first:
            out.append((stamps[first], encode(stamps[first:index], keys[first:index], origins[first:index], values[first:index])))
            first, grown = index, grown - size
        size = grown
    if first < len(values):
        rest = slice(first, None) if first else slice(None)
        out.append((stamps[first], encode(stamps[rest], keys[rest], origins[rest], values[rest])))
    return out


def encode_rows(
    stamps: Sequence[int | None],
    keys: Sequence[bytes | None],
    origins: Sequence[bytes | None],
    rows: Sequence[Sequence[Any]],
    columns: Columns,
    max_bytes: int = MAX_BYTES,
) -> list[tuple[int | None, bytes]]:
    """Events given as rows in version-2 batches of at most about `max_bytes` each (one event at least): (the first event's timestamp, the batch)."""
    if not rows:
        return []
    count = len(rows)
    body = b"".join((_HEAD.pack(MAGIC, COLUMNS, count), _frame(stamps, keys, origins), columns.encode_columns(rows)))
    if len(body) <= max_bytes or count == 1:
        return [(stamps[0], body)]
    half = count // 2
    first = encode_rows(stamps[:half], keys[:half], origins[:half], rows[:half], columns, max_bytes)
    return first + encode_rows(stamps[half:], keys[half:], origins[half:], rows[half:], columns, max_bytes)


def _frame(stamps: Sequence[int | None], keys: Sequence[bytes | None], origins: Sequence[bytes | None], value_lengths: Sequence[int] | None = None) -> bytes:
    """A batch's times, key and origin lengths (and value lengths: version 1), then its keys and origins."""
    count = len(stamps)
    return b"".join(
        (
            struct.pack(f"<{count}q", *[-1 if s is None else s for s in stamps]),
            struct.pack(f"<{count}i", *[-1 if k is None else len(k) for k in keys]),
            struct.pack(f"<{count}i", *[-1 if o is None else len(o) for o in origins]),
            struct.pack(f"<{count}I", *value_lengths) if value_lengths is not None else b"",
            b"".join([k for k in keys if k]),
            b"".join([o for o in origins if o]),
        )
    )


def encode(stamps: Sequence[int | None], keys: Sequence[bytes | None], origins: Sequence[bytes | None], values: Sequence[bytes]) -> bytes:
    """One batch of events (parallel sequences: timestamp in ms or None, key, origin, encoded value)."""
    return b"".join((_HEAD.pack(MAGIC, VERSION, len(values)), _frame(stamps, keys, origins, [len(v) for v in values]), *values))


def decode(data: bytes, columns: Columns | None = None) -> tuple[list[int | None], list[bytes | None], list[bytes | None], list]:
    """A batch's events as parallel lists: timestamps (ms or None), keys, origins and values (version 1: each event's
    encoded bytes; version 2: its row, read by `columns`); EventDecodeError when it is not one."""
    stamps, keys, origins, count, value_lengths, pos = _header(data)
    if value_lengths is not None:
        values, pos = _cut(data, pos, value_lengths)
        if pos != len(data):
            raise EventDecodeError(f"corrupt batch of events: {len(data) - pos} bytes more or less than its {count} events hold")
        return stamps, keys, origins, values
    if columns is None:
        raise EventDecodeError("a batch of events by column, read without its topic's attributes: read it with the topic's binary codec")
    try:
        return stamps, keys, origins, columns.decode_columns(data, pos, count)
    except EventDecodeError as exc:
        raise EventDecodeError(f"corrupt batch of events: {exc}") from None


def _header(data: bytes) -> tuple[list[int | None], list[bytes | None], list[bytes | None], int, Sequence[int] | None, int]:
    """A batch's times, keys and origins, its count, its values' lengths (version 1; None: by column) and where the rest begins."""
    try:
        magic, version, count = _HEAD.unpack_from(data, 0)
        if magic != MAGIC:
            raise EventDecodeError("not a batch of events (wrong codec on this topic?)")
        if version not in (VERSION, COLUMNS):
            raise EventDecodeError(
                f"a batch of wire version {version}, which this version of sp-dagster cannot read (it reads {VERSION} and {COLUMNS}): upgrade this worker"
            )
        pos = _HEAD.size
        stamps = list(struct.unpack_from(f"<{count}q", data, pos))
        pos += 8 * count
        key_lengths = struct.unpack_from(f"<{count}i", data, pos)
        origin_lengths = struct.unpack_from(f"<{count}i", data, pos + 4 * count)
        pos += 8 * count
        value_lengths = None
        if version == VERSION:
            value_lengths = struct.unpack_from(f"<{count}I", data, pos)
            pos += 4 * count
    except struct.error as exc:
        raise EventDecodeError(f"truncated batch of events: {exc}") from None
    keys, pos = _cut(data, pos, key_lengths)
    origins, pos = _cut(data, pos, origin_lengths)
    return [None if s < 0 else s for s in stamps] if -1 in stamps else stamps, keys, origins, count, value_lengths, pos  # type: ignore[return-value]


def _cut(data: bytes, pos: int, lengths: Sequence[int]) -> tuple[list, int]:
    """The pieces of `data` of these lengths from `pos` on (None for a negative length), and where they end."""
    if not lengths:
        return [], pos
    if min(lengths) >= 0:  # every piece present (values; origins and keys mostly): cut at the running sums
        ends = list(accumulate(lengths, initial=pos))
        return [data[start:end] for start, end in zip(ends, ends[1:])], ends[-1]
    if max(lengths) < 0:  # none present (keys mostly)
        return [None] * len(lengths), pos
    pieces: list = []
    append = pieces.append
    for length in lengths:
        if length < 0:
            append(None)
        else:
            end = pos + length
            append(data[pos:end])
            pos = end
    return pieces, pos


def origins(data: bytes) -> list[bytes]:
    """The origins a batch's events carry (for reading back what was published)."""
    return [o for o in _header(data)[2] if o is not None]
