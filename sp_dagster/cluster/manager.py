"""The manager process: elect a leader, watch membership, reconcile deployments with placements.
Every manager of a group runs the same loop (`Manager.run`): it renews or tries to take the lease, and
the leader runs one reconcile pass at a time; the loop and its timings are under "Leases and terms" in
docs/concepts/control-plane.md.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy.exc import DBAPIError

from sp_dagster.cluster.allocation import AllocationAlgorithm, load_algorithm
from sp_dagster.cluster.db import Connectivity, ControlPlane, short_reason
from sp_dagster.cluster.election import Elector, Leadership, LeadershipLost, rebalance_requests
from sp_dagster.cluster.prometheus import Family, serve_metrics
from sp_dagster.cluster.reconcile import ReconcileResult, reconcile
from sp_dagster.cluster.sampler import KEEP_AT_LEAST_S, LoadSampler, TopicEnds
from sp_dagster.cluster.store.events import prune_events
from sp_dagster.errors import DatabaseUnavailable
from sp_dagster.subprocesses import on_stop_signal
from sp_dagster.wording import counted

log = logging.getLogger(__name__)

PRUNE_EVERY_S = 60.0
RELEASE_POLL_S = 0.1  # the leader's pace while an owner is asked to let go of an instance


class Journal:
    """An append-only JSON-lines record of one process's leadership changes and leader writes."""

    def __init__(self, path: str | Path | None):
        self._file = open(path, "a", buffering=1, encoding="utf-8") if path else None
        self._lock = threading.Lock()

    def write(self, event: str, **fields: Any) -> None:
        """Append one line (flushed at once, so it survives a SIGKILL right after)."""
        with self._lock:
            if self._file is not None:
                self._file.write(json.dumps({"event": event, "pid": os.getpid(), "time": time.time(), **fields}, sort_keys=True) + "\n")

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class Manager:
    """One manager node of a group; `run(stop)` until stop is set.

    Each heartbeatInterval (cluster.config strategyConfig) it renews or tries to take the lease; the
    leader, every eventPollingInterval, runs one reconcile pass (dead nodes, placement, statuses) and
    rebalances when a node has joined or a rebalance was requested. When the database goes away the loop
    backs off and keeps trying, logging once when it goes and once when it is back; it stops acting as
    leader as soon as its lease may have expired, and every leader write is fenced by the term anyway.
    """

    def __init__(
        self,
        config,
        *,
        plane: ControlPlane | None = None,
        journal: str | Path | None = None,
        algorithm: AllocationAlgorithm | None = None,
        topic_ends: TopicEnds | None = None,
    ):
        self.config = config
        self.node_id = config.node_id
        self.group_id = config.cluster.group_id
        self.plane = plane or ControlPlane.from_config(config, migrate=False)
        strategy, deployment = config.cluster.strategy_config, config.deployment
        self.heartbeat_s = strategy.heartbeat_interval / 1000
        self.poll_s = strategy.event_polling_interval / 1000
        self.lease_ms = strategy.heartbeat_interval * strategy.heartbeat_max_retry
        self.node_max_age_ms = deployment.heartbeat_interval * deployment.heartbeat_max_retry
        self.min_resource_count = deployment.min_resource_count
        self.algorithm = algorithm or load_algorithm(deployment.allocation_algorithm)
        self.journal = Journal(journal)
        https = deployment.https_interface
        self.elector = Elector(
            self.plane,
            self.group_id,
            self.node_id,
            lease_ms=self.lease_ms,
            address=f"{https.host}:{https.port}",
            node_heartbeat_ms=deployment.heartbeat_interval,
            node_max_retry=deployment.heartbeat_max_retry,
            listener=self._on_election,
        )
        self.connectivity = Connectivity(self.plane, self.heartbeat_s, max(2.0, self.heartbeat_s), log)
        self._migrated = False
        self._known_alive: set[str] | None = None
        self._rebalance_seen: int | None = None
        self._rebalance_due = False
        self._last_prune = time.monotonic()
        self._cut_off: set[str] = set()
        self._last_pass: ReconcileResult | None = None  # the latest leader pass (for /metrics)
        self._totals = {"reconciles": 0, "dead": 0, "placed": 0}
        self.metrics_endpoint = None
        # The groups' load, for parallelism advice (arrival rates need `topic_ends`: the messaging layer's end offsets).
        keep_s = max(KEEP_AT_LEAST_S, 2 * deployment.autoscaling.stabilization_seconds)
        self.sampler = LoadSampler(self.plane, topic_ends, keep_s=keep_s)

    def describe(self) -> str:
        """One line: who this manager is and the timing it runs with."""
        return (
            f"manager {self.node_id} (group '{self.group_id}') on {self.plane.safe_url}: lease {self.lease_ms} ms, "
            f"reconcile every {self.poll_s * 1000:.0f} ms, workers dead after {self.node_max_age_ms} ms silent, "
            f"minResourceCount {self.min_resource_count}, allocation '{getattr(self.algorithm, 'name', type(self.algorithm).__name__)}'"
        )

    def run(self, stop: threading.Event) -> None:
        """Run until `stop` is set; then give the lease up if we hold it."""
        log.info("%s", self.describe())
        self.metrics_endpoint = serve_metrics(self.config.metrics, self.metric_families, f"manager {self.node_id}", self.config.deployment.https_interface.host)
        self.elector.metrics_url = self.metrics_endpoint.url if self.metrics_endpoint is not None else None
        next_tick = next_poll = 0.0
        try:
            while not stop.is_set():
                now = time.monotonic()
                try:
                    if not self._migrated:
                        self.plane.migrate()
                        self._migrated = True
                    if now >= next_tick:
                        before = self.elector.leadership
                        after = self.elector.tick()
                        next_tick = now + self.heartbeat_s
                        if after is not None and (before is None or before.term != after.term):
                            self._known_alive, self._rebalance_seen, next_poll = None, None, 0.0
                    leadership = self.elector.leadership
                    if leadership is not None and now >= next_poll:
                        result = self.reconcile_once(leadership)
                        # An owner letting go of a moving instance says so at once: the sooner the next pass
                        # sees it, the shorter the instance's keys go silent.
                        pause = min(self.poll_s, RELEASE_POLL_S) if result.awaiting_release else self.poll_s
                        next_poll = now if self._rebalance_due else now + pause
                    self.connectivity.succeeded()
                except DatabaseUnavailable as error:
                    delay = self.connectivity.failed(error)
                    next_tick = next_poll = time.monotonic() + delay
                except LeadershipLost as lost:
                    self.elector.forget(str(lost))
                except DBAPIError as error:  # a conflict that outlived its retries, or a refused statement
                    log.warning("control-plane request failed (%s); retrying in %.1f s", short_reason(error), self.heartbeat_s)
                    next_tick = next_poll = time.monotonic() + self.heartbeat_s
                wake = next_tick if self.elector.leadership is None else min(next_tick, next_poll)
                stop.wait(max(0.0, wake - time.monotonic()))
        finally:
            self.shutdown()

    def reconcile_once(self, leadership: Leadership) -> ReconcileResult:
        """One leader pass (rebalancing when due); journals and logs what it changed."""
        with self.plane.transaction() as conn:
            requested = rebalance_requests(conn, self.group_id)
        rebalance = self._rebalance_due or (self._rebalance_seen is not None and requested != self._rebalance_seen)
        self._rebalance_seen = requested
        result = reconcile(
            self.plane,
            leadership,
            algorithm=self.algorithm,
            min_resource_count=self.min_resource_count,
            node_max_age_ms=self.node_max_age_ms,
            rebalance=rebalance,
        )
        self._rebalance_due = False
        self._last_pass = result
        self._totals["reconciles"] += 1
        self._totals["dead"] += len(result.dead)
        self._totals["placed"] += len(result.assigned)
        joined = set(result.alive) - self._known_alive if self._known_alive is not None else set()
        self._known_alive = set(result.alive)
        if joined:
            log.info("%s %s joined: rebalancing", "node" if len(joined) == 1 else "nodes", ", ".join(sorted(joined)))
            self._rebalance_due = True
        self._report(result, rebalance)
        self.sampler.tick()
        if time.monotonic() - self._last_prune > PRUNE_EVERY_S:
            with self.plane.transaction() as conn:
                prune_events(conn)
            self._last_prune = time.monotonic()
        return result

    def _report(self, result: ReconcileResult, rebalance: bool) -> None:
        for node in result.dead:
            log.warning("term %d: node %s declared dead (no heartbeat for %d ms)", result.term, node, self.node_max_age_ms)
            self.journal.write("node-dead", node=self.node_id, term=result.term, seq=result.seq, subject=node)
        for instance, node, previous in result.assigned:
            log.debug("term %d: %s -> %s (was %s)", result.term, instance, node, previous)
            self.journal.write("assign", node=self.node_id, term=result.term, seq=result.seq, instance=instance, to=node, previous=previous)
        for instance, reason in result.unassigned:
            self.journal.write("unassign", node=self.node_id, term=result.term, seq=result.seq, instance=instance, reason=reason)
        if result.assigned or result.unassigned:
            moved = sum(1 for _, _, previous in result.assigned if previous)
            log.info(
                "term %d%s: placed %s (%d moved), took %d off their node",
                result.term,
                " (rebalance)" if rebalance else "",
                counted(len(result.assigned), "instance"),
                moved,
                len(result.unassigned),
            )
        for instance, source, target in result.moving:
            log.info("term %d: moving %s from %s to %s: %s stops it with a last checkpoint first", result.term, instance, source, target, source)
            self.journal.write("move", node=self.node_id, term=result.term, seq=result.seq, instance=instance, to=target, previous=source)
        for node in sorted(set(result.cut_off) - self._cut_off):
            log.warning("term %d: node %s cannot reach the messaging layer (other nodes can): its instances run elsewhere", result.term, node)
        for node in sorted(self._cut_off - set(result.cut_off)):
            log.info("term %d: node %s reaches the messaging layer again", result.term, node)
        self._cut_off = set(result.cut_off)
        for app, status, reason in result.status_changes:
            log.info("app %s is %s%s", app, status, f": {reason}" if reason else "")

    def metric_families(self) -> list[Family]:
        """What /metrics shows: leadership, the control plane's reach and, on the leader, the cluster as its last pass saw it."""
        leadership = self.elector.leadership
        last = self._last_pass if leadership is not None else None
        return [
            Family("manager_leader", "1 while this manager holds the leader lease, else 0.").add(leadership is not None),
            Family("manager_term", "The leader's term, while this manager leads.").add(None if leadership is None else leadership.term),
            Family("manager_control_plane_reachable", "1 while the control-plane database answers this manager, else 0.").add(not self.connectivity.down),
            Family("manager_reconciles_total", "Leader passes this manager made.", "counter").add(self._totals["reconciles"]),
            Family("manager_nodes_declared_dead_total", "Nodes this manager declared dead.", "counter").add(self._totals["dead"]),
            Family("manager_instances_placed_total", "Instance placements this manager made (moves included).", "counter").add(self._totals["placed"]),
            Family("cluster_nodes_alive", "Nodes instances may run on, as the leader's last pass saw them.").add(None if last is None else len(last.alive)),
            Family("cluster_nodes_cut_off", "Alive nodes that say they cannot reach the messaging layer.").add(None if last is None else len(last.cut_off)),
            Family("cluster_instances_unplaced", "Instances waiting for a node, as the leader's last pass saw them.").add(
                None if last is None else len(last.unplaced)
            ),
        ]

    def _on_election(self, kind: str, fields: dict) -> None:
        self.journal.write(kind, **fields)

    def shutdown(self) -> None:
        """Resign the lease (best effort) and close the journal."""
        if self.connectivity.down:
            log.info("manager %s stops without resigning: the control plane is unreachable", self.node_id)
        else:
            try:
                self.elector.resign()
            except Exception as exc:  # the database went away just now; the lease then simply expires
                log.warning("manager %s could not resign (%s); its lease expires in %d ms", self.node_id, short_reason(exc), self.lease_ms)
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.stop()
        self.sampler.stop()
        self.journal.close()
        self.plane.close()


def run_until_signalled(manager: Manager) -> None:
    """Run a manager in the foreground until SIGINT or SIGTERM."""
    stop = threading.Event()
    on_stop_signal(stop.set)
    manager.run(stop)
