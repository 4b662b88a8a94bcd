"""frequent(n [, attrs]) and lossyFrequent(support [, error] [, attrs]) windows.
Both key events by the string form of the chosen attributes (all of them by default) and walk
their counts in Java hash-map order, which decides the order of expired events.
"""

from __future__ import annotations

import math

from sp_dagster.engine.events import EXPIRED
from sp_dagster.engine.javahash import hash_order
from sp_dagster.engine.values import java_str
from sp_dagster.engine.windows.base import WindowProcessor, load_events


class _KeyedWindow(WindowProcessor):
    first_attribute = 1

    def _key_attributes(self):
        getters = []
        for index in range(self.first_attribute, len(self.params)):
            executor = self.attribute(index, ("int", "long", "float", "double", "string", "bool", "object"), "attribute")
            getters.append((executor.row, executor.type))
        self.key_getters = getters

    def key_of(self, event) -> str:
        """The event's key: its chosen attribute values' strings, concatenated."""
        if self.key_getters:
            return "".join(java_str(g(event), t) for g, t in self.key_getters)
        return "".join(java_str(v, t) for v, t in zip(event.data, self.context.schema.types))


class FrequentWindow(_KeyedWindow):
    """Keeps the latest event of the n most frequent keys (Misra-Gries counting)."""

    name = "frequent"

    def configure(self):
        if not self.params:
            raise self.error("takes an event count and optional attributes")
        self.most = self.constant(0, ("int",), "event.count")
        self._key_attributes()
        self.counts: dict[str, int] = {}
        self.latest: dict = {}

    def process(self, chunk):
        now = self.clock.now()
        out = []
        for event in chunk:
            key = self.key_of(event)
            clone = event.copy(EXPIRED)
            existed = key in self.latest
            self.latest[key] = clone
            if existed:
                self.counts[key] += 1
                out.append(event)
                continue
            if len(self.latest) > self.most:
                for other in hash_order(self.counts)[: self.most]:
                    count = self.counts[other] - 1
                    if count == 0:
                        del self.counts[other]
                        expired = self.latest.pop(other)
                        expired.timestamp = now
                        out.append(expired)
                    else:
                        self.counts[other] = count
                if len(self.latest) > self.most:
                    del self.latest[key]
                else:
                    self.counts[key] = 1
                    out.append(event)
            else:
                self.counts[key] = 1
                out.append(event)
        self.forward(out)

    def held(self):
        return list(self.latest.values())

    def dump(self):
        return [list(self.counts.items()), [[k, e.dump()] for k, e in self.latest.items()]]

    def load(self, state):
        counts, latest = state
        self.counts = dict(counts)
        self.latest = {k: load_events([e])[0] for k, e in latest}


class LossyFrequentWindow(_KeyedWindow):
    """Emits events whose key occurs in at least (support - error) of all events (lossy counting)."""

    name = "lossyFrequent"

    def configure(self):
        if not self.params:
            raise self.error("takes a support threshold, an optional error bound and optional attributes")
        self.support = float(self.constant(0, ("double", "float"), "support.threshold"))
        self.first_attribute = 1
        if len(self.params) > 1 and self.params[1].executor.constant:
            self.error_bound = float(self.constant(1, ("double", "float"), "error.bound"))
            self.first_attribute = 2
        else:
            self.error_bound = self.support / 10
        self._key_attributes()
        self.width = math.ceil(1 / self.error_bound)
        self.total = 0
        self.bucket = 1.0
        self.counts: dict[str, list[int]] = {}
        self.latest: dict = {}

    def process(self, chunk):
        now = self.clock.now()
        out = []
        for event in chunk:
            self.total += 1
            if self.total != 1:
                self.bucket = math.ceil(self.total / self.width)
            key = self.key_of(event)
            existed = key in self.latest
            self.latest[key] = event.copy(EXPIRED)
            if existed:
                self.counts[key][0] += 1
            else:
                self.counts[key] = [1, int(self.bucket) - 1]
            threshold = (self.support - self.error_bound) * self.total
            if self.counts[key][0] >= threshold:
                out.append(event)
            if self.total % self.width == 0:
                for other in hash_order(self.counts):
                    count, bucket_id = self.counts[other]
                    if count + bucket_id <= self.bucket:
                        del self.counts[other]
                        expired = self.latest.pop(other)
                        expired.timestamp = now
                        out.append(expired)
        self.forward(out)

    def held(self):
        return list(self.latest.values())

    def dump(self):
        return [self.total, self.bucket, list(self.counts.items()), [[k, e.dump()] for k, e in self.latest.items()]]

    def load(self, state):
        self.total, self.bucket, counts, latest = state
        self.counts = {k: list(v) for k, v in counts}
        self.latest = {k: load_events([e])[0] for k, e in latest}


WINDOWS = {"frequent": FrequentWindow, "lossyFrequent": LossyFrequentWindow}
