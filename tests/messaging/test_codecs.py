"""Event codecs: round trips, Siddhi's JSON shapes, and clear reasons for bad events."""

import json
import math
import random
import struct

import pytest

from sp_dagster.errors import EventDecodeError
from sp_dagster.messaging.codecs import BinaryCodec, JsonCodec, codec_for

SCHEMA = [("symbol", "string"), ("price", "float"), ("volume", "long"), ("count", "int"), ("ratio", "double"), ("ok", "bool"), ("extra", "object")]


@pytest.mark.parametrize("codec_class", [JsonCodec, BinaryCodec])
def test_round_trip(codec_class):
    codec = codec_class(SCHEMA)
    rows = [
        ("IBM", 55.5, 2**40, -7, 0.1, True, {"k": [1, 2]}),
        (None, None, None, None, None, None, None),
        ("ünïcode ☃", -1.25, -(2**63), 2**31 - 1, math.inf, False, "text"),
    ]
    for row in rows:
        assert codec.decode(codec.encode(row)) == [row]


def test_binary_layout_with_and_without_nulls():
    # The documented layout: 0xB1, the null flags, then each non-null value (strings length-prefixed).
    codec = BinaryCodec([("s", "string"), ("d", "double"), ("i", "int"), ("l", "long"), ("b", "bool"), ("n", "string")])
    values = b"\x03\x00\x00\x00IBM" + struct.pack("<d", 1.5) + struct.pack("<i", -7) + struct.pack("<q", 2**40) + b"\x01"
    assert codec.encode(("IBM", 1.5, -7, 2**40, True, "é")) == b"\xb1\x00" + values + b"\x02\x00\x00\x00\xc3\xa9"
    assert codec.encode(("IBM", 1.5, -7, 2**40, True, None)) == b"\xb1\x20" + values
    assert codec.encode((5, 1.5, -7, 2**40, True, "")) == b"\xb1\x00\x01\x00\x00\x005" + values[7:] + b"\x00\x00\x00\x00"
    with pytest.raises(EventDecodeError, match="expected 6 values"):
        codec.encode(("IBM", 1.5, -7, 2**40, True))


def test_binary_float_is_32_bit():
    codec = BinaryCodec([("p", "float")])
    (decoded,) = codec.decode(codec.encode((55.6,)))[0]
    assert decoded != 55.6 and abs(decoded - 55.6) < 1e-5


def test_json_encodes_siddhi_event_shape():
    codec = JsonCodec([("symbol", "string"), ("price", "double")])
    assert json.loads(codec.encode(("IBM", 1.5))) == {"event": {"symbol": "IBM", "price": 1.5}}


def test_json_accepts_bare_objects_value_lists_and_arrays():
    codec = JsonCodec([("symbol", "string"), ("price", "double")])
    assert codec.decode(b'{"symbol": "A", "price": 1}') == [("A", 1.0)]
    assert codec.decode(b'["A", 2.5]') == [("A", 2.5)]
    assert codec.decode(b'[{"event": {"symbol": "A", "price": 1}}, {"symbol": "B", "price": 2}]') == [("A", 1.0), ("B", 2.0)]
    assert codec.decode(b'{"symbol": "A", "price": 1, "ignored": true}') == [("A", 1.0)]


@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"{not json", "not valid JSON"),
        (b'{"symbol": "A"}', "missing attribute 'volume'"),
        (b'{"symbol": 5, "volume": 1}', "attribute 'symbol': expected string, got int 5"),
        (b'{"symbol": "A", "volume": "12"}', "attribute 'volume': expected int, got str '12'"),
        (b'{"symbol": "A", "volume": 3000000000}', "attribute 'volume': 3000000000 is out of range for int"),
        (b'{"symbol": "A", "volume": true}', "attribute 'volume': expected int, got bool True"),
        (b'["A"]', "expected 2 values (symbol, volume), got 1"),
        (b'"just a string"', "expected a JSON object"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_json_rejects_with_reason(payload, reason):
    codec = JsonCodec([("symbol", "string"), ("volume", "int")])
    with pytest.raises(EventDecodeError) as caught:
        codec.decode(payload)
    assert reason in str(caught.value)


@pytest.mark.parametrize(
    "payload, reason", [(b"", "not a binary-encoded event"), (b'{"a":1}', "not a binary-encoded event"), (b"\xb1\x00\x01", "truncated or corrupt")]
)
def test_binary_rejects_with_reason(payload, reason):
    codec = BinaryCodec([("a", "long"), ("b", "string")])
    with pytest.raises(EventDecodeError, match=reason):
        codec.decode(payload)


def test_binary_rejects_trailing_bytes():
    codec = BinaryCodec([("a", "int")])
    with pytest.raises(EventDecodeError, match="trailing"):
        codec.decode(codec.encode((1,)) + b"\x00")


def test_codec_for_and_bad_types():
    assert isinstance(codec_for("JSON", [("a", "int")]), JsonCodec)
    with pytest.raises(ValueError, match="unknown codec"):
        codec_for("xml", [("a", "int")])
    with pytest.raises(ValueError, match="unknown type 'integer'"):
        JsonCodec([("a", "integer")])


def test_json_decode_many_gives_what_decode_gives_message_by_message():
    # A poll's worth read together (user sources): each message's rows or error exactly as decode() alone, whatever
    # the mix: other shapes, values of another type (widened or refused), nulls, wide integers, bad JSON.
    codec = JsonCodec([("symbol", "string"), ("price", "double"), ("volume", "long"), ("ok", "bool"), ("n", "int")])
    shapes = [
        b'{"event":{"symbol":"A","price":1.5,"volume":7,"ok":true,"n":3}}',
        b'{"symbol":"B","price":2.0,"volume":8,"ok":false,"n":-4,"extra":1}',
        b'{"event":{"symbol":"C","price":3,"volume":9,"ok":true,"n":5}}',
        b'{"event":{"symbol":null,"price":null,"volume":null,"ok":null,"n":null}}',
        b'{"event":{"symbol":"D","price":1.0,"volume":1,"ok":true}}',
        b'{"event":{"symbol":"E","price":1.0,"volume":true,"ok":true,"n":1}}',
        b'{"event":{"symbol":"F","price":1.0,"volume":1,"ok":true,"n":3000000000}}',
        b'{"event":{"symbol":"G","price":1.0,"volume":99999999999999999999,"ok":true,"n":1}}',
        b'[{"event":{"symbol":"H","price":1.0,"volume":1,"ok":true,"n":1}},{"symbol":"I","price":2.0,"volume":2,"ok":false,"n":2}]',
        b'["J",1.0,1,true,1]',
        b'{"event":"K"}',
        b"not json",
        b"\xff",
        b"[]",
    ]
    rng = random.Random(11)
    for size in (1, 2, 5, 40):
        for _ in range(60):
            values = [rng.choice(shapes[:2]) if rng.random() < 0.7 else rng.choice(shapes) for _ in range(size)]
            expected = []
            for value in values:
                try:
                    expected.append(codec.decode(value))
                except EventDecodeError as exc:
                    expected.append(str(exc))
            got = [item if isinstance(item, list) else str(item) for item in codec.decode_many(values)]
            assert repr(got) == repr(expected), values  # repr: 3 and 3.0 are equal, but only one is a double
    assert JsonCodec.bulk and codec_for("binary", [("a", "int")]).bulk is False
