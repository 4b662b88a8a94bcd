"""Checking a recorded history of managers: one leader per term, no write by a stale term.

Used by the chaos and outage tests. The evidence is three independent records: the
database (`sp_terms`, the event log with fence sequence numbers), each manager process's
journal (what it believed and what it says it wrote), and an observer sampling the lease.
"""

from __future__ import annotations

import bisect
import json
import threading
from collections import defaultdict

from sqlalchemy import select

from sp_dagster.cluster.election import current_leader
from sp_dagster.cluster.schema import terms
from sp_dagster.cluster.store.events import recent_events

WRITE_KINDS = ("assigned", "unassigned", "node-dead", "move-planned", "release-asked")
JOURNAL_WRITES = {"assign": "assigned", "unassign": "unassigned", "node-dead": "node-dead", "move": "release-asked"}


class Observer(threading.Thread):
    """Samples the lease; remembers every (term, holder incarnation) seen alive."""

    def __init__(self, plane):
        super().__init__(daemon=True)
        self.plane = plane
        self.seen: dict[int, set[str]] = defaultdict(set)
        self.holders: dict[str, str] = {}
        self.samples = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(0.02):
            try:
                lease = current_leader(self.plane)
            except Exception:
                continue
            self.samples += 1
            if lease is not None and lease.alive:
                self.seen[lease.term].add(lease.holder_incarnation)
                self.holders[lease.holder_incarnation] = lease.holder


def read_journals(paths):
    entries, broken = [], 0
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by SIGKILL
                broken += 1
    return entries, broken


def check_history(plane, journal_paths, observer) -> dict:
    """Assert the invariants in the module docstring; return figures for the report."""
    with plane.transaction() as conn:
        term_rows = conn.execute(select(terms.c.term, terms.c.holder, terms.c.holder_incarnation).order_by(terms.c.term)).all()
    holder_of = {r.term: r.holder_incarnation for r in term_rows}
    assert [r.term for r in term_rows] == list(range(1, len(term_rows) + 1)), "terms must be 1..N without gaps"

    # What every process believed: one claimant per term, the one the database chose.
    journal, broken = read_journals(journal_paths)
    assert broken <= len(journal_paths) * 20, f"{broken} unreadable journal lines"
    claims: dict[int, set[str]] = defaultdict(set)
    for entry in journal:
        if entry["event"] == "leader":
            claims[entry["term"]].add(entry["incarnation"])
    for term, claimants in claims.items():
        assert claimants == {holder_of[term]}, f"term {term} claimed by {claimants}, database says {holder_of[term]}"
    for term, seen in observer.seen.items():
        assert seen == {holder_of[term]}, f"observer saw term {term} held by {seen}"

    # Every leader write carries the term of the latest election before it (fence order).
    events = recent_events(plane, limit=None, kinds=("elected", *WRITE_KINDS))
    elections = sorted((e.seq, e.term) for e in events if e.kind == "elected")
    assert [t for _, t in elections] == sorted(holder_of), "every term has its election event (no pruning)"
    assert len({s for s, _ in elections}) == len(elections)
    writes = [e for e in events if e.kind in WRITE_KINDS]
    election_seqs = [s for s, _ in elections]
    for write in writes:
        position = bisect.bisect_left(election_seqs, write.seq) - 1
        assert position >= 0 and elections[position][1] == write.term, (
            f"{write.kind} {write.subject} at seq {write.seq} has term {write.term}, but term {elections[position][1] if position >= 0 else None} was current"
        )
        assert write.seq != elections[position][0]

    # What processes say they wrote was committed with that term and sequence number.
    committed = {(e.kind, e.subject, e.term, e.seq) for e in writes}
    journaled = 0
    for entry in journal:
        kind = JOURNAL_WRITES.get(entry["event"])
        if kind:
            subject = entry.get("instance") or entry.get("subject")
            assert (kind, subject, entry["term"], entry["seq"]) in committed, f"journaled but not committed: {entry}"
            assert entry["incarnation" if "incarnation" in entry else "node"] is not None
            journaled += 1
    stale = [e for e in journal if e["event"] == "stale-attempt"]
    return {
        "stale_attempts_refused": sum(1 for e in stale if e["refused"]),
        "stale_attempts_accepted_while_still_current": sum(1 for e in stale if not e["refused"]),
        "terms": len(term_rows),
        "leader_claims": sum(len(c) for c in claims.values()),
        "observed_terms": len(observer.seen),
        "observer_samples": observer.samples,
        "leader_writes_in_db": len(writes),
        "leader_writes_journaled": journaled,
    }
