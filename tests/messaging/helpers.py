"""Helpers the messaging-layer tests share: publish rows, read partitions back."""

from __future__ import annotations

import time

from sp_dagster.messaging import EARLIEST, JsonCodec

SCHEMA = [("symbol", "string"), ("price", "double"), ("volume", "long")]


def read_all(transport, topic, partitions, codec, expected, timeout=15.0):
    """Read the given partitions from the start until `expected` events (and rejects) arrived, then one poll more."""
    reader = transport.reader(topic, {p: EARLIEST for p in partitions}, codec)
    events, rejects = [], []
    deadline = time.monotonic() + timeout
    try:
        while len(events) + len(rejects) < expected and time.monotonic() < deadline:
            batch = reader.poll(timeout=0.5)
            events += batch.events
            rejects += batch.rejects
        # Nothing more than expected may arrive.
        extra = reader.poll(timeout=0.5)
        events += extra.events
        rejects += extra.rejects
        return events, rejects, reader.positions()
    finally:
        reader.close()


def poll_until(reader, count, timeout=15.0, max_events=10_000):
    """Poll a reader until `count` events arrived (or timeout); returns them."""
    events = []
    deadline = time.monotonic() + timeout
    while len(events) < count and time.monotonic() < deadline:
        events += reader.poll(max_events=max_events, timeout=0.5).events
    return events


def publish(transport, topic, strategy, rows, codec=None, timestamps=None):
    """Publish rows with a strategy and wait for the acknowledgements; returns how many messages went out."""
    publisher = transport.publisher(topic, codec or JsonCodec(SCHEMA), strategy)
    sent = publisher.send(rows, timestamps)
    publisher.flush()
    return sent
