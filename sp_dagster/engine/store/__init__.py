"""Tables behind `@store(...)`: `type='rdbms'` keeps a table's rows in a database through SQLAlchemy.
options.py reads the annotation (siddhi-store-rdbms's options), conditions.py turns `on` conditions
into SQL with bound parameters, rdbms.py is the table; other store types are rejected when the app
is built.
"""

from __future__ import annotations

from sp_dagster.engine.errors import app_error
from sp_dagster.engine.tables import InMemoryTable, Table
from sp_dagster.siddhi import ast


def build_table(definition: ast.TableDefinition, context) -> Table:
    """The table `definition` asks for: in memory, or in a database with @store."""
    store = definition.annotation("store")
    if store is None or (store.get("type") or "").lower() in ("in-memory", "inmemory"):
        return InMemoryTable(definition)  # the topology planner reads type='in-memory' the same way
    return build_store_table(definition, store, context)


def build_store_table(definition: ast.TableDefinition, store: ast.Annotation, context):
    """The table behind `@store(...)` on `definition` (SiddhiQLError or EngineError when it cannot be had).

    Only type='rdbms': other store types (mongodb, redis, ...) are rejected.
    """
    kind = store.get("type")
    if kind is None or kind.lower() != "rdbms":
        shown = f"type '{kind}'" if kind is not None else "no type"
        raise app_error(f"@store with {shown} is not supported by the engine; it keeps tables in databases with type='rdbms'", store)
    from sp_dagster.engine.store.options import parse_store
    from sp_dagster.engine.store.rdbms import Connections, RdbmsTable

    options = parse_store(definition, store, getattr(context, "datasources", None))
    connections = getattr(context, "connections", None)
    if connections is None:
        connections = context.connections = Connections()
    return RdbmsTable(definition, options, connections)
