"""The load history of execution groups (`sp_group_load`): samples the leader records, read back for advice.
A row is one group at one moment: its parallelism, the sum of its input topics' end offsets (so the
next sample, taken by whichever manager leads then, derives the arrival rate), and the sample itself.
Only the last few minutes are kept.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import Connection, delete, select

from sp_dagster.cluster.advice import LoadSample
from sp_dagster.cluster.schema import group_load


@dataclass(frozen=True)
class GroupLoad:
    """One recorded sample of a group, with the input end offsets it was derived from."""

    app: str
    group: str
    input_end: int | None
    sample: LoadSample


def record_load(conn: Connection, rows: list[GroupLoad]) -> None:
    """Append samples."""
    if rows:
        conn.execute(
            group_load.insert(),
            [
                {
                    "app": r.app,
                    "group_name": r.group,
                    "at": r.sample.at_ms,
                    "parallel": r.sample.parallel,
                    "input_end": r.input_end,
                    "sample": json.dumps(
                        {"arrival_per_s": r.sample.arrival_per_s, "processed_per_s": r.sample.processed_per_s, "busy": r.sample.busy, "lag": r.sample.lag}
                    ),
                }
                for r in rows
            ],
        )


def read_load(conn: Connection, app: str | None = None) -> dict[tuple[str, str], list[GroupLoad]]:
    """The recorded samples per (app, group), oldest first; of one app when `app` is given."""
    c = group_load.c
    query = select(group_load).order_by(c.app, c.group_name, c.at, c.id)
    if app is not None:
        query = query.where(c.app == app)
    found: dict[tuple[str, str], list[GroupLoad]] = defaultdict(list)
    for row in conn.execute(query):
        values = json.loads(row.sample)
        sample = LoadSample(
            int(row.at), int(row.parallel), values["arrival_per_s"], float(values["processed_per_s"]), tuple(values["busy"]), int(values["lag"])
        )
        found[(row.app, row.group_name)].append(GroupLoad(row.app, row.group_name, row.input_end, sample))
    return dict(found)


def prune_load(conn: Connection, before_ms: int) -> int:
    """Delete the samples taken before `before_ms`; how many went."""
    return conn.execute(delete(group_load).where(group_load.c.at < before_ms)).rowcount
