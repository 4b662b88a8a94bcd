"""Parallelism changes on redeploy: a keyed group's state moves by key; another stateful group's change is refused unless --fresh,
which starts it empty; the deploy says what moves."""

from __future__ import annotations

import collections

import pytest

from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.store.deployments import HOLD, RESCALED, list_instances
from sp_dagster.deploy import DeployError, load_app, plan_app
from sp_dagster.deploy.rescale import FRESH_SINCE, Rescale, check_rescales
from sp_dagster.deploy.steps import record, state_changes
from sp_dagster.messaging import codec_for
from sp_dagster.messaging.strategies import partition_for_key
from sp_dagster.worker.instance.checkpoints import Checkpoint, resume, split_checkpoints
from sp_dagster.worker.instance.plan import plan_instance
from sp_dagster.worker.instance.runtime import InstanceRuntime, Message
from tests.fixtures.trades import APP, reference, trades


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
        # The stateless filter group has no state to refuse over, but its partitions' read positions move: each new instance
        # starts where the old ones stopped reading (its old instances are held until stopped with a last checkpoint).
        filters = wider.replace("@dist(execGroup = 'filter', parallel = '2')", "@dist(execGroup = 'filter', parallel = '3')")
        assert _deploy(plane, filters)[0] == "group Trades-filter: 2 -> 3 instances (stateless: each partition's read position moves with it)"
        handed = {i.instance_id: i.extra.get(RESCALED) for i in list_instances(plane, "Trades") if "-filter-" in i.instance_id}
        assert sorted(handed) == [f"Trades-filter-{n}" for n in (1, 2, 3)] and all(r["from"] == ["Trades-filter-1", "Trades-filter-2"] for r in handed.values())
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


def _average_instances(parallel: int):
    text = APP.replace("@dist(execGroup = 'average', parallel = '2')", f"@dist(execGroup = 'average', parallel = '{parallel}')")
    group = plan_app(load_app(text=text)).group("average")
    return [plan_instance(i.name, i.siddhi) for i in group.instances]


def _feed(instances, runtimes, rows, start: int, offsets: dict, out: dict) -> None:
    """Publish `rows` (filtered trades) keyed over the instances' topic, as the filter group does, and run them."""
    source = instances[0].inputs[0]
    codec, count = codec_for(source.codec, source.attributes), len(instances)
    results = codec_for("json", [("symbol", "string"), ("avgPrice", "double"), ("total", "long")])
    for n, row in enumerate(rows):
        partition = partition_for_key(row[0].encode(), count)
        owner = next(i for i, p in enumerate(instances) if partition in p.inputs[0].partitions)
        offset = offsets.get(partition, 0)
        offsets[partition] = offset + 1
        message = Message(source.topic, partition, offset, start + n, row[0].encode(), codec.encode(row))
        for m in runtimes[owner].process([message]):
            for result in results.decode(m.value):
                out[result[0]].append(result)


def test_keyed_state_split_from_two_instances_into_three_and_merged_back_gives_the_engines_results_per_key():
    rows, stamps = trades(600)
    big = [r for r in rows if r[2] >= 10]
    expected = reference(rows, stamps)
    out, offsets = collections.defaultdict(list), {}
    layout = _average_instances(2)
    runtimes = [InstanceRuntime(p) for p in layout]
    _feed(layout, runtimes, big[:200], 0, offsets, out)
    for step, (parallel, chunk) in enumerate([(3, big[200:400]), (2, big[400:])]):
        olds = [
            Checkpoint({(p.inputs[0].topic, q): offsets.get(q, 0) for q in p.inputs[0].partitions}, r.snapshot(), 1).encode() for p, r in zip(layout, runtimes)
        ]
        layout = _average_instances(parallel)
        runtimes = []
        for instance in layout:
            mine = set(instance.inputs[0].partitions)
            start = split_checkpoints(olds, lambda key: partition_for_key(key.encode(), parallel) in mine)
            assert all(offsets.get(q, 0) == start.positions[(instance.inputs[0].topic, q)] for q in offsets)
            runtimes.append(InstanceRuntime(instance))
            runtimes[-1].restore(start.snapshot)
        _feed(layout, runtimes, chunk, 1000 * (step + 1), offsets, out)
    assert dict(out) == {k: [tuple(r) for r in v] for k, v in expected.items()}


def test_within_maxparallel_the_old_instances_stop_in_place_and_the_upstream_keeps_publishing(tmp_path):
    """Room left by maxParallel: the keyed topic keeps its partitions, so the rescale neither holds the
    filter group upstream nor drains; only the old instances are held (each stops after a last checkpoint)."""
    from sp_dagster.deploy.rescale import move_state, rescales
    from sp_dagster.deploy.steps import instance_specs

    roomy = APP.replace("@dist(execGroup = 'average', parallel = '2')", "@dist(execGroup = 'average', parallel = '2', maxParallel = '6')")
    plane = ControlPlane(f"sqlite:///{tmp_path / 'plane.db'}")
    plane.migrate()
    try:
        assert _deploy(plane, roomy) == []
        wider = plan_app(load_app(text=roomy.replace("parallel = '2', maxParallel", "parallel = '3', maxParallel")))
        found = rescales(plane, wider)
        (average,) = [r for r in found if r.group == "Trades-average"]
        assert average.keeps_partitions and average.moves and average.recorded_partitions == 6
        # partitions 2, 4 and 5 of 6 change owner ([0-2] [3-5] -> [0-1] [2-3] [4-5])
        assert average.describe() == "group Trades-average: 2 -> 3 instances; 50% of its keys change instance, their state moves with them"
        recorded = []
        move_state(plane, wider, instance_specs(wider), found, recorded.append, timeout=10)
        (only,) = recorded  # one step: no hold of the upstream first
        holds = {s.instance_id: s.extra.get(HOLD) for s in only}
        assert {i: h for i, h in holds.items() if h} == {"Trades-average-1": "rescale", "Trades-average-2": "rescale"}
        assert any(i.startswith("Trades-filter-") for i in holds)  # the upstream stays placed, unheld
    finally:
        plane.close()
