"""Java value semantics for Siddhi types: 32-bit floats, wrapping integers, Java's toString.

Values travel through the engine as plain Python objects: int (int and long), float (float
and double; a float-typed value is always exactly representable in 32 bits), str, bool and
None. The helpers here apply Java's rules where Python's differ.
"""

from __future__ import annotations

import array
import math

import numpy as np
import pyarrow as pa

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


def _java_floating(value: float, single: bool) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0.0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    number = np.float32(value) if single else np.float64(value)
    mantissa, exponent = np.format_float_scientific(number, unique=True).split("e")
    sign = "-" if mantissa.startswith("-") else ""
    digits = mantissa.lstrip("-").replace(".", "").rstrip("0") or "0"
    exp = int(exponent)
    if -3 <= exp < 7:
        if exp >= 0:
            whole = digits[: exp + 1].ljust(exp + 1, "0")
            fraction = digits[exp + 1 :] or "0"
        else:
            whole, fraction = "0", "0" * (-exp - 1) + digits
        return f"{sign}{whole}.{fraction}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exp}"


def java_str(value, kind: str | None = None) -> str:
    """Java's String.valueOf for a value of Siddhi type `kind` (1.0, true, null, 1.0E7)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _java_floating(value, kind == "float")
    return str(value)


def java_compare(a, b) -> int:
    """Comparable.compareTo for two values of one type (strings compare by UTF-16 code unit)."""
    if isinstance(a, str):
        a, b = a.encode("utf-16-be"), b.encode("utf-16-be")
    return (a > b) - (a < b)
