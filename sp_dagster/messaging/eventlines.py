"""Events as JSON lines, {"stream": "S", "data": [...], "timestamp": ms}: the one form events take in
files and on the command line (`sp-dagster run`, `produce`, `consume`), checked against the stream's
attribute types when read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sp_dagster.errors import EventDecodeError
from sp_dagster.javatext import java_str
from sp_dagster.messaging.codecs import Attribute, check_value, schema_of


def decode_event_line(
    line: str, attributes_of: Callable[[str], Sequence[Attribute | tuple[str, str]]], default_stream: str | None = None
) -> tuple[str, tuple, int | None]:
    """(stream, row, timestamp) from one line (attributes as Attributes or (name, type) pairs); EventDecodeError says what does not fit.

    `data` is a list of values or an object keyed by attribute name; a float or double may be the text
    "Infinity", "-Infinity" or "NaN", as Siddhi prints it (JSON has none of them), and is read back as one."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise EventDecodeError(f"not valid JSON: {exc}") from None
    if isinstance(item, dict) and "data" not in item and default_stream is not None:
        item = {"stream": default_stream, "data": item}
    if not isinstance(item, dict) or "data" not in item or ("stream" not in item and default_stream is None):
        raise EventDecodeError('expected an object like {"stream": "S", "data": [...], "timestamp": 1000}')
    stream = item.get("stream", default_stream)
    attributes = list(schema_of(attributes_of(stream)))
    names = [a.name for a in attributes]
    data = item["data"]
    if isinstance(data, dict):
        missing = [n for n in names if n not in data]
        if missing:
            raise EventDecodeError(f"stream '{stream}' needs {', '.join(missing)}")
        unknown = [k for k in data if k not in names]
        if unknown:
            raise EventDecodeError(f"stream '{stream}' has no attribute {', '.join(unknown)}")
        data = [data[n] for n in names]
    if not isinstance(data, list) or len(data) != len(attributes):
        described = ", ".join(f"{a.name} {a.type}" for a in attributes)
        raise EventDecodeError(f"stream '{stream}' takes {len(attributes)} values ({described})")
    timestamp = item.get("timestamp")
    if timestamp is not None and (not isinstance(timestamp, int) or isinstance(timestamp, bool)):
        raise EventDecodeError(f"timestamp must be an integer number of milliseconds, got {timestamp!r}")
    return stream, tuple(check_value(a, _non_finite(v) if a.type in _FLOATING else v) for a, v in zip(attributes, data)), timestamp


_FLOATING = ("float", "double")
_NON_FINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def _non_finite(value: Any) -> Any:
    """A float attribute's value as read: the text json_value writes for a non-finite one turned back into it."""
    return _NON_FINITE.get(value, value) if isinstance(value, str) else value


def json_value(value: Any, kind: str | None) -> Any:
    """A value as it goes into a JSON line (floats in their own precision, non-finite ones as Siddhi's text: "Infinity")."""
    if isinstance(value, float) and not math.isfinite(value):
        return java_str(value, kind)  # every line stays valid JSON
    if kind == "float" and isinstance(value, float):
        return float(str(np.float32(value)))  # the float's shortest form, not its double expansion
    return value


def encode_event_line(stream: str, row: Sequence[Any], timestamp: int | None, types: Sequence[str] | None = None) -> str:
    """One event as a JSON line; `types` (Siddhi types) print floats in their own precision."""
    kinds = list(types) if types is not None else [None] * len(row)
    data = [json_value(value, kind) for value, kind in zip(row, kinds)]
    return json.dumps({"stream": stream, "data": data, "timestamp": timestamp}, default=str)
