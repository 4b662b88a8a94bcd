"""Tables (`define table`): one interface, in memory or in a database, and the queries that use them.
Every table kind implements `Table`, so the code here never asks which kind it has: `InMemoryTable`
keeps rows in a list, and `@store(type='rdbms', ...)` tables live in `sp_dagster.engine.store`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sp_dagster.engine.errors import app_error
from sp_dagster.engine.events import CURRENT, EXPIRED, ArrowChunk, StreamEvent
from sp_dagster.engine.expressions import JoinedScope, compile_expression, locate
from sp_dagster.engine.schema import Schema
from sp_dagster.engine.values import f32
from sp_dagster.siddhi import ast

Sides = list[tuple[tuple[str, ...], Schema, int]]


@dataclass
class Assignment:
    """One `set T.attr = value` (or an output attribute copied by name): the column and its value.

    `value` reads the joined data (the other side's attributes with the table row spliced in);
    `uses_table` says whether it reads the row at all (if not, one value serves every row).
    """

    index: int
    value: Callable[[StreamEvent], object]
    uses_table: bool


class Table:
    """What every table offers the engine. `data` is always the other side's attributes: the
    table's row is spliced into it at the condition's offset to give the joined data the
    condition and `set` values were compiled against.

    A condition is compiled once by the table (`compile_condition`, which an RDBMS table turns
    into SQL where it can) and then used with the data of the other side (`find`, `contains`,
    `delete`, `update`); joins read a table through `candidates()`."""

    name: str
    schema: Schema

    def compile_condition(self, expression: ast.Expression | None, scope: JoinedScope, offset: int):
        """Compile `expression` (None: every row) against `scope`, whose table side starts at `offset`."""
        raise NotImplementedError

    def candidates(self, condition, data: tuple, timestamp: int) -> list[tuple]:
        """Rows that may satisfy `condition` (a superset of find()'s), in table order; joins re-check them."""
        raise NotImplementedError

    def find(self, condition, data: tuple, timestamp: int) -> list[tuple]:
        """The rows that satisfy `condition`, in table order."""
        raise NotImplementedError

    def contains(self, condition, data: tuple, timestamp: int) -> bool:
        """True when some row satisfies `condition` (`in` checks)."""
        raise NotImplementedError

    def insert(self, rows: list[tuple]) -> None:
        """Add rows (one dropped, as Siddhi drops it, when its primary key is already there)."""
        raise NotImplementedError

    def delete(self, condition, data: tuple, timestamp: int) -> None:
        """Remove the rows that satisfy `condition`."""
        raise NotImplementedError

    def update(self, condition, data: tuple, timestamp: int, assignments: list[Assignment]) -> int:
        """Set the assigned columns of every row that satisfies `condition`; how many matched."""
        raise NotImplementedError

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Group several changes (one output chunk) into one unit of work."""
        yield

    def snapshot(self):
        """The table's state as plain data (None when it lives elsewhere)."""
        return None

    def restore(self, state) -> None:
        """Inverse of snapshot()."""

    def stop(self) -> None:
        """Release what the table holds (connections)."""


def splice(data: tuple, row: tuple, offset: int) -> tuple:
    """The joined data: the other side's attributes with the table's row at `offset`."""
    if offset == len(data):
        return data + row
    return data[:offset] + row + data[offset:]


class InMemoryTable(Table):
    """The rows of one table, in insertion order; a @primaryKey keeps keys unique."""

    def __init__(self, definition: ast.TableDefinition):
        self.name = definition.name
        self.schema = Schema.of((a.name, a.type) for a in definition.attributes)
        self.rows: list[list] = []
        self.key = primary_key(definition, self.schema)

    def compile_condition(self, expression, scope, offset):
        row = compile_expression(expression, scope).row if expression is not None else None
        return (row, offset)

    def _matching(self, condition, data: tuple, timestamp: int) -> list[list]:
        test, offset = condition
        if test is None:
            return list(self.rows)
        return [row for row in self.rows if test(StreamEvent(timestamp, splice(data, tuple(row), offset))) is True]

    def candidates(self, condition, data, timestamp):
        return [tuple(row) for row in self.rows]

    def find(self, condition, data, timestamp):
        return [tuple(row) for row in self._matching(condition, data, timestamp)]

    def contains(self, condition, data, timestamp):
        test, offset = condition
        if test is None:
            return bool(self.rows)
        return any(test(StreamEvent(timestamp, splice(data, tuple(row), offset))) is True for row in self.rows)

    def insert(self, rows):
        for row in rows:
            if self.key is not None:
                key = [row[i] for i in self.key]
                if any([r[i] for i in self.key] == key for r in self.rows):
                    continue
            self.rows.append(list(row))

    def delete(self, condition, data, timestamp):
        gone = {id(r) for r in self._matching(condition, data, timestamp)}
        if gone:
            self.rows = [r for r in self.rows if id(r) not in gone]

    def update(self, condition, data, timestamp, assignments):
        rows = self._matching(condition, data, timestamp)
        offset = condition[1]
        types = self.schema.types
        for row in rows:
            joined = StreamEvent(timestamp, splice(data, tuple(row), offset))
            values = [(a.index, a.value(joined)) for a in assignments]
            for index, value in values:
                row[index] = conform(value, types[index])
        return len(rows)

    def snapshot(self):
        """The rows as plain data."""
        return [tuple(r) for r in self.rows]

    def restore(self, state) -> None:
        """Inverse of snapshot()."""
        self.rows = [list(r) for r in state]


def primary_key(definition: ast.TableDefinition, schema: Schema) -> list[int] | None:
    """The positions of the @primaryKey attributes (None without one)."""
    key = definition.annotation("primaryKey")
    if key is None:
        return None
    positions = [schema.index(e.value) for e in key.elements]
    found = [p for p in positions if p is not None]
    if len(found) != len(positions):
        raise app_error(f"@primaryKey names an attribute table {definition.name} does not have", key)
    return found


# --------------------------------------------------------------------------- reading the scope


def side_of(node: ast.Variable, sides: Sides) -> int | None:
    """Which side a variable reads, by JoinedScope's rule (the first side that has it)."""
    found = locate(node, sides)
    return None if found is None else found[0]


def reads_side(expression: ast.Node, sides: Sides, side: int) -> bool:
    """True when some attribute in `expression` is one of side `side`'s."""
    return any(isinstance(n, ast.Variable) and n.index is None and side_of(n, sides) == side for n in ast.walk(expression))


def table_side(scope: JoinedScope, offset: int) -> int:
    """The position of the side starting at `offset` (the table's) in `scope`.

    Sides lie end to end, so only one side with attributes starts at a given offset (an empty
    side, such as an on-demand query's selection of nothing, may start there too).
    """
    return next(i for i, (_, schema, start) in enumerate(scope.sides) if start == offset and len(schema))


# --------------------------------------------------------------------------- `in` and joins


class TableJoinView:
    """A table as one side of a join: the rows that may match each event of the other side."""

    def __init__(self, table: Table, on: ast.Expression | None, scope: JoinedScope, offset: int):
        self.table = table
        self.condition = table.compile_condition(on, scope, offset)

    def held_for(self, event: StreamEvent) -> list[StreamEvent]:
        """Candidate rows for `event` as events (the join checks its condition on each)."""
        return [StreamEvent(0, row) for row in self.table.candidates(self.condition, event.data, event.timestamp)]


# --------------------------------------------------------------------------- writing


class TableOutput:
    """A query's output into a table: query callbacks first, then insert/delete/update rows.

    Conditions and `set` values see the query's output attributes and the table's (qualified by
    the table's name) side by side, as Siddhi does.
    """

    def __init__(self, output, table: Table, schema: Schema, names: tuple[str, ...], context, callbacks: list):
        self.table = table
        self.callbacks = callbacks
        self.kind = type(output).__name__
        self.schema = schema
        self.width = len(schema)
        scope = JoinedScope([(names, schema, 0), ((table.name,), table.schema, self.width)], context)
        on = getattr(output, "on", None)
        self.condition = table.compile_condition(on, scope, self.width) if self.kind != "InsertInto" else None
        self.assignments: list[Assignment] = []
        if isinstance(output, (ast.Update, ast.UpdateOrInsert)):
            if output.set:
                for assignment in output.set:
                    index = table.schema.index(assignment.variable.name)
                    if index is None:
                        raise app_error(f"table {table.name} has no attribute '{assignment.variable.name}'", assignment.variable)
                    value = compile_expression(assignment.value, scope).row
                    self.assignments.append(Assignment(index, value, reads_side(assignment.value, scope.sides, 1)))
            else:
                for position, name in enumerate(schema.names):
                    index = table.schema.index(name)
                    if index is not None:
                        self.assignments.append(Assignment(index, _reader(position), False))
        positions = [schema.index(n) for n in table.schema.names]
        found = [p for p in positions if p is not None]
        self.by_name: list[int] | None = found if len(found) == len(positions) else None

    def send(self, chunk) -> None:
        """Deliver a chunk of selector output."""
        for callback in self.callbacks:
            callback.receive(chunk)
        if isinstance(chunk, ArrowChunk):
            events = [StreamEvent(e.timestamp, e.data) for e in chunk.events()]
        else:
            events = [StreamEvent(e.timestamp, e.output) for e in chunk if e.type == CURRENT or e.type == EXPIRED]
        if not events:
            return
        with self.table.transaction():
            if self.kind == "InsertInto":
                self.table.insert([self._table_row(e.data) for e in events])
                return
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
        data = tuple(event.data)
        if self.kind == "InsertInto":
            table.insert([self._table_row(data)])
        elif self.kind == "Delete":
            table.delete(self.condition, data, event.timestamp)
        else:
            matched = table.update(self.condition, data, event.timestamp, self.assignments)
            if not matched and self.kind == "UpdateOrInsert":
                table.insert([self._table_row(data)])


def _reader(position: int):
    return lambda e: e.data[position]


def conform(value, kind: str):
    """A value assigned to a column of type `kind`, in the engine's representation."""
    if value is None:
        return None
    if kind in ("int", "long"):
        return int(value)
    if kind in ("float", "double"):
        return f32(float(value)) if kind == "float" else float(value)
    return value
