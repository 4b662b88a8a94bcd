"""TopologyError: a distributed app that cannot be split as written, reported like a parse error."""

from __future__ import annotations

from sp_dagster.siddhi import SiddhiQLError
from sp_dagster.siddhi.ast import Node


class TopologyError(SiddhiQLError):
    """A rule of distributed deployment that the app breaks: line, column and one sentence."""


def error_at(node: Node, message: str) -> TopologyError:
    """A TopologyError pointing at where `node` starts in the source text."""
    return TopologyError(message, node.line, node.column)
