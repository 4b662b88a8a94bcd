"""Sequences (`,`) and counted states beyond the conformance cases: starts under `every`, counted and optional steps.

Each expected output is what Siddhi itself gives for the app and events
(`python bench/siddhi.py` drives Siddhi 4.3.7 in a JVM; random sequence and pattern apps of 2-4
steps with `+`, `*`, `?` and `<m:n>` steps agree with the engine event for event), and every
conformance case (Siddhi 5) still passes with these rules.
"""

from __future__ import annotations

import pytest

from sp_dagster.engine import AppRuntime

STREAM = "define stream S (symbol string, price double);\n"


def matches(query: str, prices: list[float]) -> list[tuple]:
    """The rows `query` emits for events of S with these prices, 1 ms apart."""
    runtime = AppRuntime(STREAM + query)
    out: list[tuple] = []
    runtime.add_callback("Out", lambda events: out.extend(e.data for e in events))
    try:
        for n, price in enumerate(prices):
            runtime.send("S", [("A", price)], [1_000 + n])
    finally:
        runtime.shutdown()
    return out


def test_an_every_start_takes_an_event_that_also_moves_an_older_partial_match_on():
    query = "from every e1=S[price > 70], e2=S[price < 80], e3=S[price > 40] select e1.price as a, e2.price as b, e3.price as c insert into Out;"
    # 76 is e2 of the match begun at 79 and, at the same time, e1 of a new one
    assert matches(query, [79.0, 76.0, 46.0, 47.0]) == [(79.0, 76.0, 46.0), (76.0, 46.0, 47.0)]


def test_a_new_start_landing_on_a_counted_step_an_older_match_still_holds_is_dropped():
    query = (
        "from every e1=S[price > 20], e2=S[price >= e1.price]+, e3=S[price < e2[last].price] "
        "select e1.price as a, e2[0].price as b, e3.price as c insert into Out;"
    )
    assert matches(query, [29.6, 35.6, 57.6, 47.6]) == [(29.6, 35.6, 47.6)]


@pytest.mark.parametrize(("prices", "expected"), [([30.0, 45.0], [(30.0, 45.0)]), ([50.0, 30.0, 45.0], []), ([30.0, 50.0, 30.0, 45.0], [])])
def test_a_sequence_without_every_must_begin_with_the_first_event(prices, expected):
    query = "from e1=S[price < 40], e2=S[price < 48] select e1.price as a, e2.price as b insert into Out;"
    assert matches(query, prices) == expected


def test_an_event_an_optional_step_and_the_next_both_take_belongs_to_the_next():
    optional = "from every e1=S[price < 40], e2=S[price < 45]?, e3=S[price > 31] select e1.price as a, e2.price as b, e3.price as c insert into Out;"
    assert matches(optional, [27.0, 40.0]) == [(27.0, None, 40.0)]
    assert matches(optional, [27.0, 20.0, 40.0]) == [(27.0, 20.0, 40.0)]
    star = (
        "from every e1=S[price < 40], e2=S[price < 45]*, e3=S[price > 31] "
        "select e1.price as a, e2[0].price as b, e2[1].price as b2, e3.price as c insert into Out;"
    )
    assert matches(star, [27.0, 20.0, 40.0, 50.0]) == [(27.0, 20.0, None, 40.0)]


def test_a_partial_match_on_several_steps_takes_the_event_at_the_furthest():
    two_counted = (
        "from every e1=S[price > 60], e2=S[price < e1.price]+, e3=S[price < e2[last].price]+, e4=S[price > 27] "
        "select e1.price as a, e2[0].price as b, e3[0].price as c, e4.price as d insert into Out;"
    )
    # 13.0 could extend e2 or begin e3: it begins e3, and e2 ends at [49.53]
    assert matches(two_counted, [93.99, 49.53, 13.0, 15.13, 47.03]) == [(93.99, 49.53, 13.0, 47.03)]
    optional_then_last = (
        "from every e1=S[price > 67], e2=S[price > e1.price]+, e3=S[price > e2[last].price]?, e4=S[price > 55] "
        "select e1.price as a, e2[0].price as b, e3[0].price as c, e4.price as d insert into Out;"
    )
    assert matches(optional_then_last, [78.31, 91.19, 99.24]) == [(78.31, 91.19, None, 99.24)]


def test_a_counted_state_named_without_an_index_is_its_first_event_in_the_selector():
    query = (
        "from e1=S[price > 71] -> e2=S[price > 50]<2:3> -> e3=S[price > 80] "
        "select e1.price as a, e2.price as b, e2[0].price as first, e2[last].price as last, e3.price as c insert into Out;"
    )
    assert matches(query, [73.0, 75.0, 76.0, 77.0, 81.0]) == [(73.0, 75.0, 75.0, 77.0, 81.0)]


def test_a_counted_state_named_without_an_index_is_its_last_event_in_a_later_condition():
    query = (
        "from e1=S[price > 20] -> e2=S[price > e1.price]<2:3> -> e3=S[price < e2.price] "
        "select e1.price as a, e2[0].price as b, e2[2].price as c, e2.price as d, e3.price as e insert into Out;"
    )
    # e2 is [60, 70, 80]; 75 < 80 (its last) completes the match, where its first (60) would wait for 55
    assert matches(query, [50.0, 60.0, 70.0, 80.0, 75.0, 55.0]) == [(50.0, 60.0, 80.0, 60.0, 75.0)]


def test_a_partial_match_that_begins_a_later_counted_step_goes_on_to_the_step_after_it():
    query = (
        "from e1=S[price > 20] -> e2=S[price < e1.price]<0:2> -> e3=S[price > 35]<0:2> -> e4=S[price < e3.price] "
        "select e1.price as a, e2.price as b, e3.price as c, e4.price as d insert into Out;"
    )
    # 85.05 skips e2 and begins e3; 82.83 then completes e4
    assert matches(query, [63.19, 85.05, 82.83]) == [(63.19, None, 85.05, 82.83)]
    # 88.69 extends e3 to [76.7, 88.69]: e4's condition reads its last, the selector its first
    assert matches(query, [80.2, 76.7, 88.69, 78.7]) == [(80.2, None, 76.7, 78.7)]


@pytest.mark.parametrize(
    ("prices", "expected"),
    [
        ([10.0, 70.0, 5.0], [(10.0, 70.0, 70.0, 5.0)]),
        ([10.0, 55.0, 70.0, 5.0], [(10.0, 55.0, 70.0, 5.0)]),
        ([10.0, 70.0, 65.0, 5.0], [(10.0, 70.0, 70.0, 5.0)]),
    ],
)
def test_one_event_can_be_both_sides_of_an_and(prices, expected):
    query = (
        "from e1=S[price < 20] -> (e2=S[price > 50] and e3=S[price > 60]) -> e4=S[price < 20] "
        "select e1.price as a, e2.price as b, e3.price as c, e4.price as d insert into Out;"
    )
    assert matches(query, prices) == expected
