"""What the engine cannot run yet, found before anything is built, in the parser's error format.
Script functions, playback tuning, fault streams and the functions and windows the parser knows but
the engine does not implement are reported, every use at once with line and column, never
silently ignored.
"""

from __future__ import annotations

from sp_dagster.engine.aggregators import AGGREGATORS
from sp_dagster.engine.errors import app_error
from sp_dagster.engine.functions import FUNCTIONS
from sp_dagster.engine.windows import WINDOWS
from sp_dagster.siddhi import SiddhiQLError, ast
from sp_dagster.siddhi.functions import AGGREGATORS as AGGREGATOR_SPECS

_PLURAL = {
    "playback idle.time/increment": "the idle.time and increment options of @app:playback",
    "fault stream": "fault streams (!S)",
    "return output": "'return' outputs (outside on-demand queries)",
}


def unsupported_features(app: ast.App) -> list[tuple[str, ast.Node]]:
    """(feature, node) for every use of something the engine cannot run yet."""
    found: list[tuple[str, ast.Node]] = []
    for definition in app.definitions:
        if isinstance(definition, ast.WindowDefinition):
            window = definition.window
            if window.namespace is not None or window.name not in WINDOWS:
                found.append((f"window '{window.qualified_name}'", window))
        elif isinstance(definition, ast.FunctionDefinition):
            found.append(("script function", definition))
    playback = app.annotation("app:playback")
    if playback is not None and playback.elements:
        found.append(("playback idle.time/increment", playback))
    for query, _ in app.queries():
        for stream in query.input_streams():
            if stream.fault:
                found.append(("fault stream", stream))
        if isinstance(query.output, ast.Return):
            found.append(("return output", query.output))
        for node in ast.walk(query):
            if isinstance(node, ast.FunctionCall) and not _implemented_call(node):
                found.append((f"function {node.qualified_name}()", node))
            elif isinstance(node, ast.Window) and (node.namespace is not None or node.name not in WINDOWS):
                found.append((f"window '{node.qualified_name}'", node))
            elif isinstance(node, ast.StreamFunction) and node.qualified_name != "log":
                found.append((f"stream function '#{node.qualified_name}'", node))
    return found


def _implemented_call(node: ast.FunctionCall) -> bool:
    if node.namespace is None and node.name in AGGREGATOR_SPECS:
        return node.name in AGGREGATORS
    return node.qualified_name in FUNCTIONS


def check_supported(app: ast.App) -> None:
    """Raise one SiddhiQLError listing every feature of `app` the engine cannot run."""
    errors = []
    for feature, node in unsupported_features(app):
        if feature.startswith(("function ", "window ", "stream function ")):
            message = f"{feature} is not supported by the engine"
        else:
            message = f"{_PLURAL.get(feature, feature + 's')} are not supported by the engine"
        errors.append(app_error(message, node))
    if errors:
        raise SiddhiQLError.combine(errors)
