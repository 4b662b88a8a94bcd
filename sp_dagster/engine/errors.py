"""Engine errors: load-time problems use the parser's SiddhiQLError (line, column, caret)."""

from __future__ import annotations

from sp_dagster.errors import SpDagsterError
from sp_dagster.siddhi import SiddhiQLError, ast


class EngineError(SpDagsterError):
    """A runtime misuse: an unknown stream, a row of the wrong width, a bad snapshot."""


def app_error(message: str, node: ast.Node | None = None) -> SiddhiQLError:
    """A SiddhiQLError pointing at `node` (its line and column, when it has them)."""
    return SiddhiQLError(message, getattr(node, "line", 0), getattr(node, "column", 0))
