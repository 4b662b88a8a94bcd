"""What the parts of one app runtime share: the clock, the streams, the query callbacks."""

from __future__ import annotations

from sp_dagster.engine.clock import Clock
from sp_dagster.engine.errors import app_error
from sp_dagster.engine.junction import StreamJunction
from sp_dagster.engine.schema import Schema
from sp_dagster.siddhi import ast


class AppContext:
    """The shared state of one AppRuntime."""

    def __init__(self, app: ast.App, clock: Clock):
        self.app = app
        self.clock = clock
        self.playback = clock.playback
        self.schemas: dict[str, Schema] = {}
        self.junctions: dict[str, StreamJunction] = {}
        self.defined: set[str] = set()  # streams with a `define stream`
        self.query_callbacks: dict[str, list] = {}
        self.query_schemas: dict[str, Schema] = {}  # output attributes of each query

    def callbacks_for(self, query_name: str) -> list:
        """The (shared, growing) list of callbacks of query `query_name`."""
        return self.query_callbacks.setdefault(query_name, [])

    def undefined_stream_message(self, name: str) -> str:
        """The error for a query reading a stream nothing defines."""
        known = ", ".join(sorted(self.junctions)) or "none"
        return f"stream '{name}' is not defined (defined streams: {known})"

    def check_writable(self, name: str, node: ast.Node) -> None:
        """Refuse to write to a name that is not a stream (a table, window, trigger...)."""
        definition = self.app.definition(name)
        if definition is not None and not isinstance(definition, ast.StreamDefinition):
            kind = type(definition).__name__.replace("Definition", "").lower()
            raise app_error(f"'{name}' is a {kind}, which the engine does not support yet (issue 9)", node)
