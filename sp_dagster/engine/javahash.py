"""The iteration order of Java's HashMap/ConcurrentHashMap for String keys.
A few Siddhi windows emit events in the order their hash map iterates (frequent, lossyFrequent,
session ties); matching Siddhi means reproducing that order (hash_order).
"""

from __future__ import annotations

from collections.abc import Iterable


def string_hash(text: str) -> int:
    """Java's String.hashCode (over UTF-16 code units), as an unsigned 32-bit value."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h


def _table_size(count: int) -> int:
    size = 16
    while count > size * 3 // 4:
        size *= 2
    return size


def hash_order(keys: Iterable[str], capacity: int = 0) -> list[str]:
    """`keys` (in insertion order) in the order a Java hash map holding them iterates.

    The bucket index comes from String.hashCode spread by (h ^ h >>> 16), over a table that
    doubles past 3/4 full; keys within one bucket stay in insertion order.
    """
    keys = list(keys)
    size = _table_size(max(len(keys), capacity))
    buckets: dict[int, list[str]] = {}
    for key in keys:
        h = string_hash(key)
        h ^= h >> 16
        buckets.setdefault(h & (size - 1), []).append(key)
    return [key for index in sorted(buckets) for key in buckets[index]]
