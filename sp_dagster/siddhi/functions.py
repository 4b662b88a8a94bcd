"""The functions, aggregators, windows and stream functions SiddhiQL apps may call, by name.
Each entry says how many arguments it takes, what types they must have and what type it
returns; validation and output-type inference read only this table, so supporting another
function means adding one entry here (and its implementation in the engine).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sp_dagster.siddhi.ast import NUMERIC_TYPES, TYPES

# An argument kind: a type name, "number" (any numeric type), "any", "time" (an int or long
# constant such as `5 sec`), "attribute" (a plain attribute reference), or a tuple of types.
ArgKind = object
Returns = Callable[[Sequence["str | None"], Sequence[object]], "str | None"]


@dataclass(frozen=True)
class Spec:
    """How a function, aggregator, window or stream function may be called.

    `args` gives the kind of each positional argument; `rest` the kind of any further
    ones (None: no more allowed); `min_args` how many are required. `returns` computes the
    result type from the argument types and the argument nodes (functions only).
    """

    name: str
    args: tuple[ArgKind, ...] = ()
    min_args: int | None = None
    rest: ArgKind | None = None
    returns: Returns | None = None
    aggregate: bool = False

    @property
    def required(self) -> int:
        """The number of arguments that must be given."""
        return len(self.args) if self.min_args is None else self.min_args

    def arity_ok(self, count: int) -> bool:
        """True when `count` arguments are acceptable."""
        return count >= self.required and (self.rest is not None or count <= len(self.args))

    def kind_of(self, position: int) -> ArgKind | None:
        """The kind expected for argument `position` (0-based)."""
        return self.args[position] if position < len(self.args) else self.rest


def _fixed(type_: str) -> Returns:
    return lambda types, nodes: type_


def _same_as(position: int) -> Returns:
    return lambda types, nodes: types[position] if position < len(types) else None


def _sum_type(types: Sequence[str | None], nodes: Sequence[object]) -> str | None:
    if types[0] is None:
        return None
    return "long" if types[0] in ("int", "long") else "double"


def _named_type(types: Sequence[str | None], nodes: Sequence[object]) -> str | None:
    """`convert(x, 'double')` and `cast(x, 'double')` return the type they name."""
    target = getattr(nodes[1], "value", None) if len(nodes) > 1 else None
    return target.lower() if isinstance(target, str) and target.lower() in TYPES else None


def _math_round(types: Sequence[str | None], nodes: Sequence[object]) -> str | None:
    return {"float": "int", "double": "long"}.get(types[0] or "", types[0])


def _specs(*specs: Spec) -> dict[str, Spec]:
    return {spec.name: spec for spec in specs}


AGGREGATORS = _specs(
    Spec("sum", ("number",), returns=_sum_type, aggregate=True),
    Spec("avg", ("number",), returns=_fixed("double"), aggregate=True),
    Spec("count", ("any",), min_args=0, returns=_fixed("long"), aggregate=True),
    Spec("distinctCount", ("any",), returns=_fixed("long"), aggregate=True),
    Spec("min", ("number",), returns=_same_as(0), aggregate=True),
    Spec("max", ("number",), returns=_same_as(0), aggregate=True),
    Spec("minForever", ("number",), returns=_same_as(0), aggregate=True),
    Spec("maxForever", ("number",), returns=_same_as(0), aggregate=True),
    Spec("stdDev", ("number",), returns=_fixed("double"), aggregate=True),
    Spec("and", ("bool",), returns=_fixed("bool"), aggregate=True),
    Spec("or", ("bool",), returns=_fixed("bool"), aggregate=True),
    Spec("unionSet", ("object",), returns=_fixed("object"), aggregate=True),
)

_TYPE_NAME = "string"  # the second argument of cast/convert: a type name as a string constant

FUNCTIONS = _specs(
    Spec("cast", ("any", _TYPE_NAME), returns=_named_type),
    Spec("convert", ("any", _TYPE_NAME), returns=_named_type),
    Spec("coalesce", ("any",), rest="same", returns=_same_as(0)),
    Spec("ifThenElse", ("bool", "any", "same"), returns=_same_as(1)),
    Spec("default", ("any", "same"), returns=_same_as(0)),
    Spec("maximum", ("number",), rest="same", returns=_same_as(0)),
    Spec("minimum", ("number",), rest="same", returns=_same_as(0)),
    Spec("instanceOfBoolean", ("any",), returns=_fixed("bool")),
    Spec("instanceOfString", ("any",), returns=_fixed("bool")),
    Spec("instanceOfInteger", ("any",), returns=_fixed("bool")),
    Spec("instanceOfLong", ("any",), returns=_fixed("bool")),
    Spec("instanceOfFloat", ("any",), returns=_fixed("bool")),
    Spec("instanceOfDouble", ("any",), returns=_fixed("bool")),
    Spec("UUID", (), returns=_fixed("string")),
    Spec("currentTimeMillis", (), returns=_fixed("long")),
    Spec("eventTimestamp", ("any",), min_args=0, returns=_fixed("long")),
    Spec("createSet", ("any",), returns=_fixed("object")),
    Spec("sizeOfSet", ("object",), returns=_fixed("int")),
    # siddhi-execution-string
    Spec("str:concat", ("any",), rest="any", returns=_fixed("string")),
    Spec("str:length", ("string",), returns=_fixed("int")),
    Spec("str:upper", ("string",), returns=_fixed("string")),
    Spec("str:lower", ("string",), returns=_fixed("string")),
    Spec("str:trim", ("string",), returns=_fixed("string")),
    Spec("str:reverse", ("string",), returns=_fixed("string")),
    Spec("str:contains", ("string", "string"), returns=_fixed("bool")),
    Spec("str:equalsIgnoreCase", ("string", "string"), returns=_fixed("bool")),
    Spec("str:substr", ("string", "int", "int"), min_args=2, returns=_fixed("string")),
    Spec("str:replaceAll", ("string", "string", "string"), returns=_fixed("string")),
    Spec("str:replaceFirst", ("string", "string", "string"), returns=_fixed("string")),
    Spec("str:regexp", ("string", "string"), returns=_fixed("bool")),
    Spec("str:repeat", ("string", "int"), returns=_fixed("string")),
    Spec("str:charAt", ("string", "int"), returns=_fixed("string")),
    Spec("str:coalesce", ("string",), rest="string", returns=_fixed("string")),
    # siddhi-execution-math
    Spec("math:abs", ("number",), returns=_same_as(0)),
    Spec("math:ceil", ("number",), returns=_fixed("double")),
    Spec("math:floor", ("number",), returns=_fixed("double")),
    Spec("math:round", ("number",), returns=_math_round),
    Spec("math:sqrt", ("number",), returns=_fixed("double")),
    Spec("math:power", ("number", "number"), returns=_fixed("double")),
    Spec("math:log", ("number",), returns=_fixed("double")),
    Spec("math:log10", ("number",), returns=_fixed("double")),
    Spec("math:ln", ("number",), returns=_fixed("double")),
    Spec("math:exp", ("number",), returns=_fixed("double")),
    Spec("math:sin", ("number",), returns=_fixed("double")),
    Spec("math:cos", ("number",), returns=_fixed("double")),
    Spec("math:tan", ("number",), returns=_fixed("double")),
    Spec("math:rand", (), returns=_fixed("double")),
    Spec("math:min", ("number", "number"), returns=_same_as(0)),
    Spec("math:max", ("number", "number"), returns=_same_as(0)),
)

WINDOWS = _specs(
    Spec("length", ("int",)),
    Spec("lengthBatch", ("int", "bool"), min_args=1),
    Spec("time", ("time",)),
    Spec("timeBatch", ("time", ("int", "long", "bool"), "bool"), min_args=1),
    Spec("externalTime", ("attribute", "time")),
    Spec("externalTimeBatch", ("attribute", "time", ("int", "long"), "time", "bool"), min_args=2),
    Spec("timeLength", ("time", "int")),
    Spec("sort", ("int",), rest="any"),
    Spec("session", ("time", "attribute", "time"), min_args=1),
    Spec("delay", ("time",)),
    Spec("frequent", ("int",), rest="attribute"),
    Spec("lossyFrequent", ("number",), rest="any"),
    Spec("cron", ("string",)),
    Spec("batch", ("int",), min_args=0),
    Spec("expression", ("string", "bool"), min_args=1),
    Spec("expressionBatch", ("string", "bool", "bool"), min_args=1),
    Spec("unique:length", ("attribute", "int")),
    Spec("unique:lengthBatch", ("attribute", "int")),
    Spec("unique:time", ("attribute", "time")),
    Spec("unique:timeBatch", ("attribute", "time")),
    Spec("unique:ever", ("attribute",), rest="attribute"),
    Spec("unique:firstLengthBatch", ("attribute", "int")),
)

# Stream functions: `returns` is unused; EXTRA_ATTRIBUTES says what they add to the stream.
STREAM_FUNCTIONS = _specs(
    Spec("log", ("any", "any", "any"), min_args=0),
    Spec("pol2Cart", ("number", "number", "number"), min_args=2),
)
EXTRA_ATTRIBUTES = {"pol2Cart": (("x", "double"), ("y", "double"))}


def suggestion(table: dict[str, Spec], qualified_name: str) -> str | None:
    """A known name spelled like `qualified_name` but for case, if there is one."""
    lowered = qualified_name.lower()
    return next((known for known in table if known.lower() == lowered), None)


def accepts(kind: ArgKind, type_: str) -> bool:
    """True when a value of `type_` fits an argument of `kind` (besides "attribute"/"same")."""
    if kind in ("any", "attribute", "same"):
        return True
    if kind == "number":
        return type_ in NUMERIC_TYPES
    if kind == "time":
        return type_ in ("int", "long")
    if isinstance(kind, tuple):
        return type_ in kind
    return type_ == kind
