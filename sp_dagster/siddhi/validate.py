"""Validation: every mistake of an app at once, each a SiddhiQLError with line and column."""

from __future__ import annotations

from pathlib import Path

from sp_dagster.siddhi import ast
from sp_dagster.siddhi.analysis import Analysis, analyze
from sp_dagster.siddhi.annotations import check_annotations
from sp_dagster.siddhi.errors import SiddhiQLError
from sp_dagster.siddhi.parser import parse
from sp_dagster.siddhi.transports import check_transports


def validate(app: ast.App, *, transports: bool = False) -> list[SiddhiQLError]:
    """Every semantic error of a parsed app, in source order (empty when it is valid)."""
    return check(app, transports=transports)[1]


def check(app: ast.App, *, transports: bool = False) -> tuple[Analysis, list[SiddhiQLError]]:
    """The app's Analysis and all its semantic errors (names, types, annotations), in order.

    With `transports`, also every @source, @sink and @map that workers cannot run (the support
    check that validate, plan, deploy and the workers share)."""
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
    errors.sort(key=lambda e: (e.line, e.column))
    return analysis, errors


def load(text: str, source: str | None = None, *, transports: bool = True) -> ast.App:
    """Parse and validate an app (with the support check of its transports); raise one SiddhiQLError standing for all its errors."""
    return load_with_analysis(text, source, transports=transports)[0]


def load_with_analysis(text: str, source: str | None = None, *, transports: bool = False) -> tuple[ast.App, Analysis]:
    """Parse and validate an app, returning it with its Analysis; raise on any error."""
    app = parse(text, source)
    analysis, errors = check(app, transports=transports)
    if errors:
        raise SiddhiQLError.combine(errors).attach(text, source)
    return app, analysis


def load_file(path: str | Path) -> ast.App:
    """Read, parse and validate a `.siddhi` file; errors name the file."""
    path = Path(path)
    return load(path.read_text(encoding="utf-8"), str(path))
