"""A watch on a loop: when one pass takes longer than STUCK_AFTER_S it logs, once, where the loop is. A
call that does not keep its timeout (a client waiting on a peer that a network partition took away)
keeps a loop from acting on time; this says which call it was.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback

log = logging.getLogger(__name__)

STUCK_AFTER_S = 5.0


class StuckWatch:
    """Watches the loop running on the thread that makes it; `beat()` at the start of every pass."""

    def __init__(self, name: str):
        self.name, self.thread_id = name, threading.get_ident()
        self.since, self.told = time.monotonic(), False
        self._stop = threading.Event()
        threading.Thread(target=self._run, name=f"stuck-watch-{name}", daemon=True).start()

    def beat(self) -> None:
        """A new pass of the loop begins."""
        self.since, self.told = time.monotonic(), False

    def stop(self) -> None:
        """The loop ended."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            busy = time.monotonic() - self.since
            if busy > STUCK_AFTER_S and not self.told:
                self.told = True
                frame = sys._current_frames().get(self.thread_id)
                where = "".join(traceback.format_stack(frame, limit=6)) if frame is not None else "(unknown)"
                log.warning("%s: one pass of its loop has taken %.0f s so far, in:\n%s", self.name, busy, where)
