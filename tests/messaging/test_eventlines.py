"""Event lines: non-finite floats are written as Siddhi prints them (valid JSON) and read back."""

from __future__ import annotations

import json
import math

import pytest

from sp_dagster.errors import EventDecodeError
from sp_dagster.messaging.eventlines import decode_event_line, encode_event_line

ATTRIBUTES = [("average", "double"), ("low", "float"), ("ratio", "double"), ("label", "string")]


def test_infinities_and_nan_are_written_as_siddhi_text_in_strict_json_and_read_back():
    line = encode_event_line("S", [math.inf, -math.inf, math.nan, "Infinity"], 7, [t for _n, t in ATTRIBUTES])
    document = json.loads(line, parse_constant=lambda token: (_ for _ in ()).throw(AssertionError(f"{token} is not JSON")))
    assert document == {"stream": "S", "data": ["Infinity", "-Infinity", "NaN", "Infinity"], "timestamp": 7}
    stream, row, stamp = decode_event_line(line, lambda _s: ATTRIBUTES)
    assert (stream, stamp) == ("S", 7)
    assert row[0] == math.inf and row[1] == -math.inf and math.isnan(row[2]) and row[3] == "Infinity"  # a string stays a string


def test_other_text_for_a_double_is_still_refused():
    with pytest.raises(EventDecodeError, match="average': expected double, got str 'inf'"):
        decode_event_line('{"stream": "S", "data": ["inf", 1.0, 2.0, "x"]}', lambda _s: ATTRIBUTES)
