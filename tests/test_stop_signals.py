"""Stop signals: acted on outside the handler, so a process that holds a lock when SIGTERM arrives still stops."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time

# The main thread holds the lock that stopping needs when SIGTERM arrives. Called in the
# handler, stop() would wait for that lock in the very thread that holds it: for ever.
HOLDS_THE_LOCK = textwrap.dedent(
    """
    import os, signal, threading, time
    from sp_dagster.subprocesses import on_stop_signal

    lock, stopped = threading.Lock(), threading.Event()

    def stop():
        with lock:
            stopped.set()

    on_stop_signal(stop)
    with lock:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)  # the handler has run by now, in this thread
    print("stopped" if stopped.wait(10) else "still running", flush=True)
    """
)


def test_a_process_holding_the_stop_lock_still_stops_on_sigterm():
    done = subprocess.run([sys.executable, "-c", HOLDS_THE_LOCK], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"


def test_sigusr1_prints_every_threads_stack_and_the_process_goes_on():
    code = textwrap.dedent(
        """
        import threading, time
        from sp_dagster.subprocesses import on_stop_signal

        stop = threading.Event()
        on_stop_signal(stop.set)
        print("ready", flush=True)
        while not stop.wait(0.05):
            pass
        print("stopped", flush=True)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGUSR1)
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0 and out.strip() == "stopped"
    # Both threads, each with where it is: the main loop and the thread waiting for a stop signal.
    assert "Current thread" in err and re.search(r"File \"<string>\", line \d+ in <module>", err), err
    assert "subprocesses.py" in err and "in relay" in err, err
