"""Tables (`define table`): rows kept in memory, the query outputs that change them, `in` checks.

A query writes a table with `insert into T`, `delete T on ...`, `update T set ... on ...` or
`update or insert into T set ... on ...`; conditions and `set` values see the query's output
attributes and the table's (qualified by the table's name) side by side, as Siddhi does.
Joins read a table through `held()`; `cond in T` is true when some row satisfies `cond`.
"""

from __future__ import annotations

from sp_dagster.engine.errors import app_error
from sp_dagster.engine.events import CURRENT, EXPIRED, ArrowChunk, StreamEvent
from sp_dagster.engine.expressions import Executor, JoinedScope, compile_expression, sides_of
from sp_dagster.engine.schema import Schema
from sp_dagster.engine.values import f32
from sp_dagster.siddhi import ast


class InMemoryTable:
    """The rows of one table, in insertion order; a @primaryKey keeps keys unique."""

    def __init__(self, definition: ast.TableDefinition):
        self.name = definition.name
        self.schema = Schema.of((a.name, a.type) for a in definition.attributes)
        self.rows: list[list] = []
        key = definition.annotation("primaryKey")
        self.key = [self.schema.index(e.value) for e in key.elements] if key is not None else None
        if self.key is not None and None in self.key:
            raise app_error(f"@primaryKey names an attribute table {self.name} does not have", key)

    def held(self) -> list[StreamEvent]:
        """The rows as events (what joins look into)."""
        return [StreamEvent(0, tuple(row)) for row in self.rows]

    def matches(self, data: tuple, timestamp: int, condition) -> list[list]:
        """The rows for which `condition` holds, `data` being the other side's attributes."""
        if condition is None:
            return list(self.rows)
        return [row for row in self.rows if condition(StreamEvent(timestamp, data + tuple(row))) is True]

    def insert(self, row: tuple) -> None:
        """Add a row (dropped, as Siddhi drops it, when its primary key is already there)."""
        if self.key is not None:
            key = [row[i] for i in self.key]
            if any([r[i] for i in self.key] == key for r in self.rows):
                return
        self.rows.append(list(row))

    def delete(self, rows: list[list]) -> None:
        """Remove these rows (found by matches())."""
        gone = {id(r) for r in rows}
        self.rows = [r for r in self.rows if id(r) not in gone]

    def snapshot(self):
        """The rows as plain data."""
        return [tuple(r) for r in self.rows]

    def restore(self, state) -> None:
        """Inverse of snapshot()."""
        self.rows = [list(r) for r in state]

    def stop(self) -> None:
        """Nothing to release."""


def compile_in(node: ast.In, scope) -> Executor:
    """`condition in T`: true when some row of table T satisfies the condition."""
    tables = getattr(scope.context, "tables", {})
    if node.table not in tables:
        raise app_error(f"'{node.table}' is not a table", node)
    table = tables[node.table]
    sides = sides_of(scope)
    width = max((offset + len(schema) for _, schema, offset in sides), default=0)
    condition = compile_expression(node.operand, JoinedScope([*sides, ((table.name,), table.schema, width)], scope.context)).row

    def row(event):
        data = event.data
        timestamp = event.timestamp
        for values in table.rows:
            if condition(StreamEvent(timestamp, data + tuple(values))) is True:
                return True
        return False

    return Executor("bool", row)


class TableOutput:
    """A query's output into a table: query callbacks first, then insert/delete/update rows."""

    def __init__(self, output, table: InMemoryTable, schema: Schema, names: tuple[str, ...], context, callbacks: list):
        self.table = table
        self.callbacks = callbacks
        self.kind = type(output).__name__
        self.schema = schema
        self.width = len(schema)
        scope = JoinedScope([(names, schema, 0), ((table.name,), table.schema, self.width)], context)
        on = getattr(output, "on", None)
        self.condition = compile_expression(on, scope).row if on is not None else None
        self.assignments: list[tuple[int, object]] = []
        if isinstance(output, (ast.Update, ast.UpdateOrInsert)):
            if output.set:
                for assignment in output.set:
                    index = table.schema.index(assignment.variable.name)
                    if index is None:
                        raise app_error(f"table {table.name} has no attribute '{assignment.variable.name}'", assignment.variable)
                    self.assignments.append((index, compile_expression(assignment.value, scope).row))
            else:
                for position, name in enumerate(schema.names):
                    index = table.schema.index(name)
                    if index is not None:
                        self.assignments.append((index, _reader(position)))
        self.by_name = [schema.index(n) for n in table.schema.names]
        if None in self.by_name:
            self.by_name = None

    def send(self, chunk) -> None:
        """Deliver a chunk of selector output."""
        for callback in self.callbacks:
            callback.receive(chunk)
        if isinstance(chunk, ArrowChunk):
            events = [StreamEvent(e.timestamp, e.data) for e in chunk.events()]
        else:
            events = [StreamEvent(e.timestamp, e.output) for e in chunk if e.type == CURRENT or e.type == EXPIRED]
        for event in events:
            self.apply(event)

    send_arrow = send

    def _table_row(self, data: tuple) -> tuple:
        if self.by_name is not None and len(data) != len(self.table.schema):
            return tuple(data[i] for i in self.by_name)
        return tuple(data)

    def apply(self, event: StreamEvent) -> None:
        """Change the table for one output row."""
        table = self.table
        if self.kind == "InsertInto":
            table.insert(self._table_row(event.data))
            return
        rows = table.matches(event.data, event.timestamp, self.condition)
        if self.kind == "Delete":
            table.delete(rows)
            return
        for row in rows:
            joined = StreamEvent(event.timestamp, event.data + tuple(row))
            values = [(index, value(joined)) for index, value in self.assignments]
            for index, value in values:
                row[index] = _conform(value, table.schema.types[index])
        if not rows and self.kind == "UpdateOrInsert":
            table.insert(self._table_row(event.data))


def _reader(position: int):
    return lambda e: e.data[position]


def _conform(value, kind: str):
    if value is None:
        return None
    if kind in ("int", "long"):
        return int(value)
    if kind in ("float", "double"):
        return f32(float(value)) if kind == "float" else float(value)
    return value
