"""Messages a broker's fetch passed over, noticed by the reader and read again. Every publisher stamps
its messages with a token and a counter per partition (`WriterStamps`); a reader's `SkipGuard` keeps
the offsets it stepped over and reads them again when a writer's counter jumps, a writer it has not
met appears, or a writer falls silent. Only tansu needs it (docs/concepts/delivery.md).
"""

from __future__ import annotations

import bisect
import logging
import time
import uuid
from dataclasses import dataclass, field

from sp_dagster.wording import counted

log = logging.getLogger(__name__)

WRITER_HEADER = "sp-writer"
SILENT_S = 1.0  # a writer quiet this long after its last message has its holes read again ...
SILENT_CHECKS = 4  # ... and again after twice, four and eight times as long: a second read passes over a batch not stored yet too
HOLES_KEPT_S = 60.0  # holes older than this are forgotten unread (what they held is lost)


class WriterStamps:
    """The `sp-writer` header values of one publisher: its token and a counter per (topic, partition)."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex[:16]
        self._prefix = f"{self.token}:".encode()
        self._next: dict[tuple[str, int], int] = {}

    def stamp(self, topic: str, partition: int) -> bytes:
        """The header value for the next message to (topic, partition)."""
        place = (topic, partition)
        n = self._next.get(place, 0)
        self._next[place] = n + 1
        return self._prefix + b"%d" % n


def parse_stamp(value: bytes | None) -> tuple[bytes, int] | None:
    """(token, counter) of an `sp-writer` header value; None when absent or malformed."""
    if not value:
        return None
    token, _, n = value.rpartition(b":")
    return (token, int(n)) if token and n.isdigit() else None


@dataclass
class _Writer:
    n: int  # the highest counter delivered
    offset: int  # where that message was
    seen_at: float  # monotonic time of the last message (delivered or not)
    checks: int = 0  # how often its holes were read again since its last message


@dataclass
class _Partition:
    next: int | None = None  # the offset after the highest one delivered
    starts: list[int] = field(default_factory=list)  # holes [starts[i], ends[i]), ascending, recorded at times[i]
    ends: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    writers: dict[bytes, _Writer] = field(default_factory=dict)
    rereading_from: int = 0  # a second read of the holes from here ...
    rereading_until: int | None = None  # ... up to here (exclusive) is under way
    rereading_all: bool = False  # that read is a hand-over's: it forgets every hole it covered
    tried: set = field(default_factory=set)  # (token, counter) whose absence was already read again for

    def add_hole(self, start: int, end: int, now: float) -> None:
        self.starts.append(start)
        self.ends.append(end)
        self.times.append(now)

    def reread(self, start: int, until: int, every: bool = False) -> int:
        """Begin a second read of the holes in [start, until); returns where it starts."""
        self.rereading_from, self.rereading_until, self.rereading_all = start, until, every
        return start

    def reread_over(self) -> None:
        """The second read passed its end: the holes it covered held nothing more as yet (kept for
        later checks, unless the read was a hand-over's)."""
        if self.rereading_until is None:
            return
        if self.rereading_all:
            first = bisect.bisect_left(self.starts, self.rereading_from)
            last = bisect.bisect_right(self.ends, self.rereading_until)
            del self.starts[first:last], self.ends[first:last], self.times[first:last]
        self.rereading_until = None

    def first_hole_after(self, offset: int) -> int | None:
        index = bisect.bisect_right(self.ends, offset)
        if index == len(self.starts):
            return None
        return max(self.starts[index], offset + 1)

    def take_from_hole(self, offset: int) -> bool:
        """Remove `offset` from the holes; False when it lies in none."""
        index = bisect.bisect_right(self.starts, offset) - 1
        if index < 0 or offset >= self.ends[index]:
            return False
        start, end, at = self.starts[index], self.ends[index], self.times[index]
        pieces = [(s, e) for s, e in ((start, offset), (offset + 1, end)) if s < e]
        self.starts[index : index + 1] = [s for s, _e in pieces]
        self.ends[index : index + 1] = [e for _s, e in pieces]
        self.times[index : index + 1] = [at] * len(pieces)
        return True

    def forget_holes(self, older_than: float) -> None:
        """Drop the holes recorded before `older_than` (they are kept in time order)."""
        drop = 0
        while drop < len(self.times) and self.times[drop] < older_than:
            drop += 1
        if drop:
            del self.starts[:drop], self.ends[:drop], self.times[:drop]


class SkipGuard:
    """Per partition of one topic: the holes a reader stepped over and each writer's last counter.

    A hole is an offset range a reader stepped over: transaction markers, aborted records, or messages
    a fetch passed over (a broker may show a partition's later record batch before an earlier one is
    stored; Apache Kafka never does, as a fetch ends at the high watermark, which moves only over stored
    batches). The holes are read again from the first that could hold what is missing when a writer's
    counter jumps (the messages between are in a hole, or lost for good: said once), when a writer not
    met before appears while there are holes (a new owner of an instance, after its predecessor's last
    messages may have been passed over), and when a writer has been silent for SILENT_S, 2, 4 and 8
    times that with holes behind its last message (the end of a stream, where no jump shows: `due`).

    `admit` is asked about every message in the order read and answers True (deliver), False
    (drop: delivered before), or an offset to read the partition again from (drop this message
    and the rest of the partition's batch: they come again). A second read delivers only what it
    finds in holes, so a message found late is still the newest of its writer (a jump is handled
    before anything after it is delivered), and the next group's duplicate check (highest sequence
    per origin) takes it. Holes a second read found empty are kept until HOLES_KEPT_S old: a dead
    owner's open transaction shows only once its next owner starts, which can take longer than every
    silent-writer check. A reader handing over (`read_all_again`) forgets them at once: what publishes
    to it has stopped."""

    def __init__(self, topic: str, clock=time.monotonic):
        self.topic = topic
        self.clock = clock
        self.partitions: dict[int, _Partition] = {}
        self.found = 0  # messages delivered from holes
        self.lost = 0  # counters never found

    def admit(self, partition: int, offset: int, stamp: tuple[bytes, int] | None, now: float | None = None) -> bool | int:
        """Whether to deliver a message just read (see the class docstring); `now`: the clock's time, if known."""
        state = self.partitions.get(partition)
        if state is None:
            state = self.partitions[partition] = _Partition()
        now = self.clock() if now is None else now
        if state.rereading_until is not None:
            if offset < state.rereading_until:
                if state.take_from_hole(offset):
                    self.found += 1
                    log.warning("%s:%d: offset %d, passed over by an earlier fetch, read again and delivered", self.topic, partition, offset)
                    self._note(state, stamp, offset, now)
                    return True
                return False
            state.reread_over()
        if state.next is not None:
            if offset < state.next:
                return False
            if offset > state.next:
                state.add_hole(state.next, offset, now)
        state.next = offset  # delivered next, or read again when it comes back
        if stamp is not None:
            again = self._read_again_from(state, partition, stamp, offset)
            if again is not None:
                return state.reread(again, offset)
        state.next = offset + 1
        self._note(state, stamp, offset, now)
        return True

    def _read_again_from(self, state: _Partition, partition: int, stamp: tuple[bytes, int], offset: int) -> int | None:
        """Where to read again before delivering this message, if anywhere."""
        token, n = stamp
        writer = state.writers.get(token)
        if writer is None:
            if not state.starts or (token, -1) in state.tried:
                return None
            state.tried.add((token, -1))
            return state.starts[0]
        if n <= writer.n + 1:
            return None
        start = state.first_hole_after(writer.offset)
        if start is None or (token, writer.n + 1) in state.tried:
            self.lost += n - writer.n - 1
            log.error(
                "%s: partition %d: %s of writer %s (counters %d-%d, before offset %d) are not in the topic: lost upstream",
                self.topic,
                partition,
                counted(n - writer.n - 1, "message"),
                token,
                writer.n + 1,
                n - 1,
                offset,
            )
            return None
        state.tried.add((token, writer.n + 1))
        return start

    def _note(self, state: _Partition, stamp: tuple[bytes, int] | None, offset: int, now: float) -> None:
        if stamp is None:
            return
        token, n = stamp
        writer = state.writers.get(token)
        if writer is None:
            state.writers[token] = _Writer(n, offset, now)
        elif n > writer.n:
            writer.n, writer.offset, writer.seen_at, writer.checks = n, offset, now, 0

    def due(self) -> dict[int, int]:
        """Partitions to read again now (-> from which offset): a writer silent for SILENT_S (and 2, 4, 8 times
        that) with holes behind its last message."""
        now = self.clock()
        again = {}
        for partition, state in self.partitions.items():
            state.forget_holes(now - HOLES_KEPT_S)
            if state.rereading_until is not None or not state.starts or state.next is None:
                continue
            quiet = [w for w in state.writers.values() if w.checks < SILENT_CHECKS and now - w.seen_at >= SILENT_S * 2**w.checks]
            starts = [s for s in (state.first_hole_after(w.offset) for w in quiet) if s is not None]
            for writer in quiet:
                writer.checks += 1
            if starts:
                again[partition] = state.reread(min(starts), state.next)
        return again

    def read_all_again(self) -> dict[int, int]:
        """Every partition with holes, to read again from its first (-> offset): a reader about to hand over."""
        again = {}
        for partition, state in self.partitions.items():
            if state.rereading_until is None and state.starts and state.next is not None:
                again[partition] = state.reread(state.starts[0], state.next, every=True)
        return again

    def rereads(self) -> dict[int, int]:
        """The partitions a second read is under way on -> where it ends (exclusive)."""
        return {p: state.rereading_until for p, state in self.partitions.items() if state.rereading_until is not None}

    def rereading(self) -> bool:
        """True while a second read is under way on some partition."""
        return bool(self.rereads())

    def reread_done(self, partition: int) -> None:
        """The second read reached where it was asked to end (no message there yet to say so)."""
        state = self.partitions.get(partition)
        if state is not None:
            state.reread_over()
