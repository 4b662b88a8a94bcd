"""The worker's side of membership: register, heartbeat, and know when to stop everything.
A worker holds a `NodeSession`, calls `beat()` every `heartbeat_interval_s` and stops every instance
while it is *fenced*; when that happens is under "Heartbeats and fencing" in
docs/concepts/control-plane.md. Only this process's monotonic clock is read here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.membership import deregister_node, heartbeat, register_node
from sp_dagster.cluster.store.assignments import NodeAssignments, assignments_for
from sp_dagster.cluster.store.deployments import report_instance_status
from sp_dagster.errors import DatabaseUnavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeStatus:
    """The session after a beat: fenced or not (and why), and the leader as last seen."""

    node_id: str
    incarnation: int | None
    fenced: bool
    reason: str | None
    leader: str | None
    term: int
    leader_alive: bool
    next_beat_s: float


class NodeSession:
    """One resource node's registration and heartbeats, with self-fencing.

    The session says the worker is *fenced* when:

    - the control plane refuses its heartbeat (declared dead, superseded by a newer incarnation
      of the same id, or the node left);
    - it could not renew its heartbeat for heartbeatInterval x heartbeatMaxRetry minus half an
      interval (`fence_after_s`): it fences itself before the leader can declare it dead and give its
      instances to another node, so two copies of an instance never run;
    - it has seen no live leader for leaderRetryInterval.

    A fenced worker must stop every instance, then call `acknowledge_fence()`; its next `beat()`
    registers it again as a new incarnation, and it takes what it is then given. It heartbeats at the
    pace the leader publishes with the lease, falling back to its own configuration until a leader is
    known. Only durations on this process's monotonic clock are measured; no host clock is compared
    with another.
    """

    def __init__(
        self,
        plane: ControlPlane,
        node_id: str,
        *,
        receiver: bool = False,
        address: str = "",
        heartbeat_interval_ms: int = 10_000,
        heartbeat_max_retry: int = 2,
        leader_retry_interval_ms: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.plane = plane
        self.node_id = node_id
        self.receiver = receiver
        self.address = address
        self.own_interval_ms = heartbeat_interval_ms
        self.own_max_retry = heartbeat_max_retry
        self.leader_retry_s = leader_retry_interval_ms / 1000
        self.clock = clock
        self.incarnation: int | None = None
        self._leader_timing: tuple[int, int] | None = None
        self._last_ok: float | None = None
        self._last_leader_seen: float | None = None
        self._fence_reason: str | None = None
        self._acknowledged = False
        self._leader: str | None = None
        self._term = 0
        self._leader_alive = False

    @classmethod
    def from_config(cls, config, plane: ControlPlane | None = None) -> NodeSession:
        """A session for the worker described by a Config (its id, role, address and timing)."""
        d = config.deployment
        return cls(
            plane or ControlPlane.from_config(config),
            config.node_id,
            receiver=d.is_receiver_node,
            address=f"{d.https_interface.host}:{d.https_interface.port}",
            heartbeat_interval_ms=d.heartbeat_interval,
            heartbeat_max_retry=d.heartbeat_max_retry,
            leader_retry_interval_ms=d.leader_retry_interval,
        )

    # -- timing -------------------------------------------------------------------------------

    @property
    def heartbeat_interval_s(self) -> float:
        """Seconds between heartbeats: the leader's pace when known, else this node's own."""
        return (self._leader_timing or (self.own_interval_ms, self.own_max_retry))[0] / 1000

    @property
    def fence_after_s(self) -> float:
        """Seconds without a renewed heartbeat after which this node fences itself."""
        interval, retry = self._leader_timing or (self.own_interval_ms, self.own_max_retry)
        return max(interval, interval * retry - interval / 2) / 1000

    def lease_remaining_s(self) -> float:
        """Seconds this node may still run its instances without another renewed heartbeat (0 when fenced)."""
        if self.incarnation is None or self._last_ok is None or self.fenced:
            return 0.0
        return max(0.0, self.fence_after_s - (self.clock() - self._last_ok))

    def heartbeat_age_s(self) -> float | None:
        """Seconds since the control plane last accepted a heartbeat of this node (None before the first)."""
        return None if self._last_ok is None else self.clock() - self._last_ok

    # -- state --------------------------------------------------------------------------------

    @property
    def fenced(self) -> bool:
        """True when the worker must stop (or keep stopped) every instance."""
        return self.fence_reason is not None

    @property
    def fence_reason(self) -> str | None:
        """Why the worker is fenced (None when it is not); checks the deadlines on every call."""
        if self._fence_reason is None and self.incarnation is not None and self._last_ok is not None:
            now = self.clock()
            if now - self._last_ok > self.fence_after_s:
                self._fence(f"could not renew its heartbeat for {now - self._last_ok:.1f} s (limit {self.fence_after_s:.1f} s)")
            elif self._last_leader_seen is not None and now - self._last_leader_seen > self.leader_retry_s:
                self._fence(f"saw no live manager for {now - self._last_leader_seen:.1f} s (leaderRetryInterval {self.leader_retry_s:.1f} s)")
        return self._fence_reason

    def _fence(self, reason: str) -> None:
        if self._fence_reason is None:
            self._fence_reason = reason
            self._acknowledged = False
            log.warning("node %s (incarnation %s) is fenced: %s; it must stop all its instances", self.node_id, self.incarnation, reason)

    def acknowledge_fence(self) -> None:
        """Say every instance is stopped; the next beat() registers this node as a new incarnation."""
        if self._fence_reason is not None:
            self._acknowledged = True

    def status(self) -> NodeStatus:
        """The session as it stands, without contacting the database."""
        return NodeStatus(
            self.node_id,
            self.incarnation,
            self.fenced,
            self.fence_reason,
            self._leader,
            self._term,
            self._leader_alive,
            self.heartbeat_interval_s,
        )

    # -- actions ------------------------------------------------------------------------------

    def beat(self, metrics: Mapping[str, Any] | None = None) -> NodeStatus:
        """Register (first time, or after an acknowledged fence) or heartbeat; never raises for an outage."""
        started = self.clock()
        if self.fenced and not self._acknowledged:
            return self.status()
        try:
            if self.incarnation is None or self.fenced:
                self._register(started, metrics)
            else:
                self._heartbeat(self.incarnation, started, metrics)
        except DatabaseUnavailable as error:
            log.debug("node %s heartbeat failed: %s", self.node_id, error)
        return self.status()

    def _register(self, started: float, metrics: Mapping[str, Any] | None) -> None:
        previous = self.incarnation
        self.incarnation = register_node(self.plane, self.node_id, receiver=self.receiver, address=self.address, metrics=dict(metrics or {}))
        self._fence_reason, self._acknowledged = None, False
        self._last_ok = self._last_leader_seen = started
        log.info("node %s registered as incarnation %d%s", self.node_id, self.incarnation, f" (was {previous})" if previous else "")

    def _heartbeat(self, incarnation: int, started: float, metrics: Mapping[str, Any] | None) -> None:
        reply = heartbeat(self.plane, self.node_id, incarnation, metrics=dict(metrics) if metrics is not None else None)
        if not reply.accepted:
            self._fence(reply.reason or "heartbeat refused")
            return
        self._last_ok = started
        lease = reply.leader
        self._leader, self._term, self._leader_alive = (lease.holder, lease.term, lease.alive) if lease else (None, 0, False)
        if lease and lease.node_heartbeat_ms and lease.node_max_retry:
            self._leader_timing = (int(lease.node_heartbeat_ms), int(lease.node_max_retry))
        if reply.leader_alive:
            self._last_leader_seen = started

    def assignments(self) -> NodeAssignments:
        """What this incarnation should run in the current term (nothing while fenced or unregistered).

        Raises DatabaseUnavailable when the control plane cannot be reached: keep running what runs.
        """
        if self.incarnation is None or self.fenced:
            return NodeAssignments(self.node_id, self.incarnation, self._term, self._leader, self._leader_alive, ())
        return assignments_for(self.plane, self.node_id, self.incarnation)

    def report(self, instance_id: str, status: str, *, detail: str | None = None, metrics: Mapping[str, Any] | None = None) -> bool:
        """Report how an instance runs (ignored unless it is assigned to this incarnation)."""
        if self.incarnation is None:
            return False
        return report_instance_status(self.plane, self.node_id, self.incarnation, instance_id, status, detail=detail, metrics=metrics)

    def leave(self) -> None:
        """Deregister on a clean stop, so the leader re-places this node's instances at once."""
        if self.incarnation is not None and not self.fenced:
            deregister_node(self.plane, self.node_id, self.incarnation)
