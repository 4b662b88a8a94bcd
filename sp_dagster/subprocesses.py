"""Process lifetime, on the ground floor: children that never outlive their parent, and stop
signals acted on outside the signal handler (embedded servers, nodes and the Dagster UI use it)."""

import faulthandler
import queue
import signal
import threading
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def die_with_parent() -> None:
    """In the child, before exec: on Linux, ask for SIGTERM when the parent process dies."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def on_stop_signal(stop: Callable[[], object]) -> None:
    """Call `stop()` on SIGTERM or SIGINT, from a helper thread; SIGUSR1 prints every thread's stack.

    A handler runs in the main thread between two of its bytecodes, possibly while that thread
    holds a lock: `threading.Event.set()` or a node's own `stop()` called right there can wait
    for that lock for ever. The handler only puts the signal on a SimpleQueue (reentrant by
    design); a daemon thread takes it off and stops the process.
    """
    received: queue.SimpleQueue[int] = queue.SimpleQueue()

    def relay() -> None:
        while True:
            received.get()
            stop()

    threading.Thread(target=relay, name="stop-signal", daemon=True).start()
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda signum, _frame: received.put(signum))
    faulthandler.register(signal.SIGUSR1, all_threads=True)
