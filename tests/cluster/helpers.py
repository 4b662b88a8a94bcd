"""Helpers of the control-plane tests: workers that heartbeat in a thread, a settled cluster."""

from __future__ import annotations

import threading

from sqlalchemy import BigInteger, Column, Integer, LargeBinary, MetaData, String, Table, select

from sp_dagster.cluster.election import current_leader
from sp_dagster.cluster.fencing import NodeSession
from sp_dagster.cluster.membership import list_nodes
from sp_dagster.cluster.schema import assignments
from sp_dagster.cluster.store.deployments import list_instances


def all_at_once(function, items) -> list:
    """Call function(item) for every item in its own thread, all released together; returns the results.

    Raises the first exception any call raised.
    """
    barrier = threading.Barrier(len(items))
    results: list = [None] * len(items)
    errors: list[BaseException] = []

    def call(index, item):
        barrier.wait()
        try:
            results[index] = function(item)
        except Exception as exc:  # re-raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i, item)) for i, item in enumerate(items)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]
    return results


def settled(plane):
    """The lease if a live leader has placed every instance on an alive node, all in its term; else None."""
    lease = current_leader(plane)
    if lease is None or not lease.alive:
        return None
    alive = {n.node_id: n.incarnation for n in list_nodes(plane) if n.state == "alive"}
    rows = list_instances(plane)
    with plane.transaction() as conn:
        placed = conn.execute(select(assignments.c.node_id, assignments.c.node_incarnation, assignments.c.term)).all()
    current = all(alive.get(a.node_id) == a.node_incarnation for a in placed)  # not an earlier incarnation
    assigned_terms = {a.term for a in placed}
    return lease if rows and all(r.node_id in alive for r in rows) and current and assigned_terms == {lease.term} else None


class Workers:
    """Resource nodes that heartbeat from a background thread (stand-ins for worker processes)."""

    def __init__(self, plane, node_ids, interval_ms: int = 100, max_retry: int = 3, leader_retry_ms: int = 60_000):
        self.sessions = {
            n: NodeSession(plane, n, heartbeat_interval_ms=interval_ms, heartbeat_max_retry=max_retry, leader_retry_interval_ms=leader_retry_ms)
            for n in node_ids
        }
        self.silent: set[str] = set()
        self.interval = interval_ms / 1000
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Workers:
        for session in self.sessions.values():
            session.beat()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for node_id, session in list(self.sessions.items()):
                if node_id in self.silent:
                    continue
                if session.fenced:
                    session.acknowledge_fence()  # a stand-in has nothing to stop
                session.beat()

    def instances(self, node_id: str) -> list[str]:
        """The instance ids the node currently sees assigned to it."""
        return [i.instance_id for i in self.sessions[node_id].assignments().instances]


def first_revision_layout(name: str = "PERSISTENCE_TABLE") -> Table:
    """The revision table as the worker's first database store created it (gzip'd snapshots, no numbers)."""
    return Table(
        name,
        MetaData(),
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("siddhiAppName", String(100), nullable=False, index=True),
        Column("revision", String(300), nullable=False),
        Column("snapshot", LargeBinary(length=2**31 - 1), nullable=False),
        Column("savedAt", BigInteger, nullable=False),
    )
