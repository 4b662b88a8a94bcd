"""Incremental executors (Siddhi's IncrementalExecutor): one per granularity, each rolling its closed buckets up to the next."""

from __future__ import annotations

from sp_dagster.engine.aggregation.store import BASES, EVENT_TS, GROUPS, LAST_TS, LASTS
from sp_dagster.engine.aggregation.timing import bucket_start, next_start


class Executor:
    """The running bucket of one granularity.

    What reaches it is bucketed by *processing* time: the event's timestamp at the root, the finer
    bucket's start further up (`child` is the next coarser executor). When a timestamp reaches
    the next roll-over time, every group of the bucket is written to the table and handed to
    `child`, and a new bucket starts. With `aggregate by ts` (`external`) the group key also holds
    the event-time bucket (AGG_EVENT_TIMESTAMP), so a late event makes its own row, merged on
    read. Only the root has a timer (IncrementalAggregation._fire): it fires at each root
    roll-over, and tick() passes the time on, so every executor then checks its own.
    """

    def __init__(self, duration: str, plan, tz, external: bool, shard, store, child: Executor | None):
        self.duration = duration
        self.plan = plan
        self.tz = tz
        self.external = external
        self.has_last = external and bool(plan.last_names)
        self.shard = shard
        self.store = store
        self.child = child
        self.start = -1  # the bucket start of the latest timestamp seen (startTimeOfAggregates)
        self.next_emit = -1
        self.store_ts = -1  # AGG_TIMESTAMP of the open bucket
        self.groups: dict[tuple, list] = {}  # (event bucket, group values) -> [lasts, last_ts, bases]

    def execute(self, record: tuple) -> None:
        """Take one record (an event at the root, a closed finer bucket above it)."""
        self.tick(record[0])
        event_ts = record[EVENT_TS]
        key = (bucket_start(event_ts, self.duration, self.tz) if self.external else None, record[GROUPS])
        group = self.groups.get(key)
        if group is None:
            self.groups[key] = [record[LASTS], record[LAST_TS], list(record[BASES])]
            return
        if not self.has_last or record[LAST_TS] >= group[1]:
            group[0] = record[LASTS]
            group[1] = max(group[1], record[LAST_TS])
        self.plan.merge(group[2], record[BASES])

    def tick(self, ts: int) -> None:
        """Time `ts` reached this executor: roll over when it is past the open bucket."""
        self.start = bucket_start(ts, self.duration, self.tz)
        if ts >= self.next_emit:
            self.next_emit = next_start(ts, self.duration, self.tz)
            self._dispatch(self.start)
            if self.child is not None:
                self.child.tick(self.start)

    def _dispatch(self, new_start: int) -> None:
        if self.groups:
            records = [(self.store_ts, self.shard, key[0], key[1], g[0], g[1], g[2]) for key, g in self.groups.items()]
            self.store.write(self.duration, records)
            if self.child is not None:
                for record in records:
                    self.child.execute(record)
        self.groups = {}
        self.store_ts = new_start

    def in_memory(self) -> list[tuple]:
        """The open bucket's records (AGG_TIMESTAMP = the bucket start)."""
        return [(self.store_ts, self.shard, key[0], key[1], g[0], g[1], g[2]) for key, g in self.groups.items()]

    def snapshot(self):
        """Plain-data state."""
        return (self.start, self.next_emit, self.store_ts, [(k, g[0], g[1], list(g[2])) for k, g in self.groups.items()])

    def restore(self, state) -> None:
        """Inverse of snapshot()."""
        self.start, self.next_emit, self.store_ts, groups = state
        self.groups = {tuple(k): [lasts, last_ts, list(bases)] for k, lasts, last_ts, bases in groups}
