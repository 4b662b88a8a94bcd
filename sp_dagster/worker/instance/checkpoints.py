"""Continuous-mode checkpoints: what one holds, and whether it still fits the topics and the app it
resumes. A checkpoint is the engine's snapshot with, per input (topic, partition), the next offset it
has not seen, and each input topic's *incarnation* (its Kafka topic id, new each time a topic is
created), since offsets mean something only for the incarnation they were read from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

_MAGIC = b"SPC1"


class CheckpointError(ValueError):
    """Bytes that are not a continuous-mode checkpoint."""


@dataclass(frozen=True)
class Checkpoint:
    """The engine's snapshot and, per input (topic, partition), the next offset it has not seen."""

    positions: dict[tuple[str, int], int]
    snapshot: bytes
    saved_at: int = 0  # ms, wall clock
    topics: dict[str, str] = field(default_factory=dict)  # input topic -> its incarnation (Kafka topic id)
    set_aside: str | None = None  # the first checkpoint after a reset: why the one before was not used
    marks: dict[tuple[str, int], int] = field(default_factory=dict)  # where the output topics ended (leaked_outputs.py)

    def encode(self) -> bytes:
        """The checkpoint as bytes (a small JSON head, then the snapshot)."""
        head = {"positions": [[t, p, o] for (t, p), o in sorted(self.positions.items())], "saved_at": self.saved_at}
        if self.topics:
            head["topics"] = dict(sorted(self.topics.items()))
        if self.set_aside:
            head["set_aside"] = self.set_aside
        if self.marks:
            head["marks"] = [[t, p, o] for (t, p), o in sorted(self.marks.items())]
        data = json.dumps(head).encode()
        return _MAGIC + len(data).to_bytes(4, "big") + data + self.snapshot

    @classmethod
    def decode(cls, data: bytes) -> Checkpoint:
        """A checkpoint from encode()'s bytes."""
        head, size = read_head(data)
        positions = {(t, int(p)): int(o) for t, p, o in head["positions"]}
        marks = {(t, int(p)): int(o) for t, p, o in head.get("marks", ())}
        return cls(positions, data[8 + size :], int(head.get("saved_at", 0)), dict(head.get("topics", {})), head.get("set_aside"), marks)


def read_head(data: bytes) -> tuple[dict, int]:
    """A checkpoint's JSON head (without decoding the snapshot) and its size."""
    if data[:4] != _MAGIC:
        raise CheckpointError("not a continuous-mode checkpoint (saved by a micro-batch worker or a newer version?)")
    size = int.from_bytes(data[4:8], "big")
    try:
        return json.loads(data[8 : 8 + size]), size
    except ValueError as exc:
        raise CheckpointError(f"a damaged checkpoint: {exc}") from None


def topic_incarnations(transport, topics: Iterable[str]) -> dict[str, str]:
    """Each topic's incarnation (its Kafka topic id) where the messaging layer tells it; {} where it does not."""
    names = sorted(set(topics))
    if getattr(transport, "kind", None) != "kafka" or not names:
        return {}
    from confluent_kafka import TopicCollection

    try:
        futures = transport.admin.describe_topics(TopicCollection(names), request_timeout=transport.timeout)
        return {name: str(future.result().topic_id) for name, future in futures.items()}
    except Exception as exc:  # a broker without topic ids (or a topic gone): the end check still holds
        log.debug("no topic ids for %s: %s", names, exc)
        return {}


def incarnation_digest(incarnations: Mapping[str, str]) -> str:
    """A short name for a set of topic incarnations (stamped on committed transaction offsets)."""
    body = json.dumps(sorted(incarnations.items())).encode()
    return hashlib.sha256(body).hexdigest()[:12]


def unfit_reason(saved: Checkpoint, incarnations: Mapping[str, str], ends: Callable[[str], Mapping[int, int]]) -> str | None:
    """Why a checkpoint's offsets do not belong to the input topics as they are now, or None when they do."""
    for topic, was in sorted(saved.topics.items()):
        now = incarnations.get(topic)
        if now is not None and now != was:
            return f"topic {topic} is not the one the checkpoint read (it was deleted and created again, or the broker lost its data)"
    for topic in sorted({t for t, _p in saved.positions}):
        if incarnations and topic not in incarnations:
            continue  # no longer an input of this instance
        try:
            end = ends(topic)
        except Exception:  # the topic is not there (yet): reading it fails on its own, with its own message
            continue
        for (t, partition), offset in sorted(saved.positions.items()):
            if t == topic and offset > end.get(partition, 0):
                return f"{topic}:{partition} ends at offset {end.get(partition, 0)}, before the checkpoint's {offset} (the broker lost its data)"
    return None


def split_checkpoints(olds: Iterable[bytes], owns: Callable[[str], bool], *, stateless: bool = False) -> Checkpoint:
    """The start of a rescaled instance: the offsets every old instance's last checkpoint reached (drained: where
    the old layout ends) and, keyed, the state of the keys it owns (`owns(key)`); a `stateless` one has none to
    split, and takes the first one's (empty) state as it is."""
    from sp_dagster.worker.instance.runtime import merge_snapshots

    saved = [Checkpoint.decode(data) for data in olds]
    positions: dict[tuple[str, int], int] = {}
    topics: dict[str, str] = {}
    for checkpoint in saved:
        for place, offset in checkpoint.positions.items():
            positions[place] = max(positions.get(place, 0), offset)
        topics.update(checkpoint.topics)
    snapshot = saved[0].snapshot if stateless and saved else merge_snapshots([c.snapshot for c in saved], owns)
    return Checkpoint(positions, snapshot, max((c.saved_at for c in saved), default=0), topics)


@dataclass(frozen=True)
class Resumed:
    """Where an instance starts: the offsets to read from, what to tell the user, and why a checkpoint was set aside."""

    positions: dict[tuple[str, int], int]
    note: str | None = None  # for status/deploy/Dagster: state reset or partly kept
    set_aside: str | None = None  # why the checkpoint it started with was not used (None: used, or there was none)
    restored: bool = False
    marks: dict[tuple[str, int], int] = field(default_factory=dict)  # the checkpoint's, when its offsets are used


def resume(
    runtime, data: bytes | None, incarnations: Mapping[str, str], ends: Callable[[str], Mapping[int, int]], *, fresh_since: int | None = None
) -> Resumed:
    """Restore `runtime` (an InstanceRuntime) from checkpoint bytes when they fit;
    a checkpoint saved before `fresh_since` (ms: a deploy asked for a fresh start) is not resumed.

    An instance resumes from a checkpoint only when

    - every input topic is the one the checkpoint read (same topic id), and
    - no saved offset lies past its partition's end (the broker lost data, e.g. an in-memory
      broker restarted: topic ids then differ too, the end check covers layers without ids).

    Otherwise the policy is: **state and offsets reset together**. The instance starts empty from
    the beginning of its topics as they are now, says why (log, metrics `state_note`, which
    `status`, `deploy`, `up` and Dagster show), and the checkpoint it did not use is *set aside*
    (kept next to the instance's checkpoints, never deleted) by the first checkpoint after it.

    A checkpoint of an earlier version of the partial app resumes partially: the queries whose
    definition is unchanged get their state back, the others start empty (engine.stateparts).
    A checkpoint that cannot be read or restored at all is set aside the same way: never a
    restore that fails again at every retry."""
    if not data:
        return Resumed({})
    try:
        saved = Checkpoint.decode(data)
    except CheckpointError as exc:
        return _reset(str(exc))
    why = unfit_reason(saved, incarnations, ends)
    if not why and fresh_since and saved.saved_at < fresh_since:  # state only: the offsets still say what was read
        why = "its group was redeployed with --fresh"
        return Resumed(dict(saved.positions), f"state started empty, offsets kept: {why}", why, marks=dict(saved.marks))
    if why:
        return _reset(why)
    try:
        kept = runtime.restore(saved.snapshot)
    except Exception as exc:  # an engine error, or a damaged snapshot: never retried at every start
        return _reset(f"its state does not fit this partial app ({str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__})", restored=True)
    note = f"changed partial app: {kept.describe()}" if kept.fresh else None
    return Resumed(dict(saved.positions), note, restored=True, marks=dict(saved.marks))


def _reset(why: str, *, restored: bool = False) -> Resumed:
    return Resumed({}, f"state and offsets reset: {why}", why, restored)


SET_ASIDE = "set-aside"


def set_aside(path: Path, why: str) -> Path:
    """Move a checkpoint file that was not used to `set-aside/` next to its instance's checkpoints, with why; returns where."""
    place = path.parent.parent / SET_ASIDE
    place.mkdir(parents=True, exist_ok=True)
    target = place / f"{path.parent.name}-{int(time.time() * 1000)}.ckpt"
    os.replace(path, target)
    target.with_suffix(".why").write_text(why + "\n")
    log.warning("set aside the checkpoint %s as %s: %s", path, target, why)
    return target


def set_aside_reason(data: bytes) -> str | None:
    """The reason a new checkpoint gives for setting the one before aside, or None."""
    try:
        return read_head(data)[0].get("set_aside")
    except CheckpointError:
        return None


def predecessor(directory: Path, name: str) -> Path | None:
    """The newest checkpoint file `name` of an earlier version of an instance (a sibling of `directory`), or None."""
    root = Path(directory).parent
    found = [p / name for p in root.iterdir() if p.is_dir() and p != Path(directory) and p.name != SET_ASIDE and (p / name).is_file()] if root.is_dir() else []
    return max(found, key=lambda p: p.stat().st_mtime, default=None)
