"""Siddhi conditions on a stored table, as SQLAlchemy Core expressions with bound parameters.
Only what SQL computes exactly as Siddhi does is translated: the top-level conjuncts that translate
filter in SQL, and where some do not, the engine checks the whole condition in Python on the rows
fetched (`residual`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import sqlalchemy as sa

from sp_dagster.engine.events import StreamEvent
from sp_dagster.engine.expressions import JoinedScope, compile_expression
from sp_dagster.engine.tables import reads_side, side_of, splice, table_side
from sp_dagster.engine.values import NUMERIC
from sp_dagster.siddhi import ast

Clause = Callable[[StreamEvent], sa.ColumnElement]

_OPERATORS = {
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
    ">=": operator.ge,
    "<=": operator.le,
}
BIND_TYPES = {
    "int": sa.Integer(),
    "long": sa.BigInteger(),
    "float": sa.Double(),  # a float's value is exact as a double; compared as Java widens it
    "double": sa.Double(),
    "bool": sa.Boolean(),
    "string": sa.String(),
}


class SqlCondition:
    """A condition compiled for one stored table: SQL for what can be said in SQL, plus the rest.

    `where(data, timestamp)` is the WHERE clause for the other side's `data` (None: every row);
    `residual` (None when the SQL is exact) is the whole condition, to check each fetched row.
    """

    def __init__(self, clauses: list[Clause], residual, offset: int, width: int):
        self.clauses = clauses
        self.residual = residual
        self.offset = offset
        self.width = width

    @property
    def exact(self) -> bool:
        """True when the WHERE clause alone decides (no Python check needed)."""
        return self.residual is None

    def probe(self, data: tuple, timestamp: int) -> StreamEvent:
        """The joined data with an empty row: what the parameters are computed from."""
        return StreamEvent(timestamp, splice(data, (None,) * self.width, self.offset))

    def where(self, data: tuple, timestamp: int) -> sa.ColumnElement | None:
        """The WHERE clause for one event of the other side."""
        if not self.clauses:
            return None
        probe = self.probe(data, timestamp)
        parts = [clause(probe) for clause in self.clauses]
        return parts[0] if len(parts) == 1 else sa.and_(*parts)

    def holds(self, data: tuple, row: tuple, timestamp: int) -> bool:
        """The whole condition on one fetched row."""
        return self.residual is None or self.residual(StreamEvent(timestamp, splice(data, row, self.offset))) is True


def compile_condition(expression: ast.Expression | None, scope: JoinedScope, offset: int, columns: list, types: tuple, exact_strings: set[int]) -> SqlCondition:
    """Compile `expression` for the table whose attributes start at `offset` of `scope`'s data.

    `columns[i]` is the SQLAlchemy column of attribute i, `types[i]` its Siddhi type, and
    `exact_strings` the string attributes whose SQL equality is Java's.
    """
    width = len(columns)
    if expression is None:
        return SqlCondition([], None, offset, width)
    side = table_side(scope, offset)
    translator = _Translator(scope, side, columns, types, exact_strings)
    clauses = [translator.boolean(part) for part in _conjuncts(expression)]
    translated = [c for c in clauses if c is not None]
    residual = None
    if len(translated) < len(clauses):
        # some conjunct cannot be said in SQL: the SQL narrows the rows, Python decides
        residual = compile_expression(expression, scope).row
    return SqlCondition(translated, residual, offset, width)


def _conjuncts(node: ast.Expression) -> list[ast.Expression]:
    if isinstance(node, ast.BinaryOp) and node.op == "and":
        return _conjuncts(node.left) + _conjuncts(node.right)
    return [node]


class _Translator:
    """Turns conditions into SQL truth values, or None where SQL would not compute them as Siddhi.

    `StockTable.symbol == symbol and StockTable.volume > vol * 2` becomes
    `WHERE symbol = :p1 AND volume > :p2`: each piece that reads no table column (the other
    side's attributes, constants, arithmetic or functions over them) is computed by the engine
    for the event at hand and sent as a bound parameter, so the SQL text never holds a value.
    Translated: comparisons between a column and a parameter or another column (strings only
    for ==/!= and only on columns whose collation compares exactly), `is null` on a column, a
    bool column, `and`, `or` and `not`. Not: arithmetic or functions over columns, `in` checks,
    order comparisons of strings. Comparisons with null are false in both: SQL's unknown never
    reaches a NOT, so it acts as false.
    """

    def __init__(self, scope: JoinedScope, side: int, columns: list, types: tuple, exact_strings: set[int]):
        self.scope = scope
        self.side = side
        self.columns = columns
        self.types = types
        self.exact_strings = exact_strings

    def _uses_table(self, node: ast.Expression) -> bool:
        return reads_side(node, self.scope.sides, self.side)

    def _column(self, node: ast.Expression) -> int | None:
        if isinstance(node, ast.Variable) and node.index is None and side_of(node, self.scope.sides) == self.side:
            return self.scope.sides[self.side][1].index(node.name)
        return None

    def boolean(self, node: ast.Expression) -> Clause | None:
        """A SQL truth value for a condition, or None when SQL cannot say it exactly."""
        if not self._uses_table(node):
            test = compile_expression(node, self.scope).row
            return lambda e: sa.true() if test(e) is True else sa.false()
        if isinstance(node, ast.BinaryOp) and node.op in ("and", "or"):
            left, right = self.boolean(node.left), self.boolean(node.right)
            if left is None or right is None:
                return None
            join = sa.and_ if node.op == "and" else sa.or_
            return lambda e: join(left(e), right(e))
        if isinstance(node, ast.BinaryOp) and node.op in _OPERATORS:
            return self._compare(node)
        if isinstance(node, ast.Not):
            inner = self.boolean(node.operand)
            if inner is None:
                return None
            # NOT COALESCE(x, FALSE): Siddhi's `not` of a comparison with null is true
            return lambda e: sa.not_(sa.func.coalesce(inner(e), sa.false()))
        if isinstance(node, ast.IsNull):
            index = self._column(node.operand)
            if index is None:
                return None
            column = self.columns[index]
            return lambda e: column.is_(None)
        index = self._column(node)
        if index is not None and self.types[index] == "bool":
            column = self.columns[index]
            return lambda e: column == sa.true()
        return None

    def _value(self, node: ast.Expression) -> tuple[Clause, str, int | None] | None:
        """(SQL value, Siddhi type, column index or None) for one side of a comparison."""
        if not self._uses_table(node):
            executor = compile_expression(node, self.scope)
            read, kind = executor.row, executor.type
            bind = BIND_TYPES.get(kind)
            if bind is None:
                return None
            return (lambda e: sa.literal(read(e), bind)), kind, None
        index = self._column(node)
        if index is None:
            return None
        column = self.columns[index]
        return (lambda e: column), self.types[index], index

    def _compare(self, node: ast.BinaryOp) -> Clause | None:
        left, right = self._value(node.left), self._value(node.right)
        if left is None or right is None:
            return None
        (lvalue, ltype, lindex), (rvalue, rtype, rindex) = left, right
        if ltype in NUMERIC and rtype in NUMERIC:
            pass
        elif ltype == rtype == "string":
            if node.op not in ("==", "!=") or any(i is not None and i not in self.exact_strings for i in (lindex, rindex)):
                return None
        elif ltype == rtype == "bool":
            if node.op not in ("==", "!="):
                return None
        else:
            return None
        compare = _OPERATORS[node.op]
        return lambda e: compare(lvalue(e), rvalue(e))
