"""Publishing strategies: which partitions of a topic an event goes to."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sp_dagster.javatext import java_str
from sp_dagster.messaging.errors import StrategyError


def key_string(value: Any) -> str:
    """The string form a key is hashed on, as Java/Siddhi print it (1.0, 1.0E7, true, null)."""
    return java_str(value)


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (the Java client's default partitioner), as a signed 32-bit int."""
    length = len(data)
    seed, m, r = 0x9747B28C, 0x5BD1E995, 24
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    tail = length - rest
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


@functools.lru_cache(maxsize=65_536)
@functools.lru_cache(maxsize=65_536)  # keys repeat, and the hash runs in Python
def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition Kafka's Java client would choose for this key: positive murmur2 modulo N."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@functools.lru_cache(maxsize=65_536)
def _string_key(value: str) -> bytes:
    return value.encode("utf-8")


class Strategy:
    """Chooses partitions for each event; `key` gives the Kafka message key, if any."""

    name = "strategy"

    def partitions(self, row: Sequence[Any], partition_count: int) -> Sequence[int]:
        """The partitions this row is published to."""
        raise NotImplementedError

    def key(self, row: Sequence[Any]) -> bytes | None:
        """The message key of this row (None: no key)."""
        return None

    def place(self, row: Sequence[Any], partition_count: int) -> tuple[bytes | None, Sequence[int]]:
        """The row's message key and partitions at once."""
        return self.key(row), self.partitions(row, partition_count)


@dataclass
class RoundRobin(Strategy):
    """Spread events over the partitions in turn."""

    name = "round_robin"
    position: int = 0  # events placed so far: an instance's snapshot keeps it, so a replay places them alike

    def partitions(self, row, partition_count):
        self.position += 1
        return ((self.position - 1) % partition_count,)


@dataclass
class Partitioned(Strategy):
    """Route by a key attribute: one key always reaches the same partition (field grouping)."""

    key_index: int
    key_name: str = ""
    name = "partitioned"

    def key(self, row):
        value = row[self.key_index]
        if type(value) is str:
            return _string_key(value)
        return key_string(value).encode("utf-8")

    def partitions(self, row, partition_count):
        return (partition_for_key(self.key(row), partition_count),)

    def place(self, row, partition_count):
        key = self.key(row)
        return key, (partition_for_key(key, partition_count),)


@dataclass
class Broadcast(Strategy):
    """Send every event to every partition, so every consuming instance sees it."""

    name = "broadcast"

    def partitions(self, row, partition_count):
        return range(partition_count)


def strategy_for(name: str, attribute_names: Sequence[str] = (), partition_key: str | None = None) -> Strategy:
    """Build a strategy by name (round_robin/roundRobin, partitioned/field_grouping, broadcast/all)."""
    normalized = name.replace("_", "").replace("-", "").lower()
    if normalized in ("roundrobin", "rr"):
        return RoundRobin()
    if normalized in ("broadcast", "all"):
        return Broadcast()
    if normalized in ("partitioned", "fieldgrouping"):
        if not partition_key:
            raise StrategyError("PartitionKey is required for partitioned distribution strategy.")
        if partition_key not in attribute_names:
            raise StrategyError(f"partition key '{partition_key}' is not an attribute of the stream ({', '.join(attribute_names)})")
        return Partitioned(list(attribute_names).index(partition_key), partition_key)
    raise StrategyError(f"unknown publishing strategy '{name}'; expected roundRobin, partitioned or broadcast")
