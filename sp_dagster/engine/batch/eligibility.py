"""What a kernel may rely on: which streams something in the app writes, what a query's chain is made of."""

from __future__ import annotations

from sp_dagster.engine.query import QueryOutput, QueryRuntime
from sp_dagster.engine.ratelimit import PassThrough
from sp_dagster.siddhi import ast


def written_streams(app: ast.App) -> set[str]:
    """Streams that queries, triggers or named windows of `app` write (not only sends)."""
    names: set[str] = set()
    for node in ast.walk(app):
        if isinstance(node, ast.InsertInto) and not node.inner:
            names.add(node.target)
        elif isinstance(node, (ast.TriggerDefinition, ast.WindowDefinition)):
            names.add(node.name)
    return names


def plain_query(receiver) -> QueryRuntime | None:
    """`receiver` when it is a query on one stream, writing a stream with no rate limit, reading no table."""
    if not isinstance(receiver, QueryRuntime) or receiver.head is None or receiver.join_sides:
        return None
    query = receiver.query
    if not isinstance(query.input, ast.StreamInput) or query.rate is not None:
        return None
    if not isinstance(receiver.limiter, PassThrough) or type(receiver.output) is not QueryOutput:
        return None
    if any(isinstance(node, ast.In) for node in ast.walk(query)):
        return None
    return receiver


def blind_output(query: QueryRuntime) -> bool:
    """True when nothing downstream of `query` can tell its output chunks apart (buffers only)."""
    output = query.output
    assert isinstance(output, QueryOutput)  # kernels compute only queries writing a stream (plain_query)
    target = output.target
    if any(not getattr(callback, "blind", False) for callback in output.callbacks):
        return False
    if target is None:
        return True
    return not target.receivers and all(getattr(callback, "blind", False) for callback in target.callbacks)
