"""Leader election among the managers of one group: a lease row with a fencing term.
Nothing here trusts a host's clock: the lease's times are the database's, a process counts only its
own durations, and every leader write runs in `fenced()`, a transaction that locks the lease row and
checks the term. How and why: "Leases and terms" in docs/concepts/control-plane.md.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from sqlalchemy import Connection, case, func, select, update

from sp_dagster.cluster.db import ControlPlane, db_now_ms, insert_ignore
from sp_dagster.cluster.schema import assignments, leader_lease, managers, terms
from sp_dagster.cluster.store.events import record_event
from sp_dagster.errors import ControlPlaneError

log = logging.getLogger(__name__)


class LeadershipLost(Exception):
    """This process no longer holds the lease (or never did) in the term it believed."""


@dataclass(frozen=True)
class Leadership:
    """The lease as this process holds it: its term and until when (local monotonic time) to trust it."""

    group_id: str
    node_id: str
    incarnation: str
    term: int
    acquired_at: int  # database time (ms) the term began
    deadline: float  # time.monotonic() after which the lease may have expired

    def trusted(self) -> bool:
        """True while the lease cannot have expired yet, as far as this process can tell."""
        return time.monotonic() < self.deadline


@dataclass(frozen=True)
class LeaderInfo:
    """The lease as the database has it."""

    group_id: str
    term: int
    holder: str | None
    holder_incarnation: str | None
    alive: bool
    expires_in_ms: int
    acquired_at: int | None
    node_heartbeat_ms: int | None
    node_max_retry: int | None


class Fence:
    """A fenced transaction: `conn` writes only while this process leads in `term`."""

    def __init__(self, conn: Connection, leadership: Leadership, now_ms: int, seq: int):
        self.conn = conn
        self.leadership = leadership
        self.term = leadership.term
        self.now_ms = now_ms
        self.seq = seq
        self._bumped = False

    def bump(self) -> int:
        """Take the next fence sequence number for this transaction's writes (once per transaction)."""
        if not self._bumped:
            lease = leader_lease.c
            self.conn.execute(update(leader_lease).where(lease.group_id == self.leadership.group_id).values(fence_seq=lease.fence_seq + 1))
            self.seq = int(self.conn.execute(select(lease.fence_seq).where(lease.group_id == self.leadership.group_id)).scalar_one())
            self._bumped = True
        return self.seq

    @property
    def wrote(self) -> bool:
        """True when bump() was called: this transaction made leader writes."""
        return self._bumped


@contextlib.contextmanager
def fenced(plane: ControlPlane, leadership: Leadership) -> Iterator[Fence]:
    """A transaction that locks the lease row and proceeds only if `leadership` still holds it.

    Raises LeadershipLost (and rolls back) otherwise. Keep these transactions short: while one
    is open, no manager can take over.
    """
    if not leadership.trusted():
        raise LeadershipLost(f"the lease of term {leadership.term} may have expired")
    lease = leader_lease.c
    with plane.transaction() as conn:
        row = conn.execute(
            select(lease.term, lease.holder_incarnation, lease.expires_at, lease.fence_seq).where(lease.group_id == leadership.group_id).with_for_update()
        ).one_or_none()
        now = int(conn.execute(select(db_now_ms())).scalar_one())
        if row is None or row.term != leadership.term or row.holder_incarnation != leadership.incarnation:
            raise LeadershipLost(f"term {leadership.term} is over: the lease is at term {row.term if row else None}")
        if row.expires_at <= now:
            raise LeadershipLost(f"the lease of term {leadership.term} expired {now - row.expires_at} ms ago")
        yield Fence(conn, leadership, now, int(row.fence_seq))


class Elector:
    """One manager's side of the election: call tick() every heartbeatInterval.

    The holder renews the lease each tick; an expired one is taken with one conditional UPDATE that also
    increments the term (the row lock makes concurrent attempts take turns, so one term has one holder;
    `sp_terms`, keyed by term, is a second guard).
    """

    def __init__(
        self,
        plane: ControlPlane,
        group_id: str,
        node_id: str,
        *,
        lease_ms: int,
        address: str = "",
        node_heartbeat_ms: int | None = None,
        node_max_retry: int | None = None,
        listener: Callable[[str, dict], None] | None = None,
    ):
        self.plane = plane
        self.group_id = group_id
        self.node_id = node_id
        self.incarnation = uuid.uuid4().hex
        self.lease_ms = int(lease_ms)
        self.address = address
        self.metrics_url: str | None = None  # its manager's Prometheus endpoint, once served (shown by `status`)
        self.node_heartbeat_ms = node_heartbeat_ms
        self.node_max_retry = node_max_retry
        self.listener = listener
        self._leadership: Leadership | None = None
        self._lease_row_exists = False

    @property
    def leadership(self) -> Leadership | None:
        """The current leadership if it can still be trusted, else None."""
        if self._leadership is not None and not self._leadership.trusted():
            self._lose("the lease may have expired before it could be renewed")
        return self._leadership

    def tick(self) -> Leadership | None:
        """Heartbeat this manager, renew the lease or try to take it; returns the leadership held."""
        started = time.monotonic()
        held = self.leadership
        if not self._lease_row_exists:
            self.plane.run(self._ensure_lease_row)
        renewed, acquired = self.plane.run(lambda: self._tick_transaction(held, started))
        if renewed:
            assert held is not None  # only a held lease is renewed
            # Counted from *before* the renewal: this process gives up no later than the database would let another take over.
            self._leadership = replace(held, deadline=started + self.lease_ms / 1000)
            return self._leadership
        if held is not None:
            self._lose("the lease expired or another manager took it")
        if acquired is not None:
            leadership, seq = acquired
            self._leadership = leadership
            log.info("manager %s became leader of group '%s' (term %d)", self.node_id, self.group_id, leadership.term)
            self._notify("leader", term=leadership.term, seq=seq)
        return self._leadership

    def resign(self) -> None:
        """Give the lease up at once (on a clean stop) so another manager takes over without waiting."""
        held, self._leadership = self._leadership, None
        with self.plane.transaction() as conn:
            if held is not None:
                lease = leader_lease.c
                conn.execute(
                    update(leader_lease)
                    .where(lease.group_id == self.group_id, lease.term == held.term, lease.holder_incarnation == self.incarnation)
                    .values(expires_at=db_now_ms())
                )
            m = managers.c
            conn.execute(
                update(managers)
                .where(m.group_id == self.group_id, m.node_id == self.node_id, m.incarnation == self.incarnation)
                .values(state="stopped", last_heartbeat=db_now_ms())
            )
        if held is not None:
            log.info("manager %s resigned leadership of term %d", self.node_id, held.term)
            self._notify("resigned", term=held.term)

    def _ensure_lease_row(self) -> None:
        # Its own transaction: inserting and then updating the row in one would let two
        # MySQL transactions deadlock on the shared lock the duplicate-key check takes.
        with self.plane.transaction() as conn:
            insert_ignore(conn, leader_lease, dict(group_id=self.group_id, term=0, expires_at=0, fence_seq=0, rebalance_requests=0))
        self._lease_row_exists = True

    def _tick_transaction(self, held: Leadership | None, started: float) -> tuple[bool, tuple[Leadership, int] | None]:
        with self.plane.transaction() as conn:
            self._heartbeat(conn)
            if held is not None and self._renew(conn, held):
                return True, None
            return False, self._acquire(conn, started)

    # -- inside the tick transaction --------------------------------------------------------

    def _heartbeat(self, conn: Connection) -> None:
        m = managers.c
        values = dict(incarnation=self.incarnation, address=self.address, last_heartbeat=db_now_ms(), state="running", metrics_url=self.metrics_url)
        updated = conn.execute(update(managers).where(m.group_id == self.group_id, m.node_id == self.node_id).values(**values)).rowcount
        if not updated:
            insert_ignore(conn, managers, dict(group_id=self.group_id, node_id=self.node_id, started_at=db_now_ms(), **values))

    def _renew(self, conn: Connection, held: Leadership) -> bool:
        lease = leader_lease.c
        now = db_now_ms()
        return bool(
            conn.execute(
                update(leader_lease)
                .where(
                    lease.group_id == self.group_id,
                    lease.term == held.term,
                    lease.holder_incarnation == self.incarnation,
                    lease.expires_at > now,
                )
                .values(renewed_at=now, expires_at=now + self.lease_ms)
            ).rowcount
        )

    def _acquire(self, conn: Connection, started: float) -> tuple[Leadership, int] | None:
        lease = leader_lease.c
        other = conn.execute(select(lease.group_id).where(lease.group_id != self.group_id, lease.expires_at > db_now_ms()).limit(1)).scalar()
        if other is not None:
            raise ControlPlaneError(
                f"the control-plane database {self.plane.safe_url} is in use by manager group '{other}', not "
                f"'{self.group_id}': one database serves one cluster (set cluster.config.groupId to '{other}' or use another database)"
            )
        now = db_now_ms()
        # Never reuse a recorded term, even if the lease row was reset or restored from a backup.
        floor = conn.execute(select(func.max(terms.c.term)).where(terms.c.group_id == self.group_id)).scalar() or 0
        taken = conn.execute(
            update(leader_lease)
            .where(lease.group_id == self.group_id, lease.expires_at <= now)
            .values(
                term=case((lease.term > floor, lease.term + 1), else_=floor + 1),
                holder=self.node_id,
                holder_incarnation=self.incarnation,
                acquired_at=now,
                renewed_at=now,
                expires_at=now + self.lease_ms,
                fence_seq=lease.fence_seq + 1,
                node_heartbeat_ms=self.node_heartbeat_ms,
                node_max_retry=self.node_max_retry,
            )
        ).rowcount
        if not taken:
            if conn.execute(select(lease.term).where(lease.group_id == self.group_id)).first() is None:
                self._lease_row_exists = False  # someone deleted it: recreate it on the next tick
            return None
        row = conn.execute(select(lease.term, lease.acquired_at, lease.fence_seq).where(lease.group_id == self.group_id)).one()
        term = int(row.term)
        conn.execute(
            terms.insert().values(group_id=self.group_id, term=term, holder=self.node_id, holder_incarnation=self.incarnation, elected_at=row.acquired_at)
        )
        # The new term adopts the placement as it stands: workers obey only the current term.
        adopted = conn.execute(update(assignments).where(assignments.c.term != term).values(term=term)).rowcount
        seq = int(row.fence_seq)
        record_event(conn, "elected", term=term, seq=seq, actor=self.node_id, detail={"incarnation": self.incarnation, "adopted": adopted})
        deadline = started + self.lease_ms / 1000
        return Leadership(self.group_id, self.node_id, self.incarnation, term, int(row.acquired_at), deadline), seq

    def forget(self, reason: str) -> None:
        """Stop acting as leader at once (a fenced write found the term over)."""
        self._lose(reason)

    def _lose(self, reason: str) -> None:
        held, self._leadership = self._leadership, None
        if held is not None:
            log.warning("manager %s lost leadership of term %d: %s", self.node_id, held.term, reason)
            self._notify("lost", term=held.term, reason=reason)

    def _notify(self, kind: str, **fields) -> None:
        if self.listener is not None:
            self.listener(kind, {"node": self.node_id, "incarnation": self.incarnation, **fields})


def read_lease(conn: Connection, group_id: str | None = None) -> LeaderInfo | None:
    """The lease of `group_id` (or of the only group) as the database has it; None if never held."""
    lease = leader_lease.c
    query = select(leader_lease, db_now_ms().label("now")).order_by(lease.expires_at.desc())
    if group_id is not None:
        query = query.where(lease.group_id == group_id)
    row = conn.execute(query.limit(1)).one_or_none()
    if row is None or not row.term:
        return None
    return LeaderInfo(
        group_id=row.group_id,
        term=int(row.term),
        holder=row.holder,
        holder_incarnation=row.holder_incarnation,
        alive=row.expires_at > row.now,
        expires_in_ms=int(row.expires_at - row.now),
        acquired_at=row.acquired_at,
        node_heartbeat_ms=row.node_heartbeat_ms,
        node_max_retry=row.node_max_retry,
    )


def current_leader(plane: ControlPlane, group_id: str | None = None) -> LeaderInfo | None:
    """The lease of `group_id` (or of the only group) as the database has it; None if never held."""
    with plane.transaction() as conn:
        return read_lease(conn, group_id)


def leader_address(plane: ControlPlane, group_id: str) -> str | None:
    """The `host:port` the live leader of `group_id` gave as its address (its httpsInterface), or None without a live leader."""
    with plane.transaction() as conn:
        lease = read_lease(conn, group_id)
        if lease is None or not lease.alive:
            return None
        query = select(managers.c.address).where(managers.c.group_id == group_id, managers.c.incarnation == lease.holder_incarnation)
        return conn.execute(query).scalar() or None


def request_rebalance(plane: ControlPlane, group_id: str | None = None) -> None:
    """Ask the leader to rebalance placements on its next pass (moving the fewest instances)."""
    lease = leader_lease.c
    statement = update(leader_lease).values(rebalance_requests=lease.rebalance_requests + 1)
    if group_id is not None:
        statement = statement.where(lease.group_id == group_id)
    with plane.transaction() as conn:
        conn.execute(statement)


def rebalance_requests(conn: Connection, group_id: str) -> int:
    """How many rebalances have been requested for the group so far."""
    return int(conn.execute(select(leader_lease.c.rebalance_requests).where(leader_lease.c.group_id == group_id)).scalar() or 0)
