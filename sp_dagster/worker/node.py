"""A worker: a long-running Spark application that runs the instances assigned to it.

Every poll it heartbeats (registering first), and reconciles its streaming queries with the
assignments of the current leader term: it stops removed or changed instances first, then
starts new ones, so two copies of an instance never run at once. When the control plane says
it is fenced it stops everything and registers again as a new incarnation. It reports each
instance's status and metrics, saves state revisions every `intervalInMin`, and on SIGTERM or
SIGINT stops its queries, saves their state and deregisters.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sp_dagster.config.yamlsource import default_home
from sp_dagster.errors import NotOwnerError
from sp_dagster.worker.instance_plan import InstancePlanError, plan_instance
from sp_dagster.worker.native_kafka import kafka_source_kind
from sp_dagster.worker.persistence import store_for
from sp_dagster.worker.spark_query import ROCKSDB, QuerySettings, start_query

log = logging.getLogger(__name__)


@dataclass
class RunningInstance:
    """A streaming query the worker runs for one assigned instance."""

    instance_id: str
    spec_hash: str
    query: object
    checkpoint: Path
    started: float = field(default_factory=time.monotonic)
    totals: dict = field(default_factory=lambda: {"rows_in_total": 0, "rows_out_total": 0})
    last_batch: int = -1


def spark_session(config):
    """The worker's one SparkSession: master and settings from config, sp-kafka registered."""
    from pyspark.sql import SparkSession

    from sp_dagster.worker.kafka_source import KafkaPartitionsSource

    builder = SparkSession.builder.master(config.spark.master).appName(config.spark.app_name or f"sp-dagster-worker-{config.node_id}")
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        # each batch writes a small changelog, not a state snapshot (one now and then)
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        **config.spark.conf,
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("SP_SPARK_LOG_LEVEL", "ERROR"))
    session.dataSource.register(KafkaPartitionsSource)
    log.info("worker %s: instances read Kafka with the %s source", config.node_id, kafka_source_kind(session, config.spark.kafka_source))
    return session


class Worker:
    """One resource node: heartbeats, assignments, streaming queries, state, metrics."""

    def __init__(self, config, *, spark=None, plane=None):
        from sp_dagster.cluster.db import ControlPlane
        from sp_dagster.cluster.fencing import NodeSession

        self.config = config
        self.plane = plane or ControlPlane.from_config(config)
        self.session = NodeSession.from_config(config, self.plane)
        self.store = store_for(config, default_home(), self.plane)
        self.checkpoints = self.store.checkpoint_root(config.node_id)
        self.spark = spark
        self.running: dict[str, RunningInstance] = {}
        self.failures: dict[str, tuple[int, float]] = {}  # instance -> (failures in a row, retry after)
        self.stop_event = threading.Event()
        # Heartbeats run on their own thread: starting a Spark query takes seconds, and a
        # worker busy starting one must not look dead. The lock keeps session calls apart.
        self.session_lock = threading.Lock()
        self._beats = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        self._last_save = time.monotonic()
        self.bootstrap = config.messaging.bootstrap_servers
        self.kafka_properties = tuple(sorted(config.messaging.properties.items()))

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> None:
        """Poll until stop() is called (or SIGTERM/SIGINT in the CLI), then shut down cleanly."""
        if self.spark is None:
            log.info("worker %s: starting Spark (%s)", self.config.node_id, self.config.spark.master)
            self.spark = spark_session(self.config)
        log.info("worker %s: control plane %s, messaging %s", self.config.node_id, self.plane.safe_url, self.bootstrap)
        self.beat()
        self._beats.start()
        try:
            while not self.stop_event.is_set():
                self.step()
                self.stop_event.wait(self.session.heartbeat_interval_s)
        finally:
            self.shutdown()

    def _heartbeat_loop(self) -> None:
        while not self.stop_event.wait(self.session.heartbeat_interval_s):
            self.beat()

    def beat(self):
        """One heartbeat (or registration); returns the session's status."""
        with self.session_lock:
            return self.session.beat(metrics={"instances": len(self.running)})

    def stop(self) -> None:
        """Ask run() to finish."""
        self.stop_event.set()

    def step(self) -> None:
        """One poll: fence or reconcile, report, save state when due (heartbeats run on their own)."""
        with self.session_lock:
            status = self.session.status()
        if status.fenced:
            if self.running:
                log.warning("worker %s fenced (%s): stopping %d instance(s)", self.config.node_id, status.reason, len(self.running))
                self.stop_all(save=False)
            with self.session_lock:
                self.session.acknowledge_fence()
            return
        if status.incarnation is None:
            return  # the control plane is unreachable; the heartbeat thread keeps trying
        try:
            with self.session_lock:
                assigned = self.session.assignments()
        except Exception as exc:  # an outage between beat and read: try again next poll
            log.warning("worker %s: cannot read assignments: %s", self.config.node_id, exc)
            return
        desired = {a.instance_id: a for a in assigned.instances}
        for instance_id in [i for i, r in self.running.items() if i not in desired or desired[i].spec_hash != r.spec_hash]:
            self.stop_instance(instance_id, save=True)
        now = time.monotonic()
        for instance_id, assignment in desired.items():
            if instance_id not in self.running and self.failures.get(instance_id, (0, 0.0))[1] <= now:
                self.start_instance(assignment)
        self.report()
        interval = self.config.persistence.interval_in_min * 60
        if self.config.persistence.enabled and time.monotonic() - self._last_save >= interval:
            self.save_all()

    # -- instances ----------------------------------------------------------------------------

    def start_instance(self, assignment) -> None:
        """Restore the newest state of an instance and start its streaming query."""
        instance_id = assignment.instance_id
        checkpoint = self.checkpoints / instance_id / assignment.spec_hash[:16]
        try:
            plan = plan_instance(instance_id, assignment.siddhi_app)
            self.store.restore(instance_id, checkpoint)
            settings = QuerySettings(
                self.bootstrap,
                str(checkpoint),
                assignment.extra.get("dead_letter_topic"),
                self.kafka_properties,
                os.environ.get("SP_TRIGGER_INTERVAL", "500 milliseconds"),
                kafka_source=self.config.spark.kafka_source,
            )
            query = start_query(self.spark, plan, settings)
        except Exception as exc:  # a bad instance must not take the worker down
            detail = f"{exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            log.error("worker %s: cannot start %s: %s", self.config.node_id, instance_id, detail)
            self._failed(instance_id, detail, permanent=isinstance(exc, InstancePlanError))
            return
        self.running[instance_id] = RunningInstance(instance_id, assignment.spec_hash, query, checkpoint)
        self._report(instance_id, "starting")
        log.info("worker %s: started %s", self.config.node_id, instance_id)

    def stop_instance(self, instance_id: str, *, save: bool) -> None:
        """Stop an instance's query (and save its state)."""
        running = self.running.pop(instance_id, None)
        if running is None:
            return
        try:
            running.query.stop()
        except Exception as exc:  # a query that already failed
            log.debug("stopping %s: %s", instance_id, exc)
        if save and self.config.persistence.enabled:
            self._save(running)
        self._report(instance_id, "stopped")
        log.info("worker %s: stopped %s", self.config.node_id, instance_id)

    def stop_all(self, *, save: bool) -> None:
        """Stop every instance."""
        for instance_id in list(self.running):
            self.stop_instance(instance_id, save=save)

    def save_all(self) -> None:
        """Save a state revision of every running instance."""
        self._last_save = time.monotonic()
        for running in self.running.values():
            self._save(running)

    def _save(self, running: RunningInstance) -> None:
        try:
            self.store.save(running.instance_id, running.checkpoint, owner=(self.config.node_id, self.session.incarnation))
        except NotOwnerError as exc:  # moved or fenced: the state is its new owner's to save
            log.info("worker %s: %s", self.config.node_id, exc)
        except Exception as exc:
            log.error("worker %s: cannot save the state of %s: %s", self.config.node_id, running.instance_id, exc)

    def report(self) -> None:
        """Report each instance's status and metrics; a query that died is retried after a pause."""
        for running in list(self.running.values()):
            query = running.query
            if not query.isActive:
                error = query.exception()
                detail = str(error).splitlines()[0] if error else "the query stopped"
                log.error("worker %s: %s failed: %s", self.config.node_id, running.instance_id, detail)
                self.running.pop(running.instance_id, None)
                self._failed(running.instance_id, detail)
                continue
            self.failures.pop(running.instance_id, None)
            self._report(running.instance_id, "running", metrics=query_metrics(query, running))

    def _failed(self, instance_id: str, detail: str, *, permanent: bool = False) -> None:
        """Retry later, waiting longer after each failure in a row (up to a minute). A partial app the
        worker cannot run as written is `failed`; anything else (a query that died) is `starting` again."""
        count = self.failures.get(instance_id, (0, 0.0))[0] + 1
        pause = 60.0 if permanent else min(60.0, 2.0**count)
        self.failures[instance_id] = (count, time.monotonic() + pause)
        status = "failed" if permanent else "starting"
        self._report(instance_id, status, detail=f"{detail[:450]} (failure {count}; retrying in {pause:.0f} s)")

    def _report(self, instance_id: str, status: str, **details) -> None:
        try:
            with self.session_lock:
                self.session.report(instance_id, status, **details)
        except Exception as exc:  # an outage: the next poll reports again
            log.debug("worker %s: cannot report %s: %s", self.config.node_id, instance_id, exc)

    def shutdown(self) -> None:
        """Stop the queries, save their state, deregister, stop Spark."""
        log.info("worker %s: shutting down", self.config.node_id)
        self.stop_event.set()
        self.stop_all(save=True)
        try:
            with self.session_lock:
                self.session.leave()
        except Exception as exc:
            log.warning("worker %s: could not deregister: %s", self.config.node_id, exc)
        self.store.close()
        self.plane.close()


def query_metrics(query, running: RunningInstance) -> dict:
    """Rows in/out (last batch and in total), batch duration and lag per partition."""
    for batch in query.recentProgress:
        if batch.get("batchId", -1) > running.last_batch:
            running.last_batch = batch["batchId"]
            running.totals["rows_in_total"] += batch.get("numInputRows", 0) or 0
            running.totals["rows_out_total"] += max(0, (batch.get("sink") or {}).get("numOutputRows", 0) or 0)
    progress = query.lastProgress or {}
    sources = progress.get("sources") or []
    lag = {}
    for source in sources:
        end, latest = source.get("endOffset"), source.get("latestOffset")
        if isinstance(end, str):
            end, latest = json.loads(end), json.loads(latest) if isinstance(latest, str) else latest
        if isinstance(end, dict) and isinstance(latest, dict):
            for partition, offset in latest.items():
                lag[f"{source.get('description', '')}:{partition}"] = max(0, int(offset) - int(end.get(partition, 0)))
    sink = progress.get("sink") or {}
    return {
        "batch": progress.get("batchId"),
        "rows_in": progress.get("numInputRows", 0),
        "rows_per_s": round(progress.get("processedRowsPerSecond", 0.0) or 0.0, 1),
        "rows_out": sink.get("numOutputRows", -1),
        "batch_ms": (progress.get("durationMs") or {}).get("triggerExecution"),
        "lag": sum(lag.values()),
        "lag_by_partition": lag,
        **running.totals,
    }
