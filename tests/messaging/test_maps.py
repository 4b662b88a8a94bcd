"""Siddhi's maps: each one's default form round-trips, custom mappings read other shapes, and what
does not decode says why (the reason a dead letter or an HTTP 400 carries)."""

from __future__ import annotations

import pytest

from sp_dagster.errors import EventDecodeError
from sp_dagster.messaging.maps import MapSpec, mapper_for

A = [("symbol", "string"), ("price", "double"), ("volume", "long")]
ROW = ("WSO2", 55.6, 100)


@pytest.mark.parametrize("kind", ["json", "text", "csv", "keyvalue", "xml", "binary"])
def test_default_forms_round_trip(kind):
    mapper = mapper_for(MapSpec(kind), A)
    assert mapper.decode(mapper.encode(ROW)) == [ROW]


def test_default_forms_are_siddhis():
    assert mapper_for(MapSpec("json"), A).encode(ROW) == b'{"event":{"symbol":"WSO2","price":55.6,"volume":100}}'
    assert mapper_for(MapSpec("text"), A).encode(ROW) == b'symbol:"WSO2",\nprice:55.6,\nvolume:100'
    assert mapper_for(MapSpec("xml"), A).encode(ROW) == b"<events><event><symbol>WSO2</symbol><price>55.6</price><volume>100</volume></event></events>"


def test_custom_mappings():
    json_map = MapSpec("json", (("enclosing.element", "$.portfolio"),), (("symbol", "$.stock.sym"), ("price", "$.stock.p"), ("volume", "$.v")))
    data = b'{"portfolio":[{"stock":{"sym":"A","p":1},"v":3},{"stock":{"sym":"B","p":2.5},"v":4}]}'
    assert mapper_for(json_map, A).decode(data) == [("A", 1.0, 3), ("B", 2.5, 4)]
    xml_map = MapSpec("xml", (("enclosing.element", "/portfolio"),), (("symbol", "stock/@sym"), ("price", "price"), ("volume", "volume")))
    assert mapper_for(xml_map, A).decode(b'<portfolio><e><stock sym="A"/><price>1</price><volume>3</volume></e></portfolio>') == [("A", 1.0, 3)]
    text_map = MapSpec("text", (("regex.A", r"(\w+)\s([-0-9.]+)\s(\d+)"),), (("symbol", "A[1]"), ("price", "A[2]"), ("volume", "A[3]")))
    assert mapper_for(text_map, A).decode(b"IBM 12.5 7") == [("IBM", 12.5, 7)]
    csv_map = MapSpec("csv", (("header", "true"),), ((None, "2"), (None, "0"), (None, "1")))
    assert mapper_for(csv_map, A).decode(b"p,v,s\n1.5,7,X\n2,8,Y") == [("X", 1.5, 7), ("Y", 2.0, 8)]
    assert mapper_for(MapSpec("keyvalue", (), (("symbol", "s"), ("price", "p"), ("volume", "v"))), A).decode(b"s=Z&p=3&v=9") == [("Z", 3.0, 9)]


def test_payload_templates():
    assert mapper_for(MapSpec("text", payload="{{symbol}} costs {{price}} ({{volume}})"), A).encode(ROW) == b"WSO2 costs 55.6 (100)"
    assert mapper_for(MapSpec("json", payload='{"s":"{{symbol}}"}'), A).encode(ROW) == b'{"s":"WSO2"}'


@pytest.mark.parametrize(
    "kind, data, reason",
    [
        ("json", b"{", "not valid JSON"),
        ("json", b'{"event":{"symbol":"A"}}', "missing attributes 'price', 'volume'"),
        ("xml", b"<events><event><symbol>x</symbol><price>z</price><volume>1</volume></event></events>", "attribute 'price': expected double, got 'z'"),
        ("csv", b"a,b", "expected 3 values"),
        ("text", b"no form here", "not Siddhi's text form"),
        ("keyvalue", b"symbol=A&price=1", "missing attribute 'volume'"),
    ],
)
def test_what_does_not_decode_says_why(kind, data, reason):
    with pytest.raises(EventDecodeError) as caught:
        mapper_for(MapSpec(kind), A).decode(data)
    assert reason in str(caught.value)


def test_missing_attributes_may_be_null():
    spec = MapSpec("xml", (("fail.on.missing.attribute", "false"),))
    assert mapper_for(spec, A).decode(b"<events><event><symbol>x</symbol></event></events>") == [("x", None, None)]
