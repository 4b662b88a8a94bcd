"""State revisions: compressed, numbered, pruned to revisionsToKeep, refused from a non-owner."""

from __future__ import annotations

import os

import pytest

from sp_dagster.cluster.allocation import BalancedAllocation
from sp_dagster.cluster.election import Elector
from sp_dagster.cluster.membership import register_node
from sp_dagster.cluster.reconcile import reconcile
from sp_dagster.cluster.store.deployments import InstanceSpec, record_deployment
from sp_dagster.cluster.store.revisions import delete_revisions, latest_revision, list_revisions, prune_revisions, save_revision
from sp_dagster.errors import ControlPlaneError


def test_saves_compress_number_and_prune(plane):
    assert latest_revision(plane, "app-g-1") is None
    state = b"window state " * 10_000
    for expected in (1, 2, 3):
        assert save_revision(plane, "app-g-1", state + bytes([expected]), keep=2) == expected
    listed = list_revisions(plane, "app-g-1")
    assert [x.revision for x in listed] == [2, 3]
    assert listed[0].raw_size == len(state) + 1 and listed[0].stored_size < listed[0].raw_size // 20
    newest = latest_revision(plane, "app-g-1")
    assert newest.revision == 3 and newest.data == state + b"\x03"
    save_revision(plane, "app-g-2", b"other", keep=2)
    assert prune_revisions(plane, "app-g-1", keep=1) == 1
    assert [x.revision for x in list_revisions(plane, "app-g-1")] == [3]
    assert delete_revisions(plane, ["app-g-1", "app-g-2"]) == 2


def test_a_large_incompressible_revision_round_trips(plane):
    blob = os.urandom(3 * 1024 * 1024)
    save_revision(plane, "big-g-1", blob, keep=1)
    assert latest_revision(plane, "big-g-1").data == blob


def test_only_the_owner_may_save_when_asked(plane):
    register_node(plane, "w1")
    leader = Elector(plane, "sp", "m1", lease_ms=30_000).tick()
    record_deployment(plane, "app", content_hash="h", source="s", plan={}, instances=[InstanceSpec("app-g-1", "g", 1, "x")])
    reconcile(plane, leader, algorithm=BalancedAllocation(), min_resource_count=1, node_max_age_ms=60_000)
    assert save_revision(plane, "app-g-1", b"s1", keep=2, owner=("w1", 1)) == 1
    register_node(plane, "w1")  # restarted: incarnation 1 is stale now
    with pytest.raises(ControlPlaneError, match="not assigned to node w1 incarnation 1; its state was not saved"):
        save_revision(plane, "app-g-1", b"stale", keep=2, owner=("w1", 1))
    assert latest_revision(plane, "app-g-1").data == b"s1"
