"""Java value semantics for Siddhi types: 32-bit floats, wrapping integers, Java's toString.
Values travel through the engine as plain Python objects: int (int and long), float (float and
double; a float-typed value is always exactly representable in 32 bits), str, bool and None.
"""

from __future__ import annotations

import array
import math

import pyarrow as pa

from sp_dagster.javatext import java_str  # noqa: F401  (re-exported: the engine's callers import it from here)
from sp_dagster.siddhi.types import JAVA_CLASSES

#: Siddhi type -> Arrow type (object attributes have none: they stay Python objects).
ARROW_TYPES = {
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "bool": pa.bool_(),
}
NUMERIC = ("int", "long", "float", "double")

_F32 = array.array("f", [0.0])
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1


def f32(value: float) -> float:
    """Round a Python float to the nearest 32-bit float (overflow gives +-inf, like Java)."""
    _F32[0] = value
    return _F32[0]


def wrap_int(value: int) -> int:
    """Two's-complement wrap to 32 bits, as Java int arithmetic does."""
    if INT_MIN <= value <= INT_MAX:
        return value
    return ((value + 2**31) & 0xFFFFFFFF) - 2**31


def wrap_long(value: int) -> int:
    """Two's-complement wrap to 64 bits, as Java long arithmetic does."""
    if LONG_MIN <= value <= LONG_MAX:
        return value
    return ((value + 2**63) & 0xFFFFFFFFFFFFFFFF) - 2**63


def java_int_div(a: int, b: int) -> int:
    """Java integer division: truncates toward zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def java_int_rem(a: int, b: int) -> int:
    """Java integer remainder: takes the sign of the dividend."""
    return a - java_int_div(a, b) * b


def java_float_to_int(value: float, bits: int) -> int:
    """Java's (int)/(long) cast of a float or double: truncate, NaN -> 0, saturate."""
    if math.isnan(value):
        return 0
    low, high = (INT_MIN, INT_MAX) if bits == 32 else (LONG_MIN, LONG_MAX)
    if math.isinf(value):
        return high if value > 0 else low
    return max(low, min(high, int(value)))


def coerce(value, kind: str):
    """A value of Siddhi type `kind` in the engine's representation (float -> 32-bit)."""
    if value is None:
        return None
    if kind == "float":
        return f32(float(value))
    if kind == "double":
        return float(value)
    return value


def java_class(value, kind: str) -> str:
    """The Java class Siddhi would report for `value` of declared type `kind`.

    The value decides where it can (cast() relabels without converting); the declared type
    tells int from long and float from double.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "Boolean"
    if isinstance(value, str):
        return "String"
    if isinstance(value, int):
        if kind in ("int", "long"):
            return JAVA_CLASSES[kind]
        return "Integer" if INT_MIN <= value <= INT_MAX else "Long"
    if isinstance(value, float):
        return JAVA_CLASSES[kind] if kind in ("float", "double") else "Double"
    return type(value).__name__


def java_compare(a, b) -> int:
    """Comparable.compareTo for two values of one type (strings compare by UTF-16 code unit)."""
    if isinstance(a, str):
        a, b = a.encode("utf-16-be"), b.encode("utf-16-be")
    return (a > b) - (a < b)
