"""SiddhiQL: parse apps into an immutable AST, validate them, infer types, render them back."""

from sp_dagster.siddhi.errors import SiddhiQLError
from sp_dagster.siddhi.parser import parse, parse_expression, parse_on_demand_query

__all__ = ["SiddhiQLError", "parse", "parse_expression", "parse_on_demand_query"]
