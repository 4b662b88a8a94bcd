"""Replay a file of events through an app and write what its output streams receive.

Input and output lines share one form: {"stream": "S", "data": [...], "timestamp": ms}
(`data` may also be an object keyed by attribute name on input). Values are checked against
the stream's attribute types with the messaging layer's own checks.
"""

from __future__ import annotations

import json
from typing import IO, Iterable

import numpy as np

from sp_dagster.engine.errors import EngineError
from sp_dagster.engine.events import Event
from sp_dagster.engine.runtime import AppRuntime
from sp_dagster.engine.schema import Schema
from sp_dagster.errors import SpDagsterError
from sp_dagster.messaging.codecs import Attribute, check_value
from sp_dagster.siddhi import ast


def output_streams(app: ast.App) -> list[str]:
    """The global streams an app's queries write to, in the order they are first written."""
    names: list[str] = []
    for query, _ in app.queries():
        output = query.output
        if isinstance(output, ast.InsertInto) and not output.inner and output.target not in names:
            names.append(output.target)
    return names


def decode_line(line: str, runtime: AppRuntime) -> tuple[str, tuple, int | None]:
    """(stream, row, timestamp) from one input line; SpDagsterError when it does not fit."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise EngineError(f"not valid JSON: {exc}") from None
    if not isinstance(item, dict) or "stream" not in item or "data" not in item:
        raise EngineError('expected an object like {"stream": "S", "data": [...], "timestamp": 1000}')
    stream = item["stream"]
    schema = runtime.schema(stream)
    attributes = [Attribute(n, t) for n, t in zip(schema.names, schema.types)]
    data = item["data"]
    if isinstance(data, dict):
        missing = [n for n in schema.names if n not in data]
        if missing:
            raise EngineError(f"stream '{stream}' needs {', '.join(missing)}")
        unknown = [k for k in data if schema.index(k) is None]
        if unknown:
            raise EngineError(f"stream '{stream}' has no attribute {', '.join(unknown)}")
        data = [data[n] for n in schema.names]
    if not isinstance(data, list) or len(data) != len(schema):
        raise EngineError(f"stream '{stream}' takes {len(schema)} values {schema.describe()}")
    timestamp = item.get("timestamp")
    if timestamp is not None and (not isinstance(timestamp, int) or isinstance(timestamp, bool)):
        raise EngineError(f"timestamp must be an integer number of milliseconds, got {timestamp!r}")
    return stream, tuple(check_value(a, v) for a, v in zip(attributes, data)), timestamp


def _plain(value, kind: str):
    if kind == "float" and isinstance(value, float) and np.isfinite(value):
        return float(str(np.float32(value)))  # the float's shortest form, not its double expansion
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    return value


def replay_file(text: str, app_path: str, lines: Iterable[str], input_name: str, out: IO[str]) -> None:
    """Build the app, send every input line, print every output event as a JSON line."""
    runtime = AppRuntime(text, source=app_path)
    try:
        for name in output_streams(runtime.app):
            schema = runtime.schema(name)
            runtime.add_callback(name, _printer(name, schema, out))
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                stream, row, timestamp = decode_line(line, runtime)
            except SpDagsterError as exc:
                raise EngineError(f"{input_name}:{number}: {exc}") from None
            runtime.send(stream, [row], None if timestamp is None else [timestamp])
    finally:
        runtime.shutdown()


def _printer(name: str, schema: Schema, out: IO[str]):
    def emit(events: list[Event]) -> None:
        for event in events:
            data = [_plain(v, t) for v, t in zip(event.data, schema.types)]
            out.write(json.dumps({"stream": name, "data": data, "timestamp": event.timestamp}) + "\n")
        out.flush()

    return emit
