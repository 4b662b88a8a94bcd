"""A stand-in worker for tests where Spark is beside the point.

It speaks the workers' real control-plane protocol (`NodeSession`: register, heartbeat, read
assignments, report each instance) from a thread, and reports every instance assigned to it as
running with the metrics a test sets. The end-to-end demo test runs real `sp-dagster worker`
processes instead.
"""

from __future__ import annotations

import threading

from sp_dagster.cluster.fencing import NodeSession


class StandInWorker:
    """One resource node, heartbeating and reporting its instances as running (see the module docstring)."""

    def __init__(self, plane, node_id: str, interval_ms: int = 200, max_retry: int = 4):
        self.session = NodeSession(plane, node_id, heartbeat_interval_ms=interval_ms, heartbeat_max_retry=max_retry, leader_retry_interval_ms=600_000)
        self.node_id = node_id
        self.metrics: dict[str, dict] = {}  # instance id -> metrics it reports
        self.interval = interval_ms / 1000
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> StandInWorker:
        """Register and start heartbeating."""
        self.session.beat()
        self._thread.start()
        return self

    def stop(self, leave: bool = True) -> None:
        """Stop heartbeating; `leave` deregisters (a clean stop), otherwise the node just goes silent."""
        self._stop.set()
        self._thread.join(10)
        if leave:
            self.session.leave()

    def running(self) -> list[str]:
        """The instances assigned to this node right now."""
        return [i.instance_id for i in self.session.assignments().instances]

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.session.beat()
            if self.session.fenced:
                # A stall longer than the fence window (a loaded CI machine) fences it, as it would a worker; it
                # runs nothing to stop, so it says so at once and the next beat rejoins as a new incarnation,
                # as a worker does after stopping its instances. Without this it stayed dead for good.
                self.session.acknowledge_fence()
                continue
            for instance in self.running():
                self.session.report(instance, "running", metrics=self.metrics.get(instance, {"rows_in_total": 0, "rows_out_total": 0, "lag": 0, "batch_ms": 1}))

    def __enter__(self) -> StandInWorker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
