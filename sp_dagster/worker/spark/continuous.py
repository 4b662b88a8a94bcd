"""Continuous mode: each instance is one long-running task of the worker's Spark application, a
one-task job the driver submits from a thread of its own. The task runs `InstanceLoop` and talks to
the driver over the control line (`control.py`); it holds a task slot while the instance runs, so a
worker runs at most as many instances as it has slots.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sp_dagster.worker.instance.checkpoints import set_aside, set_aside_reason
from sp_dagster.worker.instance.loop import LoopSettings
from sp_dagster.worker.instance.plan import InstancePlan
from sp_dagster.worker.spark.control import ControlServer, DriverControl

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "continuous.ckpt"
STOP_TIMEOUT_S = 30.0
CONNECT_WAIT_S = 5.0  # how long a graceful stop waits for a starting task to connect


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs, shipped to the executor with the job."""

    plan: InstancePlan
    messaging: object  # config.MessagingSettings
    settings: LoopSettings
    address: tuple[str, int]
    authkey: bytes
    token: str
    log_level: int = logging.INFO


def run_task(specs):
    """The body of an instance's Spark task: run its loop until stopped; yields why it stopped."""
    for spec in specs:
        yield _run(spec)


def _run(spec: TaskSpec) -> str:
    from sp_dagster.messaging import transport_for
    from sp_dagster.worker.instance.loop import InstanceLoop

    # force: a reused Python worker process was set up by an earlier task, for another instance
    logging.basicConfig(level=spec.log_level, format=f"%(asctime)s %(levelname)s [{spec.plan.name}] %(name)s: %(message)s", force=True)
    control = DriverControl(spec.address, spec.authkey, spec.token)
    if control.stopped_before_start:  # prepared for a move that went elsewhere: nothing opened, not even a client
        control.close("stopped")
        return "stopped"
    reason = "failed"
    transport = transport_for(spec.messaging, timeout=30.0)
    try:
        if spec.plan.http_inputs:  # a receiver partial app: an HTTP endpoint publishing to entry topics
            from sp_dagster.worker.receivers.http import ReceiverLoop

            loop = ReceiverLoop(spec.plan, transport, spec.settings, control=control, users=dict(spec.settings.receiver_users), messaging=spec.messaging)
        else:
            loop = InstanceLoop(spec.plan, transport, spec.settings, checkpoint=control.start_checkpoint, control=control)
        reason = loop.run()
        return reason
    finally:
        control.close(reason)
        transport.close()


def slots(spark) -> int:
    """How many tasks the worker's Spark application runs at once now (its default parallelism: on a
    cluster manager, the cores its registered executors were granted, at least 2)."""
    return max(1, int(spark.sparkContext.defaultParallelism))


def control_server(spark, lease) -> ControlServer:
    """The driver's control listener, on the address executors know the driver by."""
    master = spark.sparkContext.master
    if master.startswith("local"):
        return ControlServer("127.0.0.1", lease=lease)
    host = spark.sparkContext.getConf().get("spark.driver.host", "127.0.0.1")
    return ControlServer(host, bind_host="0.0.0.0", lease=lease)


def read_checkpoint(directory: Path) -> bytes | None:
    """The newest checkpoint kept in an instance's checkpoint directory, or None."""
    path = Path(directory) / CHECKPOINT_FILE
    return path.read_bytes() if path.exists() else None


def write_checkpoint(directory: Path, data: bytes) -> None:
    """Keep a checkpoint in the directory, replacing the previous one atomically (or setting it aside when the new one says so)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / CHECKPOINT_FILE).exists() and (why := set_aside_reason(data)):
        set_aside(directory / CHECKPOINT_FILE, why)  # the instance did not use it: kept, never deleted
    temp = directory / f".{CHECKPOINT_FILE}.{os.getpid()}.{threading.get_ident()}"
    temp.write_bytes(data)
    os.replace(temp, directory / CHECKPOINT_FILE)


class ContinuousInstance:
    """The driver's handle on one instance's long-running task.

    Its job group names the instance, so Spark's UI lists it. The task runs `InstanceLoop` in the
    executor's Python worker. Over the control line it receives its lease and the checkpoint to start
    from, and sends back checkpoints and metrics; the driver keeps the newest checkpoint in the
    instance's checkpoint directory (`continuous.ckpt`), which the persistence store saves as revisions
    like any checkpoint. Spark places the task on an executor, hosts its Python worker and retries it
    per `spark.task.maxFailures`; a retried task starts from the newest checkpoint the driver holds."""

    mode = "continuous"

    def __init__(self, spark, server: ControlServer, plan: InstancePlan, messaging, settings: LoopSettings, checkpoint_dir: Path, *, held: bool = False):
        self.spark = spark
        self.server = server
        self.plan = plan
        self.checkpoint_dir = Path(checkpoint_dir)
        checkpoint = None if held else read_checkpoint(self.checkpoint_dir)
        self.link = server.open(checkpoint, lambda data: write_checkpoint(self.checkpoint_dir, data), held=held)
        self.spec = TaskSpec(plan, messaging, settings, server.address, server.authkey, self.link.token, logging.getLogger().getEffectiveLevel())
        self.job_group = f"sp-dagster:{plan.name}:{self.link.token[:8]}"
        self.error: str | None = None
        self.done = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._job, name=f"instance-{plan.name}", daemon=True)

    def start(self) -> ContinuousInstance:
        """Submit the instance's Spark job."""
        self._thread.start()
        return self

    def _job(self) -> None:
        context = self.spark.sparkContext
        try:
            context.setJobGroup(self.job_group, f"sp-dagster instance {self.plan.name} (continuous)", interruptOnCancel=True)
            if self._stopping:  # stopped before its job was submitted
                return
            context.parallelize([self.spec], 1).mapPartitions(run_task).collect()
        except Exception as exc:  # the task failed (after Spark's retries) or was cancelled
            self.error = _first_line(exc)
        finally:
            self.done.set()

    def release(self) -> None:
        """Start a held task (its Spark task launched ahead of a move) from the checkpoint its directory holds now."""
        self.link.release(read_checkpoint(self.checkpoint_dir))

    @property
    def active(self) -> bool:
        """True while the task runs."""
        return not self.done.is_set()

    @property
    def ready(self) -> bool:
        """True once the task's loop has opened its inputs and outputs (its first metrics came)."""
        return bool(self.link.metrics)

    def failure(self) -> str:
        """Why the task ended, when it was not asked to."""
        return self.error or (self.link.reason if self.link.reason not in (None, "stopped") else None) or "the task ended"

    def metrics(self) -> dict:
        """The task's newest metrics."""
        return dict(self.link.metrics)

    def drain(self) -> None:
        """Have the task read its inputs to their end before its last checkpoint (a rescale: see deploy.rescale)."""
        self.link.send(("drain",))

    def stop(self, *, save: bool, timeout: float = STOP_TIMEOUT_S) -> None:
        """Ask the task to stop (after a last checkpoint when save) and wait; cancel it if it does not."""
        self._stopping = True
        sent = self.link.send(("stop", save))
        if save and not sent:
            # A task still starting is told once it connects, so it stops with a checkpoint instead of being
            # cancelled mid-turn; one that does not connect soon (queued for a core) has done nothing yet.
            deadline = time.monotonic() + min(timeout, CONNECT_WAIT_S)
            while not sent and not self.done.is_set() and time.monotonic() < deadline:
                time.sleep(0.05)
                sent = self.link.send(("stop", save))
        if not sent and not self.done.is_set():
            # Given up before it connected: a task that connects while its job is cancelled is turned away
            # (it has done nothing yet), and one that connected a moment ago is told to stop instead.
            self.server.forget(self.link)
            sent = self.link.send(("stop", save))
        if sent:
            self.link.finished.wait(timeout)
        if not self.done.wait(0 if not self.link.finished.is_set() else timeout):
            log.warning("%s: the task did not stop in time; cancelling its Spark job", self.plan.name)
            # Again until it ends: a cancel that comes before the job is submitted cancels nothing.
            deadline = time.monotonic() + timeout
            while not self.done.is_set() and time.monotonic() < deadline:
                self.spark.sparkContext.cancelJobGroup(self.job_group)
                self.done.wait(1.0)
        self.server.forget(self.link)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    # Spark wraps the Python error: its last 'Error:' line is the useful one.
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    useful = [line for line in lines if "Error:" in line or "Exception:" in line]
    return f"{exc.__class__.__name__}: {(useful[-1] if useful else (lines[0] if lines else ''))[:400]}"
