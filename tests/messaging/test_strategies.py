"""Partition choice of each publishing strategy, and the key hashing (no broker needed)."""

import pytest

from sp_dagster.messaging.strategies import Broadcast, Partitioned, RoundRobin, key_string, murmur2, partition_for_key, strategy_for


@pytest.mark.parametrize(
    "data, expected",
    [  # reference values from Apache Kafka's own UtilsTest.testMurmur2
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_kafka(data, expected):
    assert murmur2(data) == expected


@pytest.mark.parametrize(
    "value, text",
    [(1.0, "1.0"), (55.6, "55.6"), (1e7, "1.0E7"), (1.5e-4, "1.5E-4"), (-0.0, "-0.0"), (7, "7"), (True, "true"), (None, "null"), ("IBM", "IBM")],
)
def test_key_string_is_java_string_form(value, text):
    assert key_string(value) == text


def test_round_robin_cycles_over_partitions():
    strategy = RoundRobin()
    assert [strategy.partitions(("x",), 3)[0] for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_partitioned_is_stable_and_uses_the_key():
    strategy = Partitioned(key_index=1, key_name="symbol")
    first = strategy.partitions((1, "IBM"), 5)
    assert strategy.partitions((99, "IBM"), 5) == first
    assert first == (partition_for_key(b"IBM", 5),)
    assert strategy.key((1, "IBM")) == b"IBM"
    spread = {strategy.partitions((0, f"sym{i}"), 4)[0] for i in range(100)}
    assert spread == {0, 1, 2, 3}


def test_broadcast_reaches_every_partition():
    assert list(Broadcast().partitions(("x",), 4)) == [0, 1, 2, 3]


def test_strategy_for_names_and_errors():
    assert isinstance(strategy_for("roundRobin"), RoundRobin)
    assert isinstance(strategy_for("all"), Broadcast)
    keyed = strategy_for("partitioned", ["a", "b"], "b")
    assert isinstance(keyed, Partitioned) and keyed.key_index == 1
    with pytest.raises(ValueError, match="PartitionKey is required"):
        strategy_for("partitioned", ["a"])
    with pytest.raises(ValueError, match="not an attribute"):
        strategy_for("field_grouping", ["a"], "zz")
    with pytest.raises(ValueError, match="unknown publishing strategy"):
        strategy_for("random")
