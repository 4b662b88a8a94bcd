"""ADAPTER: Siddhi's output-type rules, until sp_dagster.siddhi ships its type inference.

The parser engineer is adding output type inference to sp_dagster/siddhi (int+float ->
float, avg -> double, count -> long, sum(int) -> long, ...). Until it lands the engine needs
the same rules to execute expressions, so they live here in one place; when the parser's
inference is available, these functions should delegate to it and this module shrink to a
shim. Nothing else in the engine encodes a type rule on its own.
"""

from __future__ import annotations

from sp_dagster.engine.values import NUMERIC


def widest(left: str, right: str) -> str:
    """The type Java promotes two numeric operands to (int < long < float < double)."""
    return NUMERIC[max(NUMERIC.index(left), NUMERIC.index(right))]


def arithmetic_type(op: str, left: str, right: str) -> str | None:
    """The result type of `left op right`, or None when the operands are not numeric."""
    if left not in NUMERIC or right not in NUMERIC:
        return None
    return widest(left, right)


def comparable(op: str, left: str, right: str) -> bool:
    """True when Siddhi can compare the two types with `op`."""
    if left in NUMERIC and right in NUMERIC:
        return True
    if op in ("==", "!=") and left == right and left in ("string", "bool"):
        return True
    return False


#: Aggregator return types: a fixed type, or "same" (the argument's type).
AGGREGATOR_TYPES = {
    "count": "long",
    "distinctCount": "long",
    "avg": "double",
    "stdDev": "double",
    "and": "bool",
    "or": "bool",
    "min": "same",
    "max": "same",
    "minForever": "same",
    "maxForever": "same",
}


def aggregator_type(name: str, arg_type: str | None) -> str:
    """The output type of aggregator `name` over an argument of `arg_type`."""
    if name == "sum":
        return "long" if arg_type in ("int", "long") else "double"
    kind = AGGREGATOR_TYPES[name]
    return arg_type if kind == "same" else kind
