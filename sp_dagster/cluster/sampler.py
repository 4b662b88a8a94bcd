"""The leader's load sampler: every few seconds, the load of every execution group into `sp_group_load`.
The leader's pass only starts a sample (`LoadSampler.tick`); the sample runs in a thread of its own, so
a slow broker never holds up placement or the lease.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable

from sqlalchemy import select

from sp_dagster.cluster.advice import LoadSample
from sp_dagster.cluster.db import ControlPlane, db_now_ms
from sp_dagster.cluster.rates import per_second
from sp_dagster.cluster.schema import deployments, instances
from sp_dagster.cluster.store.load import GroupLoad, prune_load, read_load, record_load
from sp_dagster.errors import DatabaseUnavailable, SpDagsterError

log = logging.getLogger(__name__)

SAMPLE_EVERY_S = 5.0
KEEP_AT_LEAST_S = 300  # history kept: this, or twice the stabilisation window when longer

TopicEnds = Callable[[str], dict[int, int]]  # a topic's end offset per partition (Transport.end_offsets)


def _number(metrics: dict, name: str) -> float | None:
    value = metrics.get(name)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


class LoadSampler:
    """Samples every group's load every `every_s` seconds, keeping `keep_s` seconds of it.

    A sample of a group sums what its running instances last reported (rows_per_s, busy, lag) and reads
    its input topics' end offsets; the arrival rate is their growth since the group's previous sample.
    """

    def __init__(self, plane: ControlPlane, topic_ends: TopicEnds | None, *, keep_s: float, every_s: float = SAMPLE_EVERY_S):
        self.plane = plane
        self.topic_ends = topic_ends
        self.keep_s = keep_s
        self.every_s = every_s
        self._next = 0.0
        self._thread: threading.Thread | None = None
        self._unread: str | None = None  # why end offsets could not be read (logged once)

    def tick(self) -> None:
        """Start a sample in the background when one is due and none is under way."""
        now = time.monotonic()
        if now < self._next or (self._thread is not None and self._thread.is_alive()):
            return
        self._next = now + self.every_s
        self._thread = threading.Thread(target=self._sample_logged, name="load-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Wait (up to `timeout` seconds) for a sample under way."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _sample_logged(self) -> None:
        try:
            self.sample_once()
        except DatabaseUnavailable as exc:  # the manager's own loop says so, once per outage
            log.debug("load sample skipped: %s", exc)
        except Exception as exc:  # a sample is advisory: the next one tries again
            log.warning("load sample failed (%s); the next one is in %.0f s", exc, self.every_s)

    def sample_once(self) -> list[GroupLoad]:
        """Sample every non-receiver group of every deployment now; returns the samples recorded."""
        with self.plane.transaction() as conn:
            now = int(conn.execute(select(db_now_ms())).scalar_one())
            plans = {r.app: json.loads(r.plan) for r in conn.execute(select(deployments.c.app, deployments.c.plan))}
            rows = conn.execute(select(instances.c.app, instances.c.group_name, instances.c.status, instances.c.metrics)).all()
            previous = {key: loads[-1] for key, loads in read_load(conn).items()}
        members: dict[tuple[str, str], list[dict | None]] = defaultdict(list)
        for r in rows:
            members[(r.app, r.group_name)].append(json.loads(r.metrics) if r.status == "running" and r.metrics else None)
        ends: dict[str, int | None] = {}
        samples = []
        for app, plan in sorted(plans.items()):
            for group in plan.get("groups") or []:
                name = group["name"].removeprefix(f"{app}-")
                if group.get("receiver") or (app, name) not in members:
                    continue
                topics = sorted({s["topic"] for s in (group.get("inputs") or {}).values() if s.get("topic")})
                totals = [self._end(topic, ends) for topic in topics]
                input_end = sum(t for t in totals if t is not None) if topics and None not in totals else None
                samples.append(self._sample(app, name, members[(app, name)], input_end, previous.get((app, name)), now))
        with self.plane.transaction() as conn:
            record_load(conn, samples)
            prune_load(conn, now - int(self.keep_s * 1000))
        return samples

    def _end(self, topic: str, cache: dict[str, int | None]) -> int | None:
        """The sum of a topic's end offsets (None when they cannot be read)."""
        if topic not in cache:
            cache[topic] = None
            if self.topic_ends is not None:
                try:
                    cache[topic] = sum(self.topic_ends(topic).values())
                    self._unread = None
                except SpDagsterError as exc:
                    if self._unread != str(exc):
                        log.warning("load samples go without arrival rates: %s", exc)
                    self._unread = str(exc)
        return cache[topic]

    @staticmethod
    def _sample(app: str, group: str, metrics: list[dict | None], input_end: int | None, previous: GroupLoad | None, now: int) -> GroupLoad:
        reported = [m for m in metrics if m is not None]
        rates = [_number(m, "rows_per_s") for m in reported]
        busy = [_number(m, "busy") for m in reported]
        lags = [_number(m, "lag") for m in reported]
        rate = None if previous is None or input_end is None else per_second(previous.input_end, previous.sample.at_ms / 1000, input_end, now / 1000)
        sample = LoadSample(
            at_ms=now,
            parallel=len(metrics),
            arrival_per_s=None if rate is None else round(rate, 2),
            processed_per_s=round(sum(r for r in rates if r is not None), 2),
            busy=tuple(min(1.0, b) for b in busy if b is not None),
            lag=int(sum(v for v in lags if v is not None)),
        )
        return GroupLoad(app, group, input_end, sample)
