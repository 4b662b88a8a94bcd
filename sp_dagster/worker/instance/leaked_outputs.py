"""Outputs a dead owner's open transaction let through: found once at start, never published again.
Some brokers (tansu 0.6) let such a transaction's messages through to the instance's next owner,
which would publish them again as it replays; each checkpoint therefore marks where the output
partitions ended, and the next owner reads on from there for the origins to drop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sp_dagster.worker.instance.runtime import Message


def own_prefixes(group: str, stateless: bool, inputs: Iterable[tuple[str, int]], clock: str) -> tuple[str, ...]:
    """How the origins of an instance's outputs begin: a stateful one names its input partitions, a
    stateless one passes its inputs' origins on behind them, and the wall clock's name the instance (runtime.py)."""
    if stateless:
        return (*(f"{group}>{topic}:{partition}{end}" for topic, partition in sorted(inputs) for end in "|>"), f"{clock}|")
    return (*(f"{group}@{topic}:{partition}|" for topic, partition in sorted(inputs)), f"{clock}|")


class LeakedOutputs:
    """The origins of an instance's outputs already on the output topics, per (topic, partition);
    `drop` removes them from what is published.

    They are read from the start checkpoint's *marks* (`TransactionalPublisher.marks`: where the output
    partitions ended when it was taken; anything published later lands past them) to the end, keeping
    the origins of the instance's own outputs (`own_prefixes`). An output computed again carries the
    same origin (runtime.py), the wall clock's too: they are named after their due time and the
    instance. Dropping goes on while `pending`: until the inputs are read as far as they reached at the
    start (the dead owner cannot have read further); until then the instance's own checkpoints keep the
    old marks. On Kafka only committed outputs are found, which the replay never publishes again."""

    def __init__(self, found: Mapping[tuple[str, int], Iterable[bytes]], prefixes: tuple[str, ...], horizon: Mapping[tuple[str, int], int], started_at: int):
        self.horizon = dict(horizon)  # where the inputs ended at the start: the dead owner read no further
        self.started_at = started_at  # ms: the dead owner's timers fell due before
        own = tuple(prefix.encode() for prefix in prefixes)
        self.places: dict[tuple[str, int], set[bytes]] = {}
        for place, origins in found.items():
            mine = {o for o in origins if o.startswith(own)}
            if mine:
                self.places[place] = mine
        self.count = sum(map(len, self.places.values()))
        self.dropped = 0

    def __bool__(self) -> bool:
        return bool(self.places)

    def pending(self, positions: Mapping[tuple[str, int], int], clock: int | None) -> bool:
        """True while outputs may still be dropped: some found, and an input not read as far as the
        horizon or (`clock`: the engine's wall clock, None on event time) timers not yet fired up to the start."""
        if not self.places:
            return False
        return any(positions.get(place, 0) < end for place, end in self.horizon.items()) or (clock is not None and clock < self.started_at)

    def drop(self, messages: list[Message]) -> list[Message]:
        """`messages` without those already published (each origin dropped once, on its partition or,
        for a message the producer places itself, on any partition of its topic)."""
        kept = []
        for message in messages:
            origins = None
            if message.origin is not None:
                if message.partition >= 0:
                    origins = self.places.get((message.topic, message.partition))
                else:
                    origins = next((o for (t, _p), o in self.places.items() if t == message.topic and message.origin in o), None)
            if origins is not None and message.origin in origins:
                origins.remove(message.origin)
                self.dropped += 1
                continue
            kept.append(message)
        self.places = {place: origins for place, origins in self.places.items() if origins}
        return kept
