"""How counts read in messages: `1 partition`, `2 partitions`, never `partition(s)`."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """A count with its noun in the right number (`plural` when it is not the noun plus `s`)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
