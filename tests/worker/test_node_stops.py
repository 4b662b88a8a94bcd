"""How a worker stops an instance it should no longer run: with a last checkpoint, unless another node has it."""

from __future__ import annotations

from sp_dagster.cluster.election import Elector, fenced
from sp_dagster.cluster.membership import register_node
from sp_dagster.cluster.store.assignments import assign, assignments_for
from sp_dagster.cluster.store.deployments import InstanceSpec, record_deployment


class Handle:
    """Stand-in for a continuous task's handle (no Spark here): records how it was stopped."""

    active = ready = True

    def __init__(self):
        self.stops: list[bool] = []

    def stop(self, *, save: bool) -> None:
        self.stops.append(save)

    def metrics(self) -> dict:
        return {}


def test_an_instance_placed_on_another_node_is_stopped_without_a_checkpoint(tmp_path):
    from sp_dagster.config.loader import load_config
    from sp_dagster.embedded.local_cluster import LocalCluster
    from sp_dagster.worker.node import RunningInstance, Worker

    cluster = LocalCluster(tmp_path / "cluster", "127.0.0.1:9", workers=1)  # its configuration only: nothing started
    worker = Worker(load_config(cluster.worker_conf, role="worker", node_id="worker-1"))
    try:
        plane = worker.plane
        worker.beat()
        other = register_node(plane, "worker-2")
        specs = [InstanceSpec(f"app-g-{i}", "g", i, f"@App:name('app-g-{i}')") for i in (1, 2, 3)]
        record_deployment(plane, "app", content_hash="h", source="s", plan={}, instances=specs)
        leader = Elector(plane, "e2e", "m1", lease_ms=30_000).tick()
        assert leader is not None
        with fenced(plane, leader) as fence:
            assign(fence, "app-g-1", "worker-1", worker.session.incarnation, None)  # stays here
            assign(fence, "app-g-2", "worker-2", other, "worker-1")  # taken by worker-2 while this one was cut off
        # app-g-3 is placed nowhere (as after an undeploy): its last checkpoint commits what it has open.
        kept = assignments_for(plane, "worker-1", worker.session.incarnation).instances[0]
        handles = {i: Handle() for i in ("app-g-1", "app-g-2", "app-g-3")}
        for instance_id, handle in handles.items():
            spec = kept.spec_hash if instance_id == kept.instance_id else "old"
            worker.running[instance_id] = RunningInstance(instance_id, spec, handle, tmp_path / instance_id)  # pyright: ignore[reportArgumentType]
        worker.step()
        # Its new owner may run already: the old copy neither commits nor aborts its open transaction.
        assert {i: h.stops for i, h in handles.items()} == {"app-g-1": [], "app-g-2": [False], "app-g-3": [True]}
        assert list(worker.running) == ["app-g-1"]
    finally:
        worker.plane.close()
