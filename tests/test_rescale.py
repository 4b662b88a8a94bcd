"""Parallelism changes on redeploy: a stateful group's change is refused unless --fresh, which starts it empty and says what moves."""

from __future__ import annotations

import pytest

from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.store.deployments import list_instances
from sp_dagster.deploy import DeployError, load_app, plan_app
from sp_dagster.deploy.rescale import FRESH_SINCE
from sp_dagster.deploy.steps import record, state_changes
from sp_dagster.worker.checkpoints import Checkpoint, resume
from tests.worker.test_instance_queries import APP


def _deploy(plane, text, *, fresh=False):
    loaded = load_app(text=text)
    topology = plan_app(loaded)
    lines = state_changes(plane, topology, fresh=fresh)
    record(plane, loaded, topology, fresh=fresh)
    return lines


def test_a_stateful_groups_new_parallelism_is_refused_unless_fresh_which_starts_it_empty(tmp_path):
    plane = ControlPlane(f"sqlite:///{tmp_path / 'plane.db'}")
    plane.migrate()
    try:
        assert _deploy(plane, APP) == []
        wider = APP.replace("@dist(execGroup = 'average', parallel = '2')", "@dist(execGroup = 'average', parallel = '3')")
        with pytest.raises(DeployError, match=r"group Trades-average: 2 -> 3 instances; 67% of its keys change instance.*--fresh"):
            _deploy(plane, wider)
        assert len(list_instances(plane, "Trades")) == 4  # nothing recorded
        # The stateless filter group rescales freely.
        filters = APP.replace("@dist(execGroup = 'filter', parallel = '2')", "@dist(execGroup = 'filter', parallel = '3')")
        assert _deploy(plane, filters) == ["group Trades-filter: 2 -> 3 instances (stateless: nothing to move)"]
        lines = _deploy(plane, filters.replace("parallel = '2'", "parallel = '3'"), fresh=True)
        assert lines[0] == "group Trades-average: 2 -> 3 instances; 67% of its keys change instance: starting empty (--fresh)"
        assert lines[1:] == [f"Trades-filter-{n}: state kept: query:big; starting empty: nothing" for n in (1, 2, 3)]  # they publish to 3 partitions now
        since = {i.instance_id: i.extra.get(FRESH_SINCE) for i in list_instances(plane, "Trades")}
        assert all(since[f"Trades-average-{n}"] for n in (1, 2, 3)) and not any(v for k, v in since.items() if "-filter-" in k)
        # A later plain redeploy keeps the mark (no restart), and the instances set older checkpoints aside.
        again = _deploy(plane, filters.replace("parallel = '2'", "parallel = '3'").replace("length(5)", "length(5) "))
        assert again == [] and {i.instance_id: i.extra.get(FRESH_SINCE) for i in list_instances(plane, "Trades")} == since
    finally:
        plane.close()
    older = Checkpoint({("t", 0): 7}, b"never restored", saved_at=since["Trades-average-1"] - 1).encode()
    resumed = resume(None, older, {}, lambda topic: {0: 9}, fresh_since=since["Trades-average-1"])
    assert resumed.positions == {("t", 0): 7} and resumed.note == "state started empty, offsets kept: its group was redeployed with --fresh"
