"""The batch wire format of inter-group topics: events round-trip with their times, keys and origins, and bad bytes are refused."""

from __future__ import annotations

import pytest

from sp_dagster.errors import EventDecodeError
from sp_dagster.messaging import batches
from sp_dagster.messaging.codecs import BinaryCodec

ATTRIBUTES = [("symbol", "string"), ("price", "double")]


def _events(count: int):
    codec = BinaryCodec(ATTRIBUTES)
    stamps = [1_000 + i if i % 3 else None for i in range(count)]
    keys = [f"k{i % 4}".encode() if i % 5 else None for i in range(count)]
    origins = [f"g>t:0>s|{i}.1".encode() if i % 7 else None for i in range(count)]
    values = [codec.encode((f"S{i}", i / 4)) for i in range(count)]
    return stamps, keys, origins, values


def test_events_round_trip_with_their_times_keys_and_origins():
    stamps, keys, origins, values = _events(50)
    body = batches.encode(stamps, keys, origins, values)
    assert batches.is_batch(body) and not batches.is_batch(values[0])
    assert batches.decode(body) == (stamps, keys, origins, values)
    assert batches.origins(body) == [o for o in origins if o is not None]


def test_the_binary_codec_reads_every_event_of_a_batch():
    stamps, keys, origins, values = _events(5)
    codec = BinaryCodec(ATTRIBUTES)
    assert codec.decode(batches.encode(stamps, keys, origins, values)) == [(f"S{i}", i / 4) for i in range(5)]


def test_large_runs_are_cut_below_the_size_aimed_at_and_keep_their_order():
    stamps, keys, origins, values = _events(400)
    cut = batches.encode_all(stamps, keys, origins, values, max_bytes=2_000)
    assert len(cut) > 5
    assert all(len(body) <= 2_000 + 64 for _stamp, body in cut)
    joined = [list(part) for part in zip(*(batches.decode(body) for _stamp, body in cut))]
    assert [sum(column, []) for column in joined] == [stamps, keys, origins, values]
    assert [stamp for stamp, _body in cut] == [batches.decode(body)[0][0] for _stamp, body in cut]


def test_one_event_larger_than_the_limit_still_goes_alone():
    stamps, keys, origins, values = _events(3)
    values[1] = b"\xb1" + b"x" * 5_000
    cut = batches.encode_all(stamps, keys, origins, values, max_bytes=1_000)
    assert [batches.decode(body)[3] for _stamp, body in cut] == [[values[0]], [values[1]], [values[2]]]


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda body: body[:-3], "bytes more or less"),
        (lambda body: body + b"zz", "bytes more or less"),
        (lambda body: body[:5], "truncated batch"),
        (lambda body: bytes([batches.MAGIC, 9]) + body[2:], "wire version 9"),
        (lambda body: b"\xb1" + body[1:], "not a batch"),
    ],
)
def test_bad_bytes_are_refused_with_the_reason(mangle, reason):
    body = batches.encode(*_events(4))
    with pytest.raises(EventDecodeError, match=reason):
        batches.decode(mangle(body))


EVERY_TYPE = [("s", "string"), ("i", "int"), ("l", "long"), ("f", "float"), ("d", "double"), ("b", "bool"), ("o", "object")]


def _rows(count: int) -> list[tuple]:
    """Rows of every type, with nulls here and there and text that is not all ASCII."""
    rows = []
    for n in range(count):
        row = (f"sym-{n}" + ("é✓" if n % 4 == 0 else ""), n - 50, n * 10**12, n / 2, n / 3, n % 2 == 0, {"n": n, "tags": ["a", n]})
        rows.append(tuple(None if (n + index) % 5 == 0 else value for index, value in enumerate(row)))
    return rows


@pytest.mark.parametrize("count", [1, 7, 8, 9, 200])
def test_rows_round_trip_by_column_with_their_times_keys_origins_and_nulls(count):
    codec = BinaryCodec(EVERY_TYPE)
    rows = _rows(count)
    stamps, keys, origins, _values = _events(count)
    ((stamp, body),) = batches.encode_rows(stamps, keys, origins, rows, codec)
    assert stamp == stamps[0] and batches.is_batch(body) and body[1] == batches.COLUMNS
    assert batches.decode(body, codec) == (stamps, keys, origins, rows)
    assert codec.decode(body) == rows  # what `consume` of an inter-group topic reads
    assert batches.origins(body) == [o for o in origins if o is not None]


def test_a_batch_by_column_is_cut_below_the_size_aimed_at_and_keeps_its_order():
    codec = BinaryCodec(EVERY_TYPE)
    rows = _rows(300)
    stamps, keys, origins, _values = _events(300)
    cut = batches.encode_rows(stamps, keys, origins, rows, codec, max_bytes=2_000)
    assert len(cut) > 5 and all(len(body) <= 2_000 for _stamp, body in cut)
    decoded = [batches.decode(body, codec) for _stamp, body in cut]
    assert [sum((list(d[part]) for d in decoded), []) for part in range(4)] == [stamps, keys, origins, rows]
    assert [stamp for stamp, _body in cut] == [d[0][0] for d in decoded]


def test_a_batch_by_column_read_without_its_schema_or_with_bad_bytes_is_refused():
    codec = BinaryCodec(EVERY_TYPE)
    stamps, keys, origins, _values = _events(6)
    ((_stamp, body),) = batches.encode_rows(stamps, keys, origins, _rows(6), codec)
    with pytest.raises(EventDecodeError, match="without its topic's attributes"):
        batches.decode(body)
    for mangled in (body[:-3], body + b"zz", body[:40]):
        with pytest.raises(EventDecodeError, match="corrupt|truncated"):
            batches.decode(mangled, codec)
    with pytest.raises(EventDecodeError, match="corrupt"):
        batches.decode(body, BinaryCodec(EVERY_TYPE[:3]))  # read as another stream's events
