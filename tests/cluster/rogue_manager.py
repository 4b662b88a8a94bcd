"""A manager that keeps writing as leader after it lost the lease: the chaos test's adversary.

It runs like any manager (`python -m tests.cluster.rogue_manager manager --conf F --id ID
--journal J`), and a second thread remembers the last leadership it held. Whenever that
leadership is no longer current, the thread keeps trying to move instances in the old term,
with a deadline it trusts for ever: a manager whose renewal stalled (a paused thread, a
clock running slow) while its placement work went on. Only the database's fencing can stop
those writes; each attempt is journaled as `stale-attempt` with whether it was refused.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from dataclasses import replace

from sp_dagster.cli.cluster import register
from sp_dagster.cluster.allocation import Allocation, AllocationAlgorithm
from sp_dagster.cluster.election import LeadershipLost
from sp_dagster.cluster.manager import Manager, run_until_signalled
from sp_dagster.cluster.reconcile import reconcile
from sp_dagster.config.loader import load_config


class Rotate(AllocationAlgorithm):
    """Moves every instance to the next alive node: a stale leader always has something to write."""

    name = "rotate"

    def allocate(self, request):
        nodes = sorted(n.node_id for n in request.nodes if not n.receiver)
        if not nodes:
            return Allocation({}, {i.instance_id: "no nodes" for i in request.instances})
        placement = {}
        for instance in request.instances:
            current = request.current.get(instance.instance_id)
            index = nodes.index(current) + 1 if current in nodes else 0
            placement[instance.instance_id] = nodes[index % len(nodes)]
        return Allocation(placement, {})


def keep_writing_stale(manager: Manager, stop: threading.Event) -> None:
    """Every 50 ms, write as the last leadership held once it is no longer the current one."""
    last = None
    while not stop.wait(0.05):
        current = manager.elector.leadership
        if current is not None:
            last = current
            continue
        if last is None:
            continue
        forged = replace(last, deadline=float("inf"))
        try:
            result = reconcile(manager.plane, forged, algorithm=Rotate(), min_resource_count=1, node_max_age_ms=10**9)
        except LeadershipLost:
            manager.journal.write("stale-attempt", node=manager.node_id, term=last.term, refused=True)
        except Exception as exc:  # the database may be busy or gone; try again
            logging.getLogger(__name__).debug("stale attempt failed: %s", exc)
        else:
            manager.journal.write("stale-attempt", node=manager.node_id, term=last.term, refused=False)
            manager._report(result, rebalance=False)


def main() -> None:
    parser = argparse.ArgumentParser(prog="rogue-manager")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    manager = Manager(load_config(args.conf, role="manager", node_id=args.id), journal=args.journal)
    stop = threading.Event()
    threading.Thread(target=keep_writing_stale, args=(manager, stop), daemon=True).start()
    try:
        run_until_signalled(manager)
    finally:
        stop.set()
        time.sleep(0.1)


if __name__ == "__main__":
    main()
