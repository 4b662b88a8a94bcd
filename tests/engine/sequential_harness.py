"""Replays the same sends two ways (one send() per send, and send_each) and records everything observable.

Every stream callback and every query callback of the app is recorded, in delivery order, with
a mark where each send starts (the reference marks it itself, send_each through `before`); a
second replay uses Arrow buffers only and no marks (so send_each may deliver segments whole).
The runtime's snapshot at the end is part of the record.
"""

from __future__ import annotations

import pickle
import zlib

import numpy as np

from sp_dagster.engine import AppRuntime

#: (stream, rows, timestamps or None, sizes): one call of send_each, or len(sizes) calls of send
Group = tuple[str, list, list | None, list[int]]


def _observe(runtime: AppRuntime, log: list, buffers: bool) -> dict:
    drains = {}
    for stream, schema in runtime.streams.items():
        if buffers:
            if schema.arrow_capable:
                drains[stream] = runtime.add_buffer(stream)
            continue
        runtime.add_callback(stream, lambda events, s=stream: log.append(("stream", s, [(e.timestamp, e.data, e.is_expired) for e in events])))
    if not buffers:
        for query in runtime.context.query_schemas:
            runtime.add_query_callback(
                query,
                lambda t, cur, rem, q=query: log.append(
                    ("query", q, t, [(e.timestamp, e.data) for e in cur or ()], [(e.timestamp, e.data) for e in rem or ()])
                ),
            )
    return drains


def _state(runtime: AppRuntime):
    return pickle.loads(zlib.decompress(runtime.snapshot()))


def replay(app: str, groups: list[Group], *, fast: bool, buffers: bool = False, wall_times: bool = False) -> list:
    """Everything observable from sending `groups` to `app`, one way or the other.

    With `wall_times`, timestamps of events are left out (the clock is the wall clock).
    """
    runtime = AppRuntime(app)
    log: list = []
    drains = _observe(runtime, log, buffers)
    try:
        for index, (stream, rows, times, sizes) in enumerate(groups):
            log.append(("group", index))
            if fast:
                before = None if buffers else (lambda i: log.append(("send", i)))
                runtime.send_each(stream, rows, times, sizes, before)
            else:
                offset = 0
                for i, size in enumerate(sizes):
                    if not buffers:
                        log.append(("send", i))
                    runtime.send(stream, rows[offset : offset + size], None if times is None else times[offset : offset + size])
                    offset += size
            for stream_name, buffer in drains.items():
                try:
                    batch, stamps = buffer.drain()
                except Exception as exc:  # values a buffer cannot hold (a case sending odd types)
                    log.append(("buffer", stream_name, type(exc).__name__))
                    buffer.rows, buffer.timestamps, buffer.batches = [], [], []
                    continue
                log.append(("buffer", stream_name, batch.to_pylist(), stamps.to_pylist()))
        if not wall_times:
            log.append(("state", _state(runtime)))
    finally:
        runtime.shutdown()
    if wall_times:
        log = [_drop_times(entry) for entry in log]
    return log


def _drop_times(entry):
    kind = entry[0]
    if kind == "stream":
        return (kind, entry[1], [(d, x) for _, d, x in entry[2]])
    if kind == "query":
        return (kind, entry[1], [d for _, d in entry[3]], [d for _, d in entry[4]])
    if kind == "buffer":
        return entry[:3]
    return entry


def random_sizes(rng: np.random.Generator, count: int) -> list[int]:
    """Cut `count` rows into sends: mostly single rows, some runs of several."""
    sizes, left = [], count
    while left:
        size = 1 if rng.random() < 0.6 else int(rng.integers(1, min(left, 6) + 1))
        size = min(size, left)
        sizes.append(size)
        left -= size
    return sizes


def assert_same(app: str, groups: list[Group], wall_times: bool = False) -> None:
    """send_each gives what one send() per send gives, observed both ways."""
    for buffers in (False, True):
        reference = replay(app, groups, fast=False, buffers=buffers, wall_times=wall_times)
        fast = replay(app, groups, fast=True, buffers=buffers, wall_times=wall_times)
        if reference != fast:
            for position, (a, b) in enumerate(zip(reference, fast)):
                if a != b:
                    raise AssertionError(f"first difference at entry {position} (buffers={buffers}):\n reference {a}\n send_each {b}")
            raise AssertionError(f"different lengths {len(reference)} vs {len(fast)} (buffers={buffers})")
