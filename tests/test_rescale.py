"""Parallelism changes on redeploy: a keyed group's state moves by key; another stateful group's change is refused unless --fresh,
which starts it empty; the deploy says what moves."""

from __future__ import annotations

import pytest

from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.store.deployments import HOLD, RESCALED, list_instances
from sp_dagster.deploy import DeployError, load_app, plan_app
from sp_dagster.deploy.rescale import FRESH_SINCE, Rescale, check_rescales
from sp_dagster.deploy.steps import record, state_changes
from sp_dagster.worker.checkpoints import Checkpoint, resume

from tests.worker.test_instance_queries import APP


def _deploy(plane, text, *, fresh=False):
    loaded = load_app(text=text)
    topology = plan_app(loaded)
    lines = state_changes(plane, topology, fresh=fresh)
    record(plane, loaded, topology, fresh=fresh)
    return lines



def test_a_keyed_groups_state_moves_and_another_stateful_groups_rescale_is_refused_unless_fresh(tmp_path):
    plane = ControlPlane(f"sqlite:///{tmp_path / 'plane.db'}")
    plane.migrate()
    try:
        assert _deploy(plane, APP) == []
        wider = APP.replace("@dist(execGroup = 'average', parallel = '2')", "@dist(execGroup = 'average', parallel = '3')")
        lines = _deploy(plane, wider)  # no worker runs anything here: holding and draining find nothing to wait for
        assert lines[0] == "group Trades-average: 2 -> 3 instances; 67% of its keys change instance, their state moves with them"
        rescaled = {i.instance_id: i.extra.get(RESCALED) for i in list_instances(plane, "Trades") if "-average-" in i.instance_id}
        assert sorted(rescaled) == [f"Trades-average-{n}" for n in (1, 2, 3)]
        assert all(r["from"] == ["Trades-average-1", "Trades-average-2"] and r["partitions"] == {"Trades.BigTradeStream.symbol": 3} for r in rescaled.values())
        assert not any(i.extra.get(HOLD) for i in list_instances(plane, "Trades"))
        # A stateful group whose state cannot be split by key is refused, unless --fresh.
        refused = Rescale("Trades-average", 3, 2, True, False, "its keyed input is published from outside the app")
        with pytest.raises(DeployError, match=r"group Trades-average: 3 -> 2 .*but its keyed input is published from outside the app.*--fresh"):
            check_rescales([refused], fresh=False)
        assert check_rescales([refused], fresh=True) == ["group Trades-average: 3 -> 2 instances; 67% of its keys change instance: starting empty (--fresh)"]
        # The stateless filter group rescales freely.
        filters = wider.replace("@dist(execGroup = 'filter', parallel = '2')", "@dist(execGroup = 'filter', parallel = '3')")
        assert _deploy(plane, filters)[0] == "group Trades-filter: 2 -> 3 instances (stateless: nothing to move)"
        narrower = filters.replace("@dist(execGroup = 'average', parallel = '3')", "@dist(execGroup = 'average', parallel = '2')")
        lines = _deploy(plane, narrower, fresh=True)
        assert lines[0] == "group Trades-average: 3 -> 2 instances; 67% of its keys change instance: starting empty (--fresh)"
        since = {i.instance_id: i.extra.get(FRESH_SINCE) for i in list_instances(plane, "Trades")}
        assert all(since[f"Trades-average-{n}"] for n in (1, 2)) and not any(v for k, v in since.items() if "-filter-" in k)
        # A later plain redeploy keeps the mark (no restart), and the instances set older checkpoints aside.
        again = _deploy(plane, narrower.replace("length(5)", "length(5) "))
        assert again == [] and {i.instance_id: i.extra.get(FRESH_SINCE) for i in list_instances(plane, "Trades")} == since
    finally:
        plane.close()
    older = Checkpoint({("t", 0): 7}, b"never restored", saved_at=since["Trades-average-1"] - 1).encode()
    resumed = resume(None, older, {}, lambda topic: {0: 9}, fresh_since=since["Trades-average-1"])
    assert resumed.positions == {("t", 0): 7} and resumed.note == "state started empty, offsets kept: its group was redeployed with --fresh"
