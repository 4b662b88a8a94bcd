"""Control-plane failover: how long until a new leader after the leader dies, and a dead worker is noticed.

Run: python bench/failover.py [--url URL] [--runs N] [--managers N] [--heartbeat-interval MS] ...
Prints one JSON line per measurement and one summary line per figure. Without --url it uses
a fresh SQLite file. Managers and the worker are separate processes killed with SIGKILL;
times are measured here, from the kill to the moment the database shows the change (polled
every 5 ms). Expected: failover near heartbeatInterval x heartbeatMaxRetry (the lease), and
detection near the worker's heartbeatInterval x heartbeatMaxRetry, plus up to one polling
interval.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.election import current_leader
from sp_dagster.cluster.membership import list_nodes
from sp_dagster.cluster.processes import ManagerProcess, manager_config

ROOT = Path(__file__).resolve().parents[1]

# A resource node that only registers and heartbeats, at the pace the leader asks for.
WORKER = """
import sys, time
from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.fencing import NodeSession
session = NodeSession(ControlPlane(sys.argv[1]), sys.argv[2], heartbeat_interval_ms=int(sys.argv[3]))
while True:
    session.beat()
    time.sleep(session.heartbeat_interval_s)
"""


def wait_for(condition, timeout: float = 60.0, interval: float = 0.005):
    """Poll until `condition()` is truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except Exception:  # the database may be busy for a moment; poll again
            value = None
        if value:
            return value
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout}s")


def live_leader(plane, newer_than: int = 0):
    """The lease if a manager holds it unexpired in a term after `newer_than`."""
    lease = current_leader(plane)
    return lease if lease and lease.alive and lease.term > newer_than else None


def summary(figure: str, values: list[float], **extra) -> None:
    """Print the summary line of a figure."""
    print(
        json.dumps(
            {
                "bench": f"failover.{figure}",
                "runs": len(values),
                "min_ms": round(min(values)),
                "p50_ms": round(statistics.median(values)),
                "mean_ms": round(statistics.mean(values)),
                "max_ms": round(max(values)),
                **extra,
            }
        ),
        flush=True,
    )


def measure_leader_failover(plane, procs, runs: int, graceful: bool) -> list[float]:
    """Kill (or SIGTERM) the leader `runs` times; milliseconds until another manager leads."""
    by_id = {p.node_id: p for p in procs}
    times = []
    for run in range(runs):
        lease = wait_for(lambda: live_leader(plane))
        time.sleep(1.0 + random.uniform(0, 0.5))  # a steady state, killed at a random phase of the renewals
        lease = wait_for(lambda: live_leader(plane))
        victim = by_id[lease.holder]
        started = time.monotonic()
        if graceful:
            victim.process.send_signal(signal.SIGTERM)
        else:
            victim.kill()
        new = wait_for(lambda: live_leader(plane, newer_than=lease.term))
        elapsed = (time.monotonic() - started) * 1000
        times.append(elapsed)
        figure = "leader_handover" if graceful else "leader_failover"
        print(
            json.dumps({"bench": f"failover.{figure}.run", "run": run + 1, "ms": round(elapsed), "from": lease.holder, "to": new.holder, "term": new.term}),
            flush=True,
        )
        if graceful:
            victim.process.wait(15)
        victim.start()
    return times


def measure_worker_detection(plane, url: str, runs: int, interval_ms: int) -> list[float]:
    """Start a heartbeating worker process, SIGKILL it `runs` times; milliseconds until it is declared dead."""
    times = []
    for run in range(runs):
        node_id = f"bench-worker-{run + 1}"
        worker = subprocess.Popen([sys.executable, "-c", WORKER, url, node_id, str(interval_ms)], cwd=ROOT)
        try:
            wait_for(lambda: any(n.node_id == node_id and n.state == "alive" for n in list_nodes(plane)))
            time.sleep(2.0 + random.uniform(0, interval_ms / 1000))  # several heartbeats in, at a random phase
        finally:
            worker.kill()
            worker.wait(10)
        started = time.monotonic()
        wait_for(lambda: any(n.node_id == node_id and n.state == "dead" for n in list_nodes(plane)))
        elapsed = (time.monotonic() - started) * 1000
        times.append(elapsed)
        print(json.dumps({"bench": "failover.worker_detection.run", "run": run + 1, "ms": round(elapsed)}), flush=True)
    return times


def main() -> None:
    """Start the managers, measure every figure, stop everything."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="control-plane database (default: a new SQLite file)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--managers", type=int, default=3)
    parser.add_argument("--heartbeat-interval", type=int, default=500, help="managers' lease renewal, ms")
    parser.add_argument("--max-retry", type=int, default=3, help="managers' heartbeatMaxRetry")
    parser.add_argument("--poll", type=int, default=200, help="eventPollingInterval, ms")
    parser.add_argument("--worker-heartbeat-interval", type=int, default=500, help="workers' heartbeatInterval, ms")
    parser.add_argument("--worker-max-retry", type=int, default=3, help="workers' heartbeatMaxRetry")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sp-dagster-failover-"))
    url = args.url or f"sqlite:///{work / 'control-plane.db'}"
    plane = ControlPlane(url)
    plane.migrate()
    conf = work / "manager.yaml"
    conf.write_text(
        manager_config(
            url,
            heartbeat_interval_ms=args.heartbeat_interval,
            heartbeat_max_retry=args.max_retry,
            event_polling_interval_ms=args.poll,
            worker_heartbeat_interval_ms=args.worker_heartbeat_interval,
            worker_heartbeat_max_retry=args.worker_max_retry,
        )
    )
    procs = [ManagerProcess(conf, f"m{i}", log_path=work / f"m{i}.log", cwd=ROOT).start() for i in range(1, args.managers + 1)]
    database = "mariadb" if getattr(plane.engine.dialect, "is_mariadb", False) else plane.dialect
    setting = {"database": database, "managers": args.managers}
    try:
        lease_ms = args.heartbeat_interval * args.max_retry
        failover = measure_leader_failover(plane, procs, args.runs, graceful=False)
        summary("leader_failover", failover, expected_ms=lease_ms, heartbeat_interval_ms=args.heartbeat_interval, max_retry=args.max_retry, **setting)
        handover = measure_leader_failover(plane, procs, args.runs, graceful=True)
        summary("leader_handover", handover, note="SIGTERM: the leader resigns its lease", **setting)
        dead_ms = args.worker_heartbeat_interval * args.worker_max_retry
        detection = measure_worker_detection(plane, url, args.runs, args.worker_heartbeat_interval)
        summary(
            "worker_detection",
            detection,
            expected_ms=dead_ms,
            poll_ms=args.poll,
            heartbeat_interval_ms=args.worker_heartbeat_interval,
            max_retry=args.worker_max_retry,
            **setting,
        )
    finally:
        for proc in procs:
            proc.stop()
        plane.close()


if __name__ == "__main__":
    main()
