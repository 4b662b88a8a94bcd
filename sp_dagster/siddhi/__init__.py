"""SiddhiQL: parse apps into an immutable AST, validate them, infer types, render them back.
`parse` checks syntax only, `load_with_analysis` also validates and returns the Analysis, and
`render` writes canonical SiddhiQL (`parse(render(app)) == app`); every error is a SiddhiQLError
carrying line, column, a caret-marked excerpt and one sentence.
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
