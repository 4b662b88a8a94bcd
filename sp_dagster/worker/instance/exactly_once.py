"""An instance's exactly-once duties: each turn's outputs and input offsets in one transaction
(`ExactlyOnce`), and a successor's replay, without publishing, of what its predecessor committed. A
stateless instance that only feeds other groups needs no transaction: `FeedOffsets` commits its
offsets after each flush, and the next group drops by origin what a successor publishes again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from sp_dagster.errors import MessagingError
from sp_dagster.messaging.transport import GroupOffsets, TransactionalPublisher, Transport
from sp_dagster.wording import counted
from sp_dagster.worker.instance.checkpoints import incarnation_digest
from sp_dagster.worker.instance.leaked_outputs import LeakedOutputs, own_prefixes
from sp_dagster.worker.instance.plan import InstancePlan
from sp_dagster.worker.instance.runtime import ORIGIN_HEADER, Message

log = logging.getLogger(__name__)

Place = tuple[str, int]  # (topic, partition)


def committed_ahead(committed: Mapping[Place, tuple[int, str]], positions: Mapping[Place, int], stamp: str) -> tuple[dict[Place, int], int | None]:
    """The committed offsets past `positions` (those stamped with other incarnations of the topics say
    nothing about these), and the latest wall clock a commit recorded (None if none did)."""
    ahead: dict[Place, int] = {}
    clock_seen: int | None = None
    for place, (offset, metadata) in committed.items():
        clock, _, committed_stamp = metadata.partition(":")
        if committed_stamp and committed_stamp != stamp:
            continue
        if offset > positions.get(place, 0):
            ahead[place] = offset
        if clock.isdigit():
            clock_seen = max(clock_seen or 0, int(clock))
    return ahead, clock_seen


def _stamped_topics(inputs: list[Place], incarnations: Mapping[str, str]) -> tuple[set[str], str]:
    """(the topics of `inputs`, the digest of their incarnations stamped on every offset commit)."""
    topics = {topic for topic, _p in inputs}
    return topics, incarnation_digest({t: i for t, i in incarnations.items() if t in topics})


def _of_topics(positions: Mapping[Place, int], topics: set[str]) -> dict[Place, int]:
    return {place: o for place, o in positions.items() if place[0] in topics}


class FeedOffsets:
    """The input offsets of an instance whose outputs only feed other execution groups, committed after each
    turn's flush without a transaction: a successor starts there, and what it publishes again (at most the
    turns whose commit had not reached the broker) the next group drops by origin, so the app's outputs stay
    exactly-once for one round trip less per turn and none of a transaction's broker work."""

    def __init__(self, name: str, offsets: GroupOffsets, topics: set[str], stamp: str):
        self.name = name
        self.offsets = offsets
        self.topics = topics
        self.stamp = stamp

    @classmethod
    def start(cls, plan: InstancePlan, transport: Transport, incarnations: Mapping[str, str], inputs: list[Place]) -> FeedOffsets | None:
        """Offsets kept for `plan` over `inputs` (this cluster's), or None where the layer keeps none."""
        offsets = transport.group_offsets(f"sp-dagster.{plan.name}")  # the group its transactions would commit to
        if offsets is None:
            return None
        return cls(plan.name, offsets, *_stamped_topics(inputs, incarnations))

    def take_over(self, inputs: list[Place], positions: Mapping[Place, int]) -> dict[Place, int]:
        """Where to start reading `inputs` past `positions`: what the last owner committed (without state
        there is nothing to rebuild by running the inputs before it)."""
        ahead, _clock = committed_ahead(self.offsets.committed(inputs), positions, self.stamp)
        if ahead:
            log.info("%s: starting at the offsets its last owner committed: %s", self.name, ahead)
        return ahead

    def commit(self, positions: Mapping[Place, int], now: int) -> None:
        """Record the input offsets of a turn whose outputs the broker acknowledged."""
        self.offsets.commit(_of_topics(positions, self.topics), f"{now}:{self.stamp}")

    def close(self, wait: bool = True) -> None:
        """Release the client once the commits sent have been answered (`wait` False: at once, as an owner
        whose claim ended does: the broker may be out of reach, and its successor starts where it can)."""
        self.offsets.close(wait)


class ExactlyOnce:
    """The transactions of one instance.

    `start` opens the instance's transactional publisher (named after the instance, so its next
    owner fences it); `take_over` reads what the last owner committed: the offsets, the wall clock
    of its last turn, the incarnations it read. The loop then runs the inputs up to those offsets
    without publishing (`split_replay`, `replay_done`). Where the broker lets a dead owner's open
    transaction through (tansu), `find_leaked` finds those outputs and `drop_leaked` drops them when
    they are computed again (leaked_outputs.py). Each turn ends with `commit`; each checkpoint
    records where the outputs end (`mark_outputs`)."""

    def __init__(self, plan: InstancePlan, publisher: TransactionalPublisher, topics: set[str], stamp: str):
        self.name = plan.name
        self.publisher = publisher
        self.topics = topics  # inputs whose offsets the transactions commit (this cluster's)
        self.stamp = stamp  # the incarnations of those inputs, stamped on every commit
        self.outputs = plan.cluster_output_topics
        self.replay_until: dict[Place, int] = {}  # inputs whose outputs up to here are already published
        self.replay_clock: int | None = None  # the wall clock of the last committed turn
        self.leaked: LeakedOutputs | None = None

    @classmethod
    def start(
        cls,
        plan: InstancePlan,
        transport: Transport,
        abandoned_after_s: float | None,
        lease_left: Callable[[], float],
        incarnations: Mapping[str, str],
        inputs: list[Place],
    ) -> ExactlyOnce | None:
        """Transactions for `plan` committing the offsets of `inputs` (this cluster's), or None where the layer has none."""
        try:
            name = f"sp-dagster.{plan.name}"
            publisher = transport.transactional_publisher(name, name, abandoned_after_s)
        except MessagingError as exc:
            log.warning("%s: no transactions on this broker (%s): outputs are at-least-once, replays dropped by origin", plan.name, exc)
            return None
        if publisher is None:
            return None
        publisher.time_left = lease_left
        return cls(plan, publisher, *_stamped_topics(inputs, incarnations))

    def take_over(self, inputs: list[Place], positions: Mapping[Place, int], *, fresh: bool) -> dict[Place, int]:
        """Read what the last owner committed for `inputs`: past `positions`, it is replayed without
        publishing, or (`fresh`: the state it built was dropped) returned as where to start instead."""
        ahead, self.replay_clock = committed_ahead(self.publisher.committed(inputs), positions, self.stamp)
        start = ahead if fresh else {}
        if not fresh:
            self.replay_until.update(ahead)
        if self.replay_until:
            log.info("%s: replaying %s without publishing: their outputs were committed before", self.name, self.replay_until)
        return start

    def find_leaked(
        self, transport: Transport, marks: Mapping[Place, int], inputs: list[Place], read: list[Place], group: str, stateless: bool, clock: str, now: int
    ) -> None:
        """Read the outputs from the start checkpoint's `marks` on for what a dead owner's open transaction
        let through (leaked_outputs.py): `inputs` are this cluster's input partitions, `read` all of them."""
        if not transport.profile.probe_leaked:
            return  # the broker aborts an open transaction when its next owner starts (Kafka's way)
        marks = {place: mark for place, mark in marks.items() if place[0] in self.outputs}
        if not marks:
            return
        horizon = {(t, p): end for t in {t for t, _p in inputs} for p, end in transport.end_offsets(t).items() if (t, p) in inputs}
        self.leaked = LeakedOutputs(self.publisher.headers_since(marks, ORIGIN_HEADER), own_prefixes(group, stateless, read, clock), horizon, now)
        if self.leaked:
            log.info("%s: %s published since its checkpoint: none computed again is published twice", self.name, counted(self.leaked.count, "output"))

    def split_replay(self, messages: list[Message]) -> tuple[list[Message], list[Message]]:
        """(the messages whose outputs the last owner committed, the rest)."""
        bounds = self.replay_until
        replayed = [m for m in messages if m.offset < bounds.get((m.topic, m.partition), -1)]
        if not replayed:
            return [], messages
        return replayed, [m for m in messages if m.offset >= bounds.get((m.topic, m.partition), -1)]

    def replay_done(self, positions: Mapping[Place, int], backlog: Callable[[], Mapping[Place, int]], *, idle: bool, replayed: int) -> None:
        """End the replay of every input read up to its bound; `idle` (nothing read this turn): also of
        those whose topic ends before the bound (it was recreated)."""
        was = bool(self.replay_until)
        for place, end in list(self.replay_until.items()):
            if positions.get(place, 0) >= end:
                del self.replay_until[place]
        if idle and self.replay_until:
            behind = backlog()
            for place in [p for p in self.replay_until if behind.get(p) == 0]:
                log.warning("%s: %s:%d ends before its committed offset %d; replay there is over", self.name, *place, self.replay_until.pop(place))
        if was and not self.replay_until:
            log.info("%s: replay done (%d messages); publishing again", self.name, replayed)

    def drop_leaked(self, out: list[Message]) -> list[Message]:
        """`out` without the outputs a dead owner's open transaction let through."""
        return self.leaked.drop(out) if self.leaked else out

    def commit(self, positions: Mapping[Place, int], now: int, lease_ok: Callable[[], bool]) -> None:
        """End the turn's transaction with its input offsets (and its wall clock, for the next owner's replay)."""
        self.publisher.commit(_of_topics(positions, self.topics), f"{now}:{self.stamp}", retry_while=lease_ok)

    def mark_outputs(self, positions: Mapping[Place, int], clock: int | None) -> dict[Place, int] | None:
        """Where the outputs end now (between turns: nothing is open), or None while outputs a dead
        owner let through may still be met (the old marks stay); `clock`: the engine's wall clock."""
        if self.leaked is not None and self.leaked.pending(positions, clock):
            return None
        if self.leaked is not None and self.leaked.dropped:
            log.warning(
                "%s: found %s on the output topics already, let through from the open transaction of an owner "
                "that died (the broker did not abort it): not published again",
                self.name,
                counted(self.leaked.dropped, "output"),
            )
        self.leaked = None
        try:
            return self.publisher.marks(self.outputs)
        except MessagingError as exc:  # the earlier marks stay right (only older)
            log.warning("%s: could not list where the output topics end (%s)", self.name, exc)
            return None
