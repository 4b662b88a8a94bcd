"""sort(n, attribute [, 'asc'|'desc'], ...): keeps the n first events in sort order."""

from __future__ import annotations

import functools

from sp_dagster.engine.events import EXPIRED
from sp_dagster.engine.values import java_compare
from sp_dagster.engine.windows.base import WindowProcessor, dump_events, load_events


class SortWindow(WindowProcessor):
    """On overflow, the last event in sort order leaves (after the arriving event)."""

    name = "sort"

    def configure(self):
        if len(self.params) < 2:
            raise self.error("takes a length and at least one attribute to sort by")
        self.length = self.constant(0, ("int",), "window.length")
        self.keys: list[tuple] = []
        index = 1
        while index < len(self.params):
            getter = self.attribute(index, ("int", "long", "float", "double", "string", "bool"), "sort attribute").row
            order = 1
            if index + 1 < len(self.params) and self.params[index + 1].executor.type == "string":
                text = self.constant(index + 1, ("string",), "order")
                if text.lower() not in ("asc", "desc"):
                    raise self.error("order must be 'asc' or 'desc'", index + 1)
                order = -1 if text.lower() == "desc" else 1
                index += 1
            self.keys.append((getter, order))
            index += 1
        self.window: list = []
        self._sort_key = functools.cmp_to_key(self._compare)

    def _compare(self, a, b) -> int:
        for getter, order in self.keys:
            result = java_compare(getter(a), getter(b))
            if result:
                return order * result
        return 0

    def process(self, chunk):
        now = self.clock.now()
        out = []
        for event in chunk:
            out.append(event)
            self.window.append(event.copy(EXPIRED))
            if len(self.window) > self.length:
                self.window.sort(key=self._sort_key)
                expired = self.window.pop()
                expired.timestamp = now
                out.append(expired)
        self.forward(out)

    def held(self):
        return self.window

    def dump(self):
        return dump_events(self.window)

    def load(self, state):
        self.window = load_events(state)


WINDOWS = {"sort": SortWindow}
