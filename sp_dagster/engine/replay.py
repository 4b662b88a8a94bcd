"""Replay a file of events through an app and write what its output streams receive.
Input and output lines share one form, `{"stream": "S", "data": [...], "timestamp": ms}`, which the
caller's EventLines reads and writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import IO, Any, Protocol

from sp_dagster.engine.errors import EngineError
from sp_dagster.engine.events import Event
from sp_dagster.engine.runtime import AppRuntime
from sp_dagster.engine.schema import Schema
from sp_dagster.errors import SpDagsterError
from sp_dagster.siddhi import ast


class EventLines(Protocol):
    """The JSON-lines form of events (sp_dagster.messaging.eventlines).

    The engine knows nothing of that form: the caller passes the messaging layer's `eventlines`
    module, whose checks of values against attribute types are the ones topics use (`data` may
    also be an object keyed by attribute name on input).
    """

    def decode_event_line(self, line: str, attributes_of: Callable[[str], Sequence[tuple[str, str]]]) -> tuple[str, tuple, int | None]: ...

    def encode_event_line(self, stream: str, row: Sequence[Any], timestamp: int | None, types: Sequence[str] | None = None) -> str: ...


def output_streams(app: ast.App) -> list[str]:
    """The global streams an app's queries write to, in the order they are first written."""
    stored = {d.name for d in app.definitions if isinstance(d, (ast.TableDefinition, ast.WindowDefinition))}
    names: list[str] = []
    for query, _ in app.queries():
        output = query.output
        if isinstance(output, ast.InsertInto) and not output.inner and output.target not in names and output.target not in stored:
            names.append(output.target)
    return names


def decode_line(line: str, runtime: AppRuntime, form: EventLines) -> tuple[str, tuple, int | None]:
    """(stream, row, timestamp) from one input line; SpDagsterError when it does not fit."""

    def attributes(stream: str) -> list[tuple[str, str]]:
        schema = runtime.schema(stream)
        return list(zip(schema.names, schema.types))

    return form.decode_event_line(line, attributes)


def replay_file(text: str, app_path: str, lines: Iterable[str], input_name: str, out: IO[str], form: EventLines, datasources: dict | None = None) -> None:
    """Build the app, send every input line, print every output event as a JSON line."""
    runtime = AppRuntime(text, source=app_path, datasources=datasources)
    try:
        for name in output_streams(runtime.app):
            schema = runtime.schema(name)
            runtime.add_callback(name, _printer(name, schema, out, form))
        runtime.start()  # `at 'start'` triggers fire before any input
        send_lines(runtime, lines, input_name, form)
    finally:
        runtime.shutdown()


def send_lines(runtime: AppRuntime, lines: Iterable[str], input_name: str, form: EventLines) -> None:
    """Send every event line to the runtime (EngineError naming the line that does not fit)."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            stream, row, timestamp = decode_line(line, runtime, form)
        except SpDagsterError as exc:
            raise EngineError(f"{input_name}:{number}: {exc}") from None
        runtime.send(stream, [row], None if timestamp is None else [timestamp])


def _printer(name: str, schema: Schema, out: IO[str], form: EventLines):
    def emit(events: list[Event]) -> None:
        for event in events:
            out.write(form.encode_event_line(name, event.data, event.timestamp, schema.types) + "\n")
        out.flush()

    return emit
