"""Chaos: four manager processes killed, paused and restarted for 30 s (SP_CHAOS_SECONDS), on each database.

Every manager is a separate OS process (`sp-dagster manager`; the fourth is the adversary in
`rogue_manager.py`, which keeps writing in terms it no longer holds) writing a journal of what it
believed: each term it led and each leader write it committed, with the term and the lease's
fence sequence number. An observer thread samples the lease every 20 ms. Meanwhile workers
fall silent and come back, and deployments change, so leaders have real work to do.
Afterwards the history is checked:

- the database recorded each term once, terms 1..N with no gap, and no process ever
  believed it led a term that the database gave to another process (journals, observer);
- every leader write in the event log (assignments, removals, deaths), ordered by fence
  sequence, carries the term of the latest election before it: nothing was written by a
  stale term, not even by a leader that was paused (SIGSTOP) past its lease and resumed;
- every write a process journaled is in the event log with the same term and sequence;
- once the chaos stops, the cluster converges: every instance is placed on an alive worker
  by the final term.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.election import current_leader
from sp_dagster.cluster.processes import ManagerProcess, manager_config
from sp_dagster.cluster.store.deployments import InstanceSpec, list_instances, record_deployment, remove_deployment
from tests.cluster.helpers import Workers, settled
from tests.cluster.history import Observer, check_history
from tests.fixtures.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
MANAGERS = 4
WORKERS = ("w1", "w2", "w3", "w4")
TIMING = dict(heartbeat_interval_ms=200, heartbeat_max_retry=3, event_polling_interval_ms=200, worker_heartbeat_interval_ms=150, worker_heartbeat_max_retry=4)
LEASE_S = 0.6


def chaos_seconds() -> float:
    """How long the chaos lasts: 30 s (26-28 faults and 16-21 terms here), or SP_CHAOS_SECONDS for a longer soak."""
    return float(os.environ.get("SP_CHAOS_SECONDS", 30))


def app_instances(app: str, parallel: int) -> list[InstanceSpec]:
    return [
        InstanceSpec(f"{app}-{group}-{i}", group, i, f"@App:name('{app}-{group}-{i}')")
        for group, count in (("filter", parallel), ("window", 2))
        for i in range(1, count + 1)
    ]


def stale_refusals(journal: Path) -> int:
    """How many stale writes the adversary's journal says were refused so far."""
    if not journal.exists():
        return 0
    complete = journal.read_text().split("\n")[:-1]  # the last line may be half written
    lines = [json.loads(line) for line in complete if line.strip()]
    return sum(1 for e in lines if e["event"] == "stale-attempt" and e["refused"])


def record(plane, app, parallel):
    record_deployment(plane, app, content_hash=f"{app}:{parallel}", source="s", plan={"parallel": parallel}, instances=app_instances(app, parallel))


@pytest.mark.slow
def test_chaos_one_leader_per_term_and_no_stale_writes(tmp_path, database_url):
    rng = random.Random(20240611)
    plane = ControlPlane(database_url)
    plane.migrate()
    conf = tmp_path / "manager.yaml"
    conf.write_text(manager_config(database_url, **TIMING))
    # The last manager is the adversary: after losing the lease it keeps writing in its old term.
    procs = {
        f"m{i}": ManagerProcess(
            conf,
            f"m{i}",
            journal=tmp_path / f"m{i}.jsonl",
            log_path=tmp_path / f"m{i}.log",
            cwd=ROOT,
            module="tests.cluster.rogue_manager" if i == MANAGERS else "sp_dagster.cli",
        )
        for i in range(1, MANAGERS + 1)
    }
    rogue = procs[f"m{MANAGERS}"]
    rogue.start()  # it leads first, so it surely has a term to lose
    wait_until(lambda: (lambda lease: lease and lease.holder == rogue.node_id)(current_leader(plane)), what="the rogue to lead")
    for proc in procs.values():
        if proc is not rogue:
            proc.start()
    observer = Observer(ControlPlane(database_url))
    observer.start()
    actions: dict[str, int] = defaultdict(int)
    restart_at: dict[str, float] = {}
    workers = Workers(ControlPlane(database_url), WORKERS, interval_ms=150, max_retry=4)
    try:
        with workers:
            for app, parallel in (("orders", 3), ("clicks", 2), ("alerts", 1)):
                record(plane, app, parallel)
            wait_until(lambda: all(i.node_id for i in list_instances(plane)), timeout=30, what="first placement")
            # Opening act, so the adversary surely goes stale once: the rogue, still leading, is
            # paused past its lease while the others are up, then resumed.
            wait_until(lambda: all(p.ready for p in procs.values()), timeout=30, what="managers to start")
            if (lambda lease: lease and lease.holder == rogue.node_id)(current_leader(plane)):
                rogue.signal(signal.SIGSTOP)
                time.sleep(2.5 * LEASE_S)
                rogue.signal(signal.SIGCONT)
                actions["sigstop-leader"] += 1
                wait_until(lambda: stale_refusals(tmp_path / f"m{MANAGERS}.jsonl") > 0, timeout=30, what="the paused rogue to try a stale write and be refused")
            end = time.monotonic() + chaos_seconds()
            next_change = time.monotonic() + 5
            deck: list[str] = []
            while time.monotonic() < end:
                now = time.monotonic()
                for node_id, due in list(restart_at.items()):
                    if now >= due:
                        procs[node_id].start()
                        del restart_at[node_id]
                lease = current_leader(plane)
                leader = procs.get(lease.holder) if lease and lease.alive else None
                running = [p for p in procs.values() if p.alive and p.node_id not in restart_at]
                if not deck:  # every action comes up in each round of the deck, in random order
                    deck = ["sigkill-leader", "sigkill-leader", "sigstop-leader", "sigkill-any", "sigterm-any"]
                    rng.shuffle(deck)
                action = deck.pop()
                if action.endswith("-leader") and (leader is None or not leader.alive):
                    action = "sigkill-any"
                elif leader is rogue and action == "sigkill-leader":
                    action = "sigstop-leader"  # a killed rogue forgets its term; a paused one goes stale
                if action == "sigkill-leader":
                    leader.kill()
                    restart_at[leader.node_id] = now + rng.uniform(0.3, 1.5)
                elif action == "sigstop-leader":
                    leader.signal(signal.SIGSTOP)  # paused past its lease, then resumed
                    time.sleep(rng.uniform(1.5, 2.5) * LEASE_S)
                    leader.signal(signal.SIGCONT)
                elif action == "sigkill-any" and running:
                    victim = rng.choice(running)
                    victim.kill()
                    restart_at[victim.node_id] = now + rng.uniform(0.3, 1.5)
                elif action == "sigterm-any" and (ready := [p for p in running if p.ready]):  # its handler is set up
                    victim = rng.choice(ready)
                    code = victim.stop()
                    assert code == 0, f"{victim.node_id} exited with {code} on SIGTERM: {Path(victim.log_path).read_text()[-3000:]}"
                    restart_at[victim.node_id] = now + rng.uniform(0.1, 0.5)
                else:
                    action = "none"
                actions[action] += 1
                if now >= next_change:  # churn: a worker falls silent, an app changes
                    silent = rng.choice(WORKERS)
                    workers.silent = {silent}
                    threading.Timer(1.5, workers.silent.discard, args=(silent,)).start()  # this round's node, not the next round's
                    record(plane, "orders", rng.choice((2, 3, 4)))
                    if rng.random() < 0.5:
                        remove_deployment(plane, "alerts")
                    else:
                        record(plane, "alerts", 1)
                    actions["churn"] += 1
                    next_change = now + rng.uniform(3, 6)
                time.sleep(rng.uniform(0.5, 1.5))
            for node_id in list(restart_at):
                procs[node_id].start()
            workers.silent = set()
            # Converge: a live leader has placed every instance on an alive worker, in its term.
            final = wait_until(lambda: settled(plane), timeout=30, what="convergence after the chaos")
    finally:
        observer.stop.set()
        observer.join(5)
        for proc in procs.values():  # a SIGTERM before the handler is set up would just kill it
            wait_until(lambda: proc.ready or not proc.alive, timeout=30, what=f"{proc.node_id} to start")
        codes = {name: proc.stop() for name, proc in procs.items()}
    figures = check_history(plane, [tmp_path / f"m{i}.jsonl" for i in range(1, MANAGERS + 1)], observer)
    logs = "".join((tmp_path / f"m{i}.log").read_text() for i in range(1, MANAGERS + 1))
    assert "Traceback" not in logs
    assert set(codes.values()) == {0}, codes
    # The chaos really happened: leaders died and were paused; many terms went by.
    assert actions["sigkill-leader"] >= 3 and actions["sigstop-leader"] >= 1, dict(actions)
    assert figures["terms"] >= 8 and figures["leader_writes_in_db"] > 0, figures
    # ... and the adversary really tried to write in terms that were over, and was refused.
    assert figures["stale_attempts_refused"] > 0, figures
    fenced_out = logs.count("lost leadership")
    print(
        json.dumps({"backend": database_url.split(":")[0], "final_term": final.term, **figures, "actions": dict(actions), "lost_leadership_lines": fenced_out})
    )
    plane.close()
