"""SiddhiQL: parse apps into an immutable AST, validate them, infer types, render them back.

    from sp_dagster.siddhi import parse, load_with_analysis, render

    app = parse(text)                    # syntax only; SiddhiQLError on mistakes
    app, analysis = load_with_analysis(text)  # parse + validate (all errors at once)
    analysis.attributes("Out")           # any stream, inferred ones included
    text == render(app)                  # canonical SiddhiQL; parse(render(app)) == app

The node classes live in `sp_dagster.siddhi.ast`; every error is a SiddhiQLError carrying
line, column, a caret-marked excerpt and one sentence.
"""

from sp_dagster.siddhi import ast
from sp_dagster.siddhi.analysis import Analysis, analyze, check_on_demand_query
from sp_dagster.siddhi.errors import SiddhiQLError
from sp_dagster.siddhi.parser import parse, parse_expression, parse_on_demand_query
from sp_dagster.siddhi.render import render, render_expression, render_on_demand_query
from sp_dagster.siddhi.validate import load, load_file, load_with_analysis, validate

__all__ = [
    "Analysis",
    "SiddhiQLError",
    "analyze",
    "check_on_demand_query",
    "ast",
    "load",
    "load_file",
    "load_with_analysis",
    "parse",
    "parse_expression",
    "parse_on_demand_query",
    "render",
    "render_expression",
    "render_on_demand_query",
    "validate",
]
