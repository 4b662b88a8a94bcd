"""Events per second from two readings of a counter that only grows (topic end offsets, rows processed)."""

from __future__ import annotations


def per_second(before: float | None, then: float, total: float, now: float) -> float | None:
    """(total - before) / (now - then), or None when there is no earlier reading, no time passed, or the counter
    went back (a recreated topic or a restarted worker counts from 0 again)."""
    if before is None or now <= then or total < before:
        return None
    return (total - before) / (now - then)
