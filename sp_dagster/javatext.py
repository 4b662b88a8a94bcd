"""Values as Java prints them (String.valueOf): how Siddhi turns values into text.
Shared by the engine (string conversion, partition keys) and the messaging layer (the text a
partition key is hashed on), so both agree to the character.
"""

from __future__ import annotations

import math

import numpy as np


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
