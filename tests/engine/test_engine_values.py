"""Java's value rules as the engine applies them: floats, integer overflow, strings, conversions."""

from __future__ import annotations

import math

import pytest

from sp_dagster.engine import AppRuntime
from sp_dagster.engine.javahash import hash_order, string_hash
from sp_dagster.engine.values import f32, java_class, java_int_div, java_int_rem, java_str, wrap_int, wrap_long


def test_float_rounding_and_overflow():
    assert f32(55.6) == 55.599998474121094
    assert f32(1e39) == math.inf and f32(-1e39) == -math.inf


def test_integer_arithmetic_wraps_and_truncates_like_java():
    assert wrap_int(2**31) == -(2**31)
    assert wrap_long(2**63 + 5) == -(2**63) + 5
    assert (java_int_div(-7, 2), java_int_rem(-7, 2)) == (-3, -1)
    assert (java_int_div(7, -2), java_int_rem(7, -2)) == (-3, 1)


@pytest.mark.parametrize(
    "value, kind, text",
    [
        (1.0, "double", "1.0"),
        (100.0, "double", "100.0"),
        (1e7, "double", "1.0E7"),
        (1.5e-4, "double", "1.5E-4"),
        (0.001, "double", "0.001"),
        (f32(55.6), "float", "55.6"),
        (-0.0, "double", "-0.0"),
        (math.nan, "double", "NaN"),
        (True, "bool", "true"),
        (None, "string", "null"),
        (12, "long", "12"),
    ],
)
def test_java_string_conversion(value, kind, text):
    assert java_str(value, kind) == text


def test_java_class_names_follow_value_then_declared_type():
    assert java_class(1, "long") == "Long"
    assert java_class(1.0, "float") == "Float"
    assert java_class("aa", "double") == "String"  # cast() relabels without converting
    assert java_class(None, "int") == "null"


def test_java_hash_order_of_strings():
    assert string_hash("a") == 97 and string_hash("u1") == 3676 and string_hash("Aa") == string_hash("BB") == 2112
    assert hash_order(["c", "b", "a"]) == ["a", "b", "c"]  # buckets 1, 2, 3 of 16
    assert hash_order(["u2", "u1"]) == ["u1", "u2"]  # buckets 12, 13
    assert hash_order(["BB", "Aa"]) == ["BB", "Aa"]  # one bucket: insertion order


def _select(expression: str, types: str, row: tuple):
    runtime = AppRuntime(f"define stream S ({types});\nfrom S select {expression} as v insert into O;")
    out = []
    runtime.add_callback("O", lambda events: out.extend(e.data[0] for e in events))
    runtime.send("S", [row])
    return out[0]


@pytest.mark.parametrize(
    "expression, types, row, expected",
    [
        ("a + 1", "a int", (2**31 - 1,), -(2**31)),
        ("a / 0", "a int", (5,), None),
        ("a % b", "a float, b float", (101.0, 11.43), f32(math.fmod(101.0, f32(11.43)))),
        ("a / 3", "a long", (-7,), -2),
        ("a * b", "a int, b float", (3, 0.1), f32(3 * f32(0.1))),
        ("convert(a, 'int')", "a string", ("12x",), None),
        ("convert(a, 'int')", "a double", (-7.9,), -7),
        ("convert(a, 'double')", "a string", (" 2.5 ",), 2.5),
        ("convert(a, 'string')", "a double", (1e7,), "1.0E7"),
        ("convert(a, 'bool')", "a string", ("TRUE",), True),
        ("maximum(a, b)", "a int, b int", (-3, -5), 0),
        ("str:concat(a, '-', b)", "a string, b int", ("x", 3), "x-3"),
        ("not (a > 1)", "a int", (None,), True),
        ("default(a, 7)", "a int", (None,), 7),
        ("instanceOfString(a)", "a object", ("x",), True),
    ],
)
def test_expressions_follow_siddhi(expression, types, row, expected):
    assert _select(expression, types, row) == expected
