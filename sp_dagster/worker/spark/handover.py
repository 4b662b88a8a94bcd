"""A rescaled group's first micro-batch start: where its old queries left each partition, and the keyed
state it takes over. A new instance (deploy.rescale) starts a fresh query from its group's old Spark
checkpoints as they were when the rescale was recorded; a marker in the new checkpoint names the
rescale, so a restart resumes the query's own checkpoint.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STATE_VARIABLE = "engine"  # the value state of microbatch._stateful_processor
MARKER = "sp-handover.json"  # in a handed-over query's checkpoint: {"since": the rescale's time in ms}


class HandoverError(RuntimeError):
    """An old checkpoint that does not say where its query stopped."""


@dataclass(frozen=True)
class Handover:
    """Where a new query starts its partitions (topic -> partition -> offset), and the state it takes (or None)."""

    start_at: dict[str, dict[int, int]] = field(default_factory=dict)
    initial_state: Any = None


def handed_over_since(checkpoint: Path) -> int | None:
    """The rescale a query's checkpoint was handed over at (ms), or None when it was not."""
    try:
        return int(json.loads((checkpoint / MARKER).read_text())["since"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def mark(checkpoint: Path, since: int) -> None:
    """Record in a new query's checkpoint that it starts from the rescale at `since`."""
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / MARKER).write_text(json.dumps({"since": since}))


def last_committed(checkpoint: Path) -> int | None:
    """The id of the last batch a query's checkpoint has committed, or None when it committed none."""
    return max((int(p.name) for p in (checkpoint / "commits").glob("*") if p.name.isdigit()), default=None)


def committed_offsets(checkpoint: Path, topics: Sequence[str]) -> dict[str, dict[int, int]]:
    """Per input topic (`topics`: the plan's inputs, in order), the positions after the query's last committed batch.

    A query's Spark checkpoint keeps the offsets each committed batch ended at in `offsets/N` (one line per
    source in the plan's input order), with `commits/N` saying the batch committed."""
    batch = last_committed(checkpoint)
    if batch is None:
        return {}  # it committed no batch: its partitions start where they would have
    path = checkpoint / "offsets" / str(batch)
    try:
        sources = path.read_text().splitlines()[2:]  # a version line, the batch's metadata, then one line per source
    except OSError as exc:
        raise HandoverError(f"{path}: {exc.strerror or exc}") from None
    if len(sources) != len(topics):
        raise HandoverError(f"{path} holds the offsets of {len(sources)} sources where the instance reads {len(topics)} topics")
    found: dict[str, dict[int, int]] = {}
    for topic, line in zip(topics, sources, strict=True):
        if line.strip() in ("", "-"):
            continue
        offsets = json.loads(line)
        if isinstance(offsets.get(topic), dict):  # Spark's Kafka connector names the topic
            offsets = offsets[topic]
        found[topic] = {int(p): int(o) for p, o in offsets.items()}
    return found


def take_over(spark, topics: Mapping[str, Sequence[int]], olds: Sequence[Path], owns: Callable[[str], bool] | None) -> Handover:
    """What a new instance reading `topics` (topic -> its partitions) starts from, out of its group's old checkpoints;
    `owns(key)` picks the keys whose state it takes (None: a stateless instance, no state).

    Each partition starts where its old owner's last committed batch ended; the state of the keys it now
    owns is read from the old state stores with Spark's state data source, and handed to
    transformWithStateInPandas as initial state."""
    start_at: dict[str, dict[int, int]] = {topic: {} for topic in topics}
    for old in olds:
        for topic, offsets in committed_offsets(old, list(topics)).items():
            mine = start_at[topic]
            for partition, offset in offsets.items():
                if partition in topics[topic]:  # one owner per partition; the further one, should two have read it
                    mine[partition] = max(offset, mine.get(partition, 0))
    start_at = {t: o for t, o in start_at.items() if o}
    if owns is None:
        return Handover(start_at)
    rows = []
    for old in olds:
        if (old / "state").exists() and last_committed(old) is not None:  # state as of its last commit: none before one
            frame = spark.read.format("statestore").option("stateVarName", STATE_VARIABLE).load(str(old))
            rows += [r for r in frame.selectExpr("key._engine_key AS key", "value.token AS token", "value.snapshot AS snapshot").collect() if owns(r.key)]
    state = None
    if rows:
        state = spark.createDataFrame([(r.key, r.token, r.snapshot) for r in rows], "_engine_key string, token string, snapshot binary").groupBy("_engine_key")
    log.info("taking over %d keys' state and the positions of %d partitions", len(rows), sum(map(len, start_at.values())))
    return Handover(start_at, state)
