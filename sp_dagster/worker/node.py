"""A worker: a long-running Spark application that runs the instances assigned to it. Every poll it
heartbeats and reconciles its instances with the current leader term's assignments, stopping removed
or changed instances before starting new ones, so two copies of an instance never run at once. How
instances run, move and stop is described in docs/concepts/workers.md and docs/concepts/control-plane.md.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sp_dagster.cluster.allocation import RECEIVER_TLS, RECEIVER_USERS, WIRE_FORMATS
from sp_dagster.cluster.prometheus import Family, serve_metrics
from sp_dagster.cluster.store.deployments import DRAIN, HOLD, RESCALED
from sp_dagster.cluster.store.moves import READY
from sp_dagster.config.tls import receiver_tls_files
from sp_dagster.config.yamlsource import default_home
from sp_dagster.errors import NotOwnerError
from sp_dagster.siddhi.transports import WIRE_FORMATS as READABLE_WIRE_FORMATS
from sp_dagster.wording import counted
from sp_dagster.worker.broker_watch import BrokerWatch
from sp_dagster.worker.instance.plan import InstancePlanError, plan_instance
from sp_dagster.worker.instance.stuck import StuckWatch
from sp_dagster.worker.persistence import store_for
from sp_dagster.worker.spark.microbatch import ROCKSDB, MicroBatchInstance, QuerySettings, pause_flag, start_query
from sp_dagster.worker.spark.native_kafka import kafka_source_kind

if TYPE_CHECKING:
    from sp_dagster.worker.receivers.http import HostedReceiver
    from sp_dagster.worker.spark.continuous import ContinuousInstance

log = logging.getLogger(__name__)

# In local mode the whole Spark application is this process: its driver RPC and block manager need not
# (and, unauthenticated, must not) listen on the machine's network address.
LOOPBACK_ONLY = {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}
REPORT_LOCK_WAIT_S = 1.0  # the main loop waits no longer for a heartbeat in progress (it may be stuck)
FORGET_EVERY_S = 10.0  # how often a worker looks for checkpoint folders of dropped state
# How often a worker reads its assignments, at most: an instance moved here starts soon after its
# old owner let go of it (its keys' silence), not up to a heartbeat interval later. Reports and
# saves keep the heartbeat's pace.
ASSIGNMENTS_EVERY_S = 0.25
PREPARED_EVERY_S = 0.05  # the pace while a task launched ahead waits for its instance: the rest of the move is fast
_NO_FAILURE = (0, 0.0, "")  # an instance's entry in Worker.failures before its first failure


@dataclass
class RunningInstance:
    """An instance the worker runs: its handle (a continuous task or a micro-batch query) and checkpoint."""

    instance_id: str
    spec_hash: str
    handle: ContinuousInstance | MicroBatchInstance | HostedReceiver
    checkpoint: Path
    started: float = field(default_factory=time.monotonic)
    status: str = "starting"  # what the worker last reported, with its metrics (for /metrics)
    metrics: dict = field(default_factory=dict)
    saved: float | None = None  # when its state was last saved to the revision store (monotonic)
    # A new instance of a rescaled group: when the rescale was recorded (ms). Its saves keep the newest revision
    # saved before then, which other new instances of the group (starting later) take their state from.
    keep_before: int | None = None


@dataclass
class PreparedStart:
    """The task of an instance on its way here, launched and held until the leader places the instance here."""

    spec_hash: str
    handle: ContinuousInstance


def spark_settings(config) -> dict[str, str]:
    """The spark.* settings of the worker's session: ours, loopback in local mode, RPC authentication when a secret is set, then the conf's."""
    return {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        # each batch writes a small changelog, not a state snapshot (one now and then)
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        **(LOOPBACK_ONLY if config.spark.master.startswith("local") else {}),
        **({"spark.authenticate": "true", "spark.authenticate.secret": config.spark.authenticate_secret} if config.spark.authenticate_secret else {}),
        **config.spark.conf,
    }


def spark_session(config):
    """The worker's one SparkSession: master and settings from config, sp-kafka registered."""
    from pyspark.sql import SparkSession

    from sp_dagster.worker.spark.kafka_source import KafkaPartitionsSource
    from sp_dagster.worker.spark.nats_source import NatsPartitionsSource

    builder = SparkSession.builder.master(config.spark.master).appName(config.spark.app_name or f"sp-dagster-worker-{config.node_id}")
    for key, value in spark_settings(config).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("SP_SPARK_LOG_LEVEL", "ERROR"))
    session.dataSource.register(KafkaPartitionsSource)
    session.dataSource.register(NatsPartitionsSource)
    log.info("worker %s: instances read Kafka with the %s source", config.node_id, kafka_source_kind(session, config.spark.kafka_source))
    return session


def require_receiver_users(plan, config) -> None:
    """InstancePlanError when the instance's HTTP receiver asks for basic auth but this node accepts no user
    (every request would get 401), or listens on https:// but this node has no certificate: the instance
    fails with what to add, instead of serving."""
    locked = [h.stream for h in plan.http_inputs if h.basic_auth]
    if locked and not config.deployment.receiver_users:
        raise InstancePlanError(
            f"{plan.name}: the http source of {', '.join(locked)} has basic.auth.enabled='true', but node {config.node_id} "
            f"has no deployment.config.receiverUsers in {config.source}: add the users it accepts"
        )
    secure = [h.stream for h in plan.http_inputs if h.secure]
    if secure and not config.deployment.receiver_tls.enabled:
        raise InstancePlanError(
            f"{plan.name}: the http source of {', '.join(secure)} listens on https://, but node {config.node_id} "
            f"has no deployment.config.receiverTls in {config.source}: add its certFile and keyFile"
        )


class Worker:
    """One resource node: heartbeats, assignments, streaming queries, state, metrics.

    Each instance runs as a long-running Spark task (`spark/continuous.py`, the default) or a Structured
    Streaming query (`spark/microbatch.py`; there the driver hosts HTTP receivers itself). The worker
    reports each instance's status and metrics, saves state revisions every `intervalInMin`, and on
    SIGTERM or SIGINT stops its instances, saves their state and deregisters."""

    def __init__(self, config, *, spark=None, plane=None):
        from sp_dagster.cluster.db import ControlPlane
        from sp_dagster.cluster.fencing import NodeSession

        self.config = config
        self.receiver_tls = receiver_tls_files(config)  # first: a certificate that cannot load is one line, before anything starts
        self.plane = plane or ControlPlane.from_config(config)
        self.session = NodeSession.from_config(config, self.plane)
        self.store = store_for(config, default_home(), self.plane)
        self.checkpoints = self.store.checkpoint_root(config.node_id)
        self.spark = spark
        self.running: dict[str, RunningInstance] = {}
        self.prepared: dict[str, PreparedStart] = {}
        self.ready: set[str] = set()  # instances coming here that this worker is ready to start (READY)
        self.failures: dict[str, tuple[int, float, str]] = {}  # instance -> (failures in a row, retry after, the last one)
        self.stop_event = threading.Event()
        # Heartbeats run on their own thread: starting a Spark query takes seconds, and a
        # worker busy starting one must not look dead. The lock keeps session calls apart.
        self.session_lock = threading.Lock()
        self._beats = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        self._last_save = time.monotonic()
        self._last_forget = self._last_report = 0.0
        self.bootstrap = config.messaging.bootstrap_servers
        self.kafka_properties = tuple(sorted(config.messaging.properties.items()))
        self.mode = config.spark.execution_mode
        self.control = None  # the continuous tasks' control line, opened with Spark
        self.slots: int | None = None
        self.broker = BrokerWatch(config.messaging, config.node_id, lambda: self.session.heartbeat_interval_s, lambda: self.session.fence_after_s)
        self.metrics_endpoint = None  # the Prometheus endpoint, served from run()

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> None:
        """Poll until stop() is called (or SIGTERM/SIGINT in the CLI), then shut down cleanly."""
        if self.spark is None:
            log.info("worker %s: starting Spark (%s)", self.config.node_id, self.config.spark.master)
            self.spark = spark_session(self.config)
        if self.mode == "continuous":
            from sp_dagster.worker.spark.continuous import control_server

            self.control = control_server(self.spark, self.session.lease_remaining_s)
            self.refresh_slots()
            log.info("worker %s: instances run continuously, %s", self.config.node_id, counted(self.slots or 0, "task slot"))
        log.info("worker %s: control plane %s, messaging %s", self.config.node_id, self.plane.safe_url, self.bootstrap)
        self.metrics_endpoint = serve_metrics(
            self.config.metrics, self.metric_families, f"worker {self.config.node_id}", self.config.deployment.https_interface.host
        )
        self.broker.start()
        self.beat()
        self._beats.start()
        watch = StuckWatch(f"worker {self.config.node_id}")
        try:
            while not self.stop_event.is_set():
                watch.beat()
                self.step()
                watch.beat()
                self.stop_event.wait(min(self.session.heartbeat_interval_s, PREPARED_EVERY_S if self.prepared else ASSIGNMENTS_EVERY_S))
        finally:
            watch.stop()
            self.shutdown()

    def _heartbeat_loop(self) -> None:
        while not self.stop_event.wait(self.session.heartbeat_interval_s):
            self.beat()

    def beat(self):
        """One heartbeat (or registration); returns the session's status."""
        with self.session_lock:
            return self.session.beat(metrics=self.node_metrics())

    def node_metrics(self) -> dict:
        """What the worker tells the control plane with each heartbeat (its capacity among it)."""
        metrics = {
            "instances": len(self.running),
            "mode": self.mode,
            "running": sorted(self.running),
            READY: sorted(self.ready),
            "broker": self.broker.state,
            "fence_after_s": self.session.fence_after_s,  # `status` tells a silent node from a live one by it
            RECEIVER_USERS: bool(self.config.deployment.receiver_users),  # basic-auth receivers run only where this is true
            RECEIVER_TLS: self.receiver_tls is not None,  # https:// receivers likewise
            WIRE_FORMATS: list(READABLE_WIRE_FORMATS),  # instances whose topics carry others go elsewhere
        }
        if self.metrics_endpoint is not None:
            metrics["metrics_url"] = self.metrics_endpoint.url
        if self.slots is not None:
            metrics["slots"] = self.slots
        return metrics

    def metric_families(self) -> list[Family]:
        """What /metrics shows: this worker's heartbeat, slots and broker reach, and each instance's rows, lag, latency and state age."""
        now = time.monotonic()
        families = [
            Family("worker_heartbeat_age_seconds", "Seconds since the control plane last accepted this worker's heartbeat.").add(
                self.session.heartbeat_age_s()
            ),
            Family("worker_fence_window_seconds", "A heartbeat older than this fences the worker (it stops its instances).").add(self.session.fence_after_s),
            Family("worker_slots", "Task slots: how many instances this worker can run at once.").add(self.slots),
            Family("worker_instances", "Instances this worker runs.").add(len(self.running)),
            Family("worker_broker_reachable", "1 while the messaging layer answers this worker's probes, else 0.").add(self.broker.state == "reachable"),
        ]
        rows_in = Family("instance_rows_in_total", "Events the instance took in.", "counter")
        rows_out = Family("instance_rows_out_total", "Events the instance published.", "counter")
        rate = Family("instance_rows_per_second", "Events in per second, over the last report's window.")
        lag = Family("instance_lag", "Messages of its input partitions not read yet.")
        latency = Family("instance_latency_ms", "Processing latency of a turn, per quantile, over the last report's window.")
        turn = Family(
            "instance_turn_ms", "Mean milliseconds a turn with input spends per phase (read, engine, produce, commit), over the last report's window."
        )
        running = Family("instance_running", "1 while the instance runs (consumes), 0 while it starts.")
        state_age = Family("instance_state_age_seconds", "Seconds since the instance's state was last saved to the revision store.")
        for name, instance in sorted(self.running.items()):
            m = instance.metrics
            rows_in.add(m.get("rows_in_total"), instance=name)
            rows_out.add(m.get("rows_out_total"), instance=name)
            rate.add(m.get("rows_per_s"), instance=name)
            lag.add(m.get("lag"), instance=name)
            latency.add(m.get("latency_ms_p50"), instance=name, quantile="0.5").add(m.get("latency_ms_p99"), instance=name, quantile="0.99")
            for phase, ms in (m.get("turn_ms") or {}).items():
                turn.add(ms, instance=name, phase=phase)
            running.add(instance.status == "running", instance=name)
            state_age.add(None if instance.saved is None else now - instance.saved, instance=name)
        return families + [rows_in, rows_out, rate, lag, latency, turn, running, state_age]

    def stop(self) -> None:
        """Ask run() to finish."""
        self.stop_event.set()

    def refresh_slots(self) -> None:
        """Continuous mode: how many instances fit, as configured or as the cores Spark has granted now
        (executors of a cluster manager register after the session starts, and come and go)."""
        from sp_dagster.worker.spark.continuous import slots

        if self.mode != "continuous" or self.spark is None:
            return
        try:
            now = self.config.spark.task_slots or slots(self.spark)
        except Exception as exc:  # noqa: BLE001 - the driver busy or going: keep what was known
            log.warning("worker %s: cannot read Spark's task slots (%s); keeping %s", self.config.node_id, exc, self.slots)
            return
        if self.slots is not None and now != self.slots:
            log.info("worker %s: %s now (was %d)", self.config.node_id, counted(now, "task slot"), self.slots)
        self.slots = now

    def step(self) -> None:
        """One poll: fence or reconcile, report, save state when due (heartbeats run on their own).

        Fenced, it stops everything and registers again as a new incarnation. An instance being moved to
        another node (`releasing`) is stopped with a last checkpoint, which its new owner starts from."""
        self.refresh_slots()
        # Read without the session lock: a heartbeat holds it across a database call that a network
        # partition can stall, and a fenced worker must stop its instances on time regardless.
        status = self.session.status()
        if status.fenced:
            if self.running:
                log.warning("worker %s fenced (%s): stopping %s", self.config.node_id, status.reason, counted(len(self.running), "instance"))
                self.stop_all(save=False)
            self.session.acknowledge_fence()
            return
        if status.incarnation is None:
            return  # the control plane is unreachable; the heartbeat thread keeps trying
        if not self.session_lock.acquire(timeout=REPORT_LOCK_WAIT_S):
            return  # a heartbeat stuck on the database: the next poll looks at the fence again first
        try:
            assigned = self.session.assignments()
        except Exception as exc:  # an outage between beat and read: try again next poll
            log.warning("worker %s: cannot read assignments: %s", self.config.node_id, exc)
            return
        finally:
            self.session_lock.release()
        held = {a.instance_id: a.extra[HOLD] for a in assigned.instances if a.extra.get(HOLD)}
        releasing = {a.instance_id for a in assigned.instances if a.releasing}
        desired = {a.instance_id: a for a in assigned.instances if a.instance_id not in held and a.instance_id not in releasing}
        stopping = [i for i, r in self.running.items() if i not in desired or desired[i].spec_hash != r.spec_hash]
        # Placed on another node without a graceful move (this one was cut off, or took too long to let go):
        # its new owner may run already, so the old copy neither commits nor aborts what it has open.
        taken = self._placed_elsewhere([i for i in stopping if i not in {a.instance_id for a in assigned.instances}])
        for instance_id in stopping:
            drain = getattr(self.running[instance_id].handle, "drain", None)  # continuous instances drain
            if held.get(instance_id) == DRAIN and drain is not None:
                drain()
            self.stop_instance(instance_id, save=instance_id not in taken)
        if releasing & set(stopping):
            log.info("worker %s: let go of %s (moving to another node)", self.config.node_id, ", ".join(sorted(releasing & set(stopping))))
            self.beat()  # at once: the leader hands them on when a heartbeat no longer lists them
        now = time.monotonic()
        for instance_id, assignment in desired.items():
            if instance_id not in self.running and self.failures.get(instance_id, _NO_FAILURE)[1] <= now:
                self.start_instance(assignment)
        self._prepare(assigned.incoming, desired)
        if now - self._last_report >= self.session.heartbeat_interval_s:
            self._last_report = now
            self.report()
        if now - self._last_forget >= FORGET_EVERY_S:
            self._last_forget = now
            self.forget_dropped()
        interval = self.config.persistence.interval_in_min * 60
        if self.config.persistence.enabled and time.monotonic() - self._last_save >= interval:
            self.save_all()

    def _placed_elsewhere(self, instance_ids: list[str]) -> set[str]:
        """Those of `instance_ids` now placed on another node (all of them when the control plane cannot say)."""
        from sp_dagster.cluster.store.assignments import placed_elsewhere

        try:
            return placed_elsewhere(self.plane, self.config.node_id, instance_ids)
        except Exception as exc:  # an outage right after the assignments were read: assume the worst
            log.warning("worker %s: cannot read where %s went: %s", self.config.node_id, ", ".join(instance_ids), exc)
            return set(instance_ids)

    # -- instances ----------------------------------------------------------------------------

    def start_instance(self, assignment) -> None:
        """Restore the newest state of an instance and start it (a continuous task or a micro-batch query)."""
        instance_id, rescaled = assignment.instance_id, assignment.extra.get(RESCALED)
        checkpoint = self.checkpoints / instance_id / assignment.spec_hash[:16]
        if self.slots is not None and self._slots_taken(but=instance_id) >= self.slots:
            self._report(instance_id, "starting", detail=f"waiting for a task slot: all {self.slots} are taken")
            return
        try:
            plan = self._plan(assignment)
            self.store.restore(instance_id, checkpoint)
            handover = None
            if rescaled and self.mode != "continuous" and not plan.http_inputs:
                handover = self._rescaled_query(plan, rescaled, checkpoint)
            elif rescaled:
                self._rescaled(plan, rescaled, checkpoint)
            handle = self._start(plan, assignment, checkpoint, handover)
        except Exception as exc:  # a bad instance must not take the worker down
            detail = f"{exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            log.error("worker %s: cannot start %s: %s", self.config.node_id, instance_id, detail)
            self._failed(instance_id, detail, permanent=isinstance(exc, InstancePlanError))
            return
        self.running[instance_id] = RunningInstance(instance_id, assignment.spec_hash, handle, checkpoint, keep_before=rescaled["since"] if rescaled else None)
        self._report(instance_id, "starting", detail=self._retrying(instance_id))
        log.info("worker %s: started %s (%s)", self.config.node_id, instance_id, handle.mode)

    def _prepare(self, incoming, desired: dict) -> None:
        """Launch the held tasks of instances planned to move here (their start then skips Spark's task launch), within
        the free task slots; give up those no longer on their way here. Say at once which are ready: their owners are
        asked to let go only then (cluster.store.moves)."""
        coming = {d.instance_id: d for d in incoming}
        for instance_id, prepared in list(self.prepared.items()):
            if instance_id not in desired and (instance_id not in coming or coming[instance_id].spec_hash != prepared.spec_hash):
                self._discard_prepared(instance_id)
        ready = {i for i in coming if not self._launch_ahead(i, coming[i])}  # nothing to launch ahead: ready as it is
        ready |= set(coming) & set(self.prepared)
        grew, self.ready = bool(ready - self.ready), ready
        if grew:
            self.beat()

    def _launch_ahead(self, instance_id: str, definition) -> bool:
        """Launch the held task of an instance coming here; False when there is nothing to launch (or no room for it)."""
        if instance_id in self.prepared or instance_id in self.running:
            return instance_id in self.prepared
        if self.mode != "continuous" or self.control is None or (self.slots is not None and self._slots_taken() >= self.slots):
            return False
        from sp_dagster.worker.spark.continuous import ContinuousInstance

        checkpoint = self.checkpoints / instance_id / definition.spec_hash[:16]
        try:
            plan = self._plan(definition)
            if plan.http_inputs:
                return False  # a receiver binds its port when it starts: nothing to launch ahead
            handle = ContinuousInstance(self.spark, self.control, plan, self.config.messaging, self._loop_settings(definition), checkpoint, held=True)
        except Exception as exc:  # noqa: BLE001 - its start proper says what is wrong, when it comes
            log.debug("worker %s: cannot prepare %s: %s", self.config.node_id, instance_id, exc)
            return False
        self.prepared[instance_id] = PreparedStart(definition.spec_hash, handle.start())
        log.info("worker %s: prepared %s (on its way here)", self.config.node_id, instance_id)
        return True

    def _slots_taken(self, but: str | None = None) -> int:
        """Task slots held by running instances and prepared starts (`but`'s prepared start not counted: it becomes the instance)."""
        return len(self.running) + sum(1 for i in self.prepared if i != but)

    def _discard_prepared(self, instance_id: str) -> None:
        prepared = self.prepared.pop(instance_id)
        prepared.handle.stop(save=False)
        log.info("worker %s: gave up the prepared start of %s", self.config.node_id, instance_id)

    def _rescaled(self, plan, rescaled: dict, checkpoint: Path) -> None:
        """An instance of a rescaled group (deploy.rescale) that has not checkpointed since: its start is where
        its group's old instances stopped reading, and (keyed) the state of the keys it now owns, split from their
        last checkpoints."""
        from sp_dagster.worker.instance.checkpoints import Checkpoint, split_checkpoints
        from sp_dagster.worker.spark.continuous import read_checkpoint, write_checkpoint

        own = read_checkpoint(checkpoint)
        if own is not None and Checkpoint.decode(own).saved_at >= rescaled["since"]:
            return
        # As they were when the rescale was recorded: a new instance may share an old one's name, and
        # its own revisions (the keys it owns now) must not stand in for the old one's last state.
        found = {old: self.store.newest_checkpoint(old, before_ms=rescaled["since"]) for old in rescaled["from"]}
        olds = {old: data for old, data in found.items() if data is not None}
        if self._missing(plan, sorted(set(found) - set(olds))):
            if own is not None:  # never over an old instance's of the same name: that one is newer
                olds.setdefault(plan.name, own)
            if not olds:
                return
        owns, mine, topic = self._owned_keys(plan, rescaled)
        write_checkpoint(checkpoint, split_checkpoints(olds.values(), owns, stateless=plan.stateless).encode())
        log.info("worker %s: %s starts with the keys it owns of %s (partitions %s of %s)", self.config.node_id, plan.name, ", ".join(olds), sorted(mine), topic)

    def _rescaled_query(self, plan, rescaled: dict, checkpoint: Path):
        """_rescaled() in micro-batch mode: the Handover a new query of a rescaled group starts from (the partitions'
        offsets and the keys' state in its group's old checkpoints), None when its own checkpoint is already past it."""
        from sp_dagster.worker.spark.handover import handed_over_since, mark, take_over

        since = rescaled["since"]
        if handed_over_since(checkpoint) == since:
            return None  # started from this rescale before: its own checkpoint goes on from there
        shutil.rmtree(checkpoint, ignore_errors=True)  # an older query's (a revision of an old instance of its name)
        scratch = self.checkpoints / ".handover" / plan.name
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            found = {old: self.store.checkpoint_before(old, since, scratch / old) for old in rescaled["from"]}
            olds = [d for d in found.values() if d is not None]
            self._missing(plan, sorted(old for old, d in found.items() if d is None))
            owns, mine, topic = self._owned_keys(plan, rescaled)
            topics = {s.topic: tuple(s.partitions) for s in plan.inputs}
            handover = take_over(self.spark, topics, olds, None if plan.stateless else owns)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        mark(checkpoint, since)
        log.info(
            "worker %s: %s starts with the keys it owns of %s (partitions %s of %s)", self.config.node_id, plan.name, ", ".join(found), sorted(mine), topic
        )
        return handover

    def _missing(self, plan, missing: list[str]) -> bool:
        """Whether old instances of a rescaled group left no checkpoint: an error where state would be lost, a warning otherwise."""
        if missing and not plan.stateless:
            raise RuntimeError(f"rescaled, but no checkpoint of {', '.join(missing)} is in the persistence store (it must be shared)")
        if missing:  # no state to lose: go on from what there is, and say what may be read twice
            log.warning(
                "worker %s: %s: no checkpoint of %s in the persistence store, so the partitions they read may be read again; "
                "share the persistence store between workers to move read positions exactly",
                self.config.node_id, plan.name, ", ".join(missing),
            )  # fmt: skip
        return bool(missing)

    @staticmethod
    def _owned_keys(plan, rescaled: dict):
        """Which keys a new instance of a rescaled group owns (a test on a key), its partitions of the keyed topic, and that topic."""
        from sp_dagster.messaging.strategies import partition_for_key

        topic, count = next(iter(sorted(rescaled["partitions"].items())), (None, 0))
        mine = set(next((s.partitions for s in plan.inputs if s.topic == topic), ()))
        return (lambda key: not count or partition_for_key(key.encode("utf-8"), count) in mine), mine, topic

    def _plan(self, assignment):
        """The instance's plan, with the engine settings of this worker: datasources for @store, and the
        aggregation shard id (the instance's own when it is an active-active shard, so a move never double-counts)."""
        from sp_dagster.engine.aggregation.settings import runtime_settings

        plan = plan_instance(assignment.instance_id, assignment.siddhi_app)
        require_receiver_users(plan, self.config)
        engine = {**runtime_settings(self.config), "shard_id": assignment.extra.get("shard_id") or self.config.shard_id}
        return dataclasses.replace(plan, extras={**plan.extras, "engine": engine, "fresh_since": assignment.extra.get("fresh_since")})

    def _loop_settings(self, assignment):
        """How a continuous task or a receiver runs the instance's loop on this worker."""
        from sp_dagster.worker.instance.loop import LoopSettings

        spark = self.config.spark
        return LoopSettings(
            assignment.extra.get("dead_letter_topic"),
            transactions=spark.exactly_once,
            checkpoint_interval_s=spark.checkpoint_interval / 1000,
            receiver_users=tuple((u.username, u.password) for u in self.config.deployment.receiver_users),
            receiver_tls=self.receiver_tls,
            abandoned_after_s=self.session.fence_after_s,
        )

    def _start(self, plan, assignment, checkpoint: Path, handover=None):
        dead_letters = assignment.extra.get("dead_letter_topic")
        if self.mode == "continuous" or plan.http_inputs:
            settings = self._loop_settings(assignment)
            users = settings.receiver_users
            if self.mode != "continuous":  # a query cannot listen: the driver hosts the receiver on a thread
                from sp_dagster.messaging import transport_for
                from sp_dagster.worker.receivers.http import HostedReceiver

                transport = transport_for(self.config.messaging, timeout=30.0)
                return HostedReceiver(
                    plan, transport, settings, users=users, lease_remaining=self.session.lease_remaining_s, own_transport=True, messaging=self.config.messaging
                ).start()
            from sp_dagster.worker.spark.continuous import ContinuousInstance

            assert self.control is not None  # opened with Spark, in continuous mode
            prepared = self.prepared.get(assignment.instance_id)
            if prepared is not None and prepared.spec_hash == assignment.spec_hash and prepared.handle.active:
                del self.prepared[assignment.instance_id]
                prepared.handle.release()  # from the checkpoint just restored into its directory
                return prepared.handle
            if prepared is not None:
                self._discard_prepared(assignment.instance_id)
            return ContinuousInstance(self.spark, self.control, plan, self.config.messaging, settings, checkpoint).start()
        settings = QuerySettings(
            self.bootstrap,
            str(checkpoint),
            dead_letters,
            self.kafka_properties,
            os.environ.get("SP_TRIGGER_INTERVAL", "500 milliseconds"),
            kafka_source=self.config.spark.kafka_source,
            messaging=self.config.messaging.kind,
            cluster_id=self.config.messaging.cluster_id,
            **({"handover": handover} if handover is not None else {}),
        )
        return MicroBatchInstance(start_query(self.spark, plan, settings), pause_flag(settings.checkpoint))

    def stop_instance(self, instance_id: str, *, save: bool) -> None:
        """Stop an instance (and save its state)."""
        running = self.running.get(instance_id)
        if running is None:
            return
        try:
            running.handle.stop(save=save)
            if save and self.config.persistence.enabled:
                self._save(running)
        finally:
            del self.running[instance_id]  # only now: its heartbeat says it still runs until its last state is saved
        self._report(instance_id, "stopped")
        log.info("worker %s: stopped %s", self.config.node_id, instance_id)

    def stop_all(self, *, save: bool) -> None:
        """Stop every instance (and give up the prepared starts)."""
        for instance_id in list(self.running):
            self.stop_instance(instance_id, save=save)
        for instance_id in list(self.prepared):
            self._discard_prepared(instance_id)

    def forget_dropped(self) -> None:
        """Delete the checkpoint folders this worker holds of instances whose state an operator dropped
        (`undeploy --drop-state`, recorded in the control plane) after their last checkpoint."""
        from sp_dagster.cluster.store.drops import drop_times

        if not self.checkpoints.is_dir():
            return
        held = {p.name: p for p in self.checkpoints.iterdir() if p.is_dir() and p.name not in self.running}
        try:
            dropped = drop_times(self.plane, held)
        except Exception as exc:  # an outage: the next poll looks again
            log.debug("worker %s: cannot read dropped state: %s", self.config.node_id, exc)
            return
        for instance_id, at in sorted(dropped.items()):
            folder = held[instance_id]
            newest = max((f.stat().st_mtime for f in folder.rglob("*")), default=folder.stat().st_mtime)
            if newest * 1000 < at:
                shutil.rmtree(folder, ignore_errors=True)
                log.info("worker %s: deleted the checkpoints of %s (its state was dropped)", self.config.node_id, instance_id)

    def save_all(self) -> None:
        """Save a state revision of every running instance."""
        self._last_save = time.monotonic()
        for running in self.running.values():
            self._save(running)

    def _save(self, running: RunningInstance) -> None:
        try:
            self.store.save(running.instance_id, running.checkpoint, owner=(self.config.node_id, self.session.incarnation), keep_before=running.keep_before)
            running.saved = time.monotonic()
        except NotOwnerError as exc:  # moved or fenced: the state is its new owner's to save
            log.info("worker %s: %s", self.config.node_id, exc)
        except Exception as exc:
            log.error("worker %s: cannot save the state of %s: %s", self.config.node_id, running.instance_id, exc)

    def report(self) -> None:
        """Report each instance's status and metrics; one that died is retried after a pause, from its newest state."""
        for running in list(self.running.values()):
            handle = running.handle
            if not handle.active:
                detail = handle.failure()
                log.error("worker %s: %s failed: %s", self.config.node_id, running.instance_id, detail)
                self.running.pop(running.instance_id, None)
                if self.config.persistence.enabled:
                    self._save(running)  # refused unless this worker still owns it; the restart restores it
                self._failed(running.instance_id, detail)
                continue
            # Running once it consumes: a continuous task is `starting` until its loop has opened.
            running.status, running.metrics = "running" if handle.ready else "starting", handle.metrics()
            if handle.ready:
                self.failures.pop(running.instance_id, None)
            self._report(running.instance_id, running.status, metrics=running.metrics, detail=self._retrying(running.instance_id))

    def _failed(self, instance_id: str, detail: str, *, permanent: bool = False) -> None:
        """Retry later, waiting longer after each failure in a row (up to a minute). A partial app the
        worker cannot run as written is `failed`; anything else (a query that died) is `starting` again."""
        count = self.failures.get(instance_id, _NO_FAILURE)[0] + 1
        pause = 60.0 if permanent else min(60.0, 2.0**count)
        self.failures[instance_id] = (count, time.monotonic() + pause, detail[:450])
        status = "failed" if permanent else "starting"
        self._report(instance_id, status, detail=f"{detail[:450]} (failure {count}; retrying in {pause:.0f} s)")

    def _retrying(self, instance_id: str) -> str | None:
        """What `status` shows of an instance started again after a failure, until it runs."""
        count, _at, detail = self.failures.get(instance_id, _NO_FAILURE)
        return f"started again after failure {count}: {detail}" if count else None

    def _report(self, instance_id: str, status: str, **details) -> None:
        # Never held up by a heartbeat stuck on an unreachable database: a fence must be acted on at once.
        if self.session.fenced or not self.session_lock.acquire(timeout=REPORT_LOCK_WAIT_S):
            return  # the next poll reports again
        try:
            self.session.report(instance_id, status, **details)
        except Exception as exc:  # an outage: the next poll reports again
            log.debug("worker %s: cannot report %s: %s", self.config.node_id, instance_id, exc)
        finally:
            self.session_lock.release()

    def shutdown(self) -> None:
        """Stop the queries, save their state, deregister, stop Spark."""
        log.info("worker %s: shutting down", self.config.node_id)
        self.stop_event.set()
        self.broker.stop()
        self.stop_all(save=True)
        try:
            with self.session_lock:
                self.session.leave()
        except Exception as exc:
            log.warning("worker %s: could not deregister: %s", self.config.node_id, exc)
        if self.control is not None:
            self.control.close()
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.stop()
        self.store.close()
        self.plane.close()
