"""Validation: every mistake of an app at once, each a SiddhiQLError with line and column.
`read_text`, `check(transports=True)` and the planner make the one support check that
`sp-dagster validate`, `plan`, `deploy` and the Dagster runs share (`deploy.steps.load_app`).
"""

from __future__ import annotations

from pathlib import Path

from sp_dagster.siddhi import ast
from sp_dagster.siddhi.analysis import Analysis, analyze
from sp_dagster.siddhi.annotations import check_annotations
from sp_dagster.siddhi.errors import SiddhiQLError
from sp_dagster.siddhi.parser import parse
from sp_dagster.siddhi.transports import check_transports

EMPTY_APP = "The app defines no stream and runs no query, so there is nothing to deploy; write its definitions and queries."


def validate(app: ast.App, *, transports: bool = False) -> list[SiddhiQLError]:
    """Every semantic error of a parsed app, in source order (empty when it is valid)."""
    return check(app, transports=transports)[1]


def check(app: ast.App, *, transports: bool = False) -> tuple[Analysis, list[SiddhiQLError]]:
    """The app's Analysis and all its semantic errors (names, types, annotations), in order.

    With `transports`, also every @source, @sink and @map that workers cannot run (the support
    check that validate, plan, deploy and the workers share) and an app with nothing in it."""
    analysis = analyze(app)
    errors = list(analysis.errors)
    seen = {(e.line, e.column, e.message) for e in errors}

    def report(message: str, node: ast.Node) -> None:
        if (node.line, node.column, message) not in seen:
            seen.add((node.line, node.column, message))
            errors.append(SiddhiQLError(message, node.line, node.column))

    check_annotations(app, report)
    if transports:
        check_transports(app, report)
        if not app.elements:
            errors.append(SiddhiQLError(EMPTY_APP, 1, 1))
    errors.sort(key=lambda e: (e.line, e.column))
    return analysis, errors


def load(text: str, source: str | None = None, *, transports: bool = True) -> ast.App:
    """Parse and validate an app (with the support check of its transports); raise one SiddhiQLError standing for all its errors."""
    return load_with_analysis(text, source, transports=transports)[0]


def load_with_analysis(text: str, source: str | None = None, *, transports: bool = False) -> tuple[ast.App, Analysis]:
    """Parse and validate an app, returning it with its Analysis; raise one SiddhiQLError standing for all its errors."""
    app = parse(text, source)
    analysis, errors = check(app, transports=transports)
    if errors:
        raise SiddhiQLError.combine(errors).attach(text, source)
    return app, analysis


def read_text(path: str | Path) -> str:
    """A `.siddhi` file's text; SiddhiQLError at the first byte that is not UTF-8 (OSError when unreadable)."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = data.rfind(b"\n", 0, exc.start) + 1
        line, column = data.count(b"\n", 0, exc.start) + 1, len(data[start : exc.start].decode("utf-8")) + 1
        message = f"The file is not UTF-8 text (byte 0x{data[exc.start]:02x} cannot be read); save it as UTF-8."
        raise SiddhiQLError(message, line, column).attach(data.decode("utf-8", "replace"), str(path)) from None


def load_file(path: str | Path) -> ast.App:
    """Read, parse and validate a `.siddhi` file; errors name the file."""
    return load(read_text(path), str(path))
