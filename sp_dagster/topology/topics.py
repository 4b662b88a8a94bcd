"""Topic names, and which partitions of a topic each instance of a group reads."""

from __future__ import annotations

import re

from sp_dagster.topology.model import ALL

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def topic_name(app: str, stream: str, key: str | None = None) -> str:
    """`<app>.<stream>`, or `<app>.<stream>.<key>` for a field-grouped stream.

    Must stay identical to sp_dagster.messaging.transport.Transport.topic_name (topology is
    pure and does not import the messaging layer).
    """
    return ".".join(part for part in (app, stream, key) if part)


def valid_topic_name(name: str) -> bool:
    """True when Kafka accepts `name` as a topic name."""
    return bool(_TOPIC_NAME.fullmatch(name)) and name not in (".", "..")


def partition_numbers(parallelism: int, partitions: int, index: int) -> tuple[int, ...]:
    """The partitions instance `index` (0-based) of `parallelism` instances reads.

    As the original's getPartitionNumbers: one each when the counts match, else contiguous runs
    of partitions // parallelism, the last instance taking the remainder.
    """
    if not 0 <= index < parallelism or partitions < parallelism:
        raise ValueError(f"cannot spread {partitions} partitions over instance {index} of {parallelism}")
    if partitions == parallelism:
        return (index,)
    size = partitions // parallelism
    end = partitions if index == parallelism - 1 else (index + 1) * size
    return tuple(range(index * size, end))


def assigned_partitions(strategy: str, parallelism: int, partitions: int, index: int) -> tuple[int, ...]:
    """What instance `index` (0-based) reads: every partition for `all`, else its own share."""
    if strategy == ALL:
        return tuple(range(partitions))
    return partition_numbers(parallelism, partitions, index)
