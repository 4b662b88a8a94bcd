"""What the parts of one app runtime share: the clock, the streams, the query callbacks."""

from __future__ import annotations

from sp_dagster.engine.clock import Clock
from sp_dagster.engine.junction import StreamJunction
from sp_dagster.engine.schema import Schema
from sp_dagster.siddhi import Analysis, ast


class AppContext:
    """The shared state of one AppRuntime."""

    def __init__(self, app: ast.App, clock: Clock, analysis: Analysis):
        self.app = app
        self.clock = clock
        self.analysis = analysis  # the parser's: every stream's attributes, inferred ones too
        self.playback = clock.playback
        self.schemas: dict[str, Schema] = {}
        self.junctions: dict[str, StreamJunction] = {}
        self.query_callbacks: dict[str, list] = {}
        self.windows: dict = {}  # name -> NamedWindow (`define window`)
        self.query_schemas: dict[str, Schema] = {}  # output attributes of each query
        self.tables: dict = {}  # name -> Table (in memory, or in a database with @store)
        self.datasources: dict = {}  # deployment.yaml's datasources, for @store(datasource='NAME')
        self.connections = None  # the database engines of @store tables (engine.store.rdbms.Connections)
        self.aggregations: dict = {}  # name -> IncrementalAggregation (`define aggregation`)
        self.aggregation_options: dict = {}  # Siddhi properties: shardId, partitionById, aggTimeZone

    def callbacks_for(self, query_name: str) -> list:
        """The (shared, growing) list of callbacks of query `query_name`."""
        return self.query_callbacks.setdefault(query_name, [])
