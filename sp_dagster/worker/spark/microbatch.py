"""Start one partial-app instance as a Spark Structured Streaming query: its sources read exactly the
instance's partitions, the engine runs in transformWithStateInPandas (one engine per partition key
where the instance splits by key) or in mapInArrow when the partial app is stateless, and the sink
publishes the encoded messages. A restarted query resumes where its last committed batch ended.
"""

from __future__ import annotations

import gc
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from sp_dagster.messaging.codecs import BinaryCodec
from sp_dagster.siddhi.secrets import resolved_properties
from sp_dagster.worker.instance.batching import batched_inputs, batched_outputs, expand, pack
from sp_dagster.worker.instance.connections import share_of
from sp_dagster.worker.instance.plan import InstancePlan, InstancePlanError
from sp_dagster.worker.instance.runtime import InstanceRuntime, Message, needs_wakeups
from sp_dagster.worker.instance.sinks import HttpSinks
from sp_dagster.worker.spark.handover import Handover
from sp_dagster.worker.spark.native_kafka import kafka_source_kind, read_native
from sp_dagster.worker.spark.types import RAW_DDL, RAW_SCHEMA

OUTPUT_DDL = "_topic string, _partition int, _key binary, _value binary, _timestamp bigint, _origin binary"
OUTPUT_SCHEMA = pa.schema(
    [
        ("_topic", pa.string()),
        ("_partition", pa.int32()),
        ("_key", pa.binary()),
        ("_value", pa.binary()),
        ("_timestamp", pa.int64()),
        ("_origin", pa.binary()),
    ]
)
EXPLODED_DDL = f"{RAW_DDL}, `_index` int"  # raw messages, one per event: batches cut (worker/instance/batching.py)
EXPLODED_SCHEMA = RAW_SCHEMA.append(pa.field("_index", pa.int32()))
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PAUSE_FILE = "sp-pause"  # in a query's checkpoint directory: see pause_flag()
STOP_TIMEOUT_S = 30.0  # the longest a stop waits for the batch under way
_CACHED_RUNTIMES = 10_000
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QuerySettings:
    """Where and how an instance's query runs."""

    bootstrap: str
    checkpoint: str
    dead_letter_topic: str | None = None
    kafka_properties: tuple[tuple[str, str], ...] = ()
    trigger_interval: str = "500 milliseconds"
    max_events_per_trigger: int | None = None
    kafka_source: str = "auto"  # the worker config's spark.kafkaSource: auto | native | python
    messaging: str = "kafka"  # the messaging layer between groups: kafka | nats
    cluster_id: str | None = None  # NATS: the clusterId that names the streams
    handover: Handover = field(default_factory=Handover)  # a rescaled instance's first start: where it reads from, what state it takes


_NONE_BATCHED: Mapping[str, BinaryCodec] = {}


def _messages(columns, batched: Mapping[str, BinaryCodec] = _NONE_BATCHED, *, indexed: bool = False) -> list[Message]:
    """Messages from the raw columns, in RAW_COLUMNS order (topic, partition, offset, timestamp, key, value, origin,
    then the index in its batch when `indexed`: cut by `_exploded`), the batches of `batched` topics cut into their events."""
    if indexed:
        return [Message(t, int(p), int(o), _stamp(s), k, v, origin, int(i)) for t, p, o, s, k, v, origin, i in zip(*columns[:8])]
    messages = [Message(t, int(p), int(o), _stamp(s), k, v, origin) for t, p, o, s, k, v, origin in zip(*columns[:7])]
    if not batched or not any(m.topic in batched for m in messages):
        return messages
    out: list[Message] = []
    for m in messages:
        out += expand(m.topic, [m[1:7]], batched[m.topic]) if m.topic in batched else [m]
    return out


def _stamp(value) -> int | None:
    return None if value is None or value != value else int(value)


def _exploded(batched: Mapping[str, BinaryCodec]):
    """A mapInArrow function cutting the batches of `batched` topics into their events (rows of EXPLODED_DDL, each
    event's value encoded on its own), so that a keyed instance's events are grouped by their own keys."""

    def run(frames: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for frame in frames:
            messages = [
                m if type(m.value) is not tuple else m._replace(value=batched[m.topic].encode(m.value))
                for m in _messages([column.to_pylist() for column in frame.columns], batched)
            ]
            yield pa.RecordBatch.from_arrays(
                [pa.array(column, type=kind) for column, kind in zip(zip(*messages), EXPLODED_SCHEMA.types)]
                if messages
                else [pa.array([], type=kind) for kind in EXPLODED_SCHEMA.types],
                schema=EXPLODED_SCHEMA,
            )

    return run


def _output_columns(messages: list[Message]) -> dict:
    return {
        "_topic": [m.topic for m in messages],
        "_partition": [m.partition for m in messages],
        "_key": [m.key for m in messages],
        "_value": [m.value for m in messages],
        "_timestamp": [m.timestamp for m in messages],
        "_origin": [m.origin for m in messages],
    }


@dataclass
class _Cached:
    """An engine kept between micro-batches, the token of the state it holds, the timer it armed."""

    token: str
    runtime: InstanceRuntime
    armed: int | None = None


# Engines kept between micro-batches in this Python worker process: a batch reuses one only
# when the state store still holds its token (a retried batch rolls the store back, and then
# the engine is rebuilt from the snapshot, and its timer registered again).
_RUNTIMES: OrderedDict[tuple, _Cached] = OrderedDict()


def _freeze_once() -> None:
    """Keep what the Python worker holds out of garbage collection: pyspark.daemon collects fully
    after every task, and the engines kept between micro-batches made that cost dominate."""
    global _FROZEN
    if not _FROZEN:
        gc.freeze()
        _FROZEN = True


_FROZEN = False


def _cached(cache_key: tuple, token: str | None, snapshot: bytes | None, make) -> _Cached:
    cached = _RUNTIMES.pop(cache_key, None)
    if cached is not None and token is not None and cached.token == token:
        return cached
    if cached is not None:
        cached.runtime.close()
    _freeze_once()
    runtime = make()
    if snapshot:
        runtime.restore(snapshot)
    return _Cached("", runtime)


def _keep(cache_key: tuple, cached: _Cached) -> None:
    _RUNTIMES[cache_key] = cached
    while len(_RUNTIMES) > _CACHED_RUNTIMES:
        _key, old = _RUNTIMES.popitem(last=False)
        old.runtime.close()


def _output_frames(messages: list[Message]) -> Iterator:
    """The messages as one pandas frame (none when there are none) for transformWithStateInPandas."""
    import numpy as np
    import pandas as pd

    if not messages:
        return
    # Plain object columns, built in one step (a frame per key and batch: its cost counts): an
    # Arrow-backed column (pandas may infer one for strings) reaches Spark's converter as a
    # ChunkedArray, which it cannot take.
    rows = np.array([(m.topic, m.partition, m.key, m.value, m.timestamp, m.origin) for m in messages], dtype=object)
    yield pd.DataFrame(rows, columns=OUTPUT_SCHEMA.names)


def _processing_time(timer_values) -> int:
    """The batch's processing time (ms); the system time when the query keeps no timers."""
    now = timer_values.getCurrentProcessingTimeInMs()
    return now if now >= 0 else int(time.time() * 1000)


def _stateful_processor(plan: InstancePlan, dead_letters: str | None, timers: bool, *, indexed: bool):
    """The processor of a stateful instance's keys (`indexed`: its input rows were cut by `_exploded`).

    Wall-clock time: an instance whose app has no @app:playback and uses timers (time windows,
    time rate limits, ...) runs with timeMode="ProcessingTime" (`timers`). Its engines take the batch's
    processing time as now, and after each call the key registers a Spark timer for its engine's
    next wake-up; handleExpiredTimer moves the engine to that time and emits what it produces, so
    expired events and timer-driven outputs come when their time comes, with no new input."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    batched, published = batched_inputs(plan), batched_outputs(plan)

    class PartialAppProcessor(StatefulProcessor):
        """Runs the instance's engine for one key; its snapshot is the key's state."""

        def init(self, handle) -> None:
            self.handle = handle
            self.state = handle.getValueState("engine", "token string, snapshot binary")

        def _engine(self, key, now: int, *, create: bool) -> tuple[tuple, _Cached | None]:
            cache_key = (plan.name, plan.siddhi, tuple(key))
            saved = self.state.get()  # None when the key has no state: one round trip to the state store
            if saved is None and not create:
                return cache_key, None
            token, snapshot = saved or (None, None)
            return cache_key, _cached(cache_key, token, snapshot, lambda: InstanceRuntime(plan, dead_letters, key="|".join(map(str, key)), now=now))

        def _save(self, cache_key: tuple, cached: _Cached, now: int, changed: bool = True) -> None:
            if changed:
                cached.token = uuid.uuid4().hex
                self.state.update((cached.token, cached.runtime.snapshot()))
            wakeup = cached.runtime.next_wakeup()
            if timers and wakeup is not None:
                # Spark fires timers of later batches only: never arm one at or before now.
                wakeup = max(wakeup, now + 1)
                if wakeup != cached.armed:
                    self.handle.registerTimer(wakeup)
                    cached.armed = wakeup
            _keep(cache_key, cached)

        def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
            now = _processing_time(timerValues)
            cache_key, cached = self._engine(key, now, create=True)
            assert cached is not None  # create=True always gives one
            # Spark hands the columns over positionally (named _0, _1, ...), in the source's order.
            messages = [m for frame in rows for m in _messages([column.tolist() for _name, column in frame.items()], batched, indexed=indexed)]
            out = pack(_delivered(plan, cached.runtime.process(messages, now), dead_letters), published)
            self._save(cache_key, cached, now)
            yield from _output_frames(out)

        def handleInitialState(self, key, initialState, timerValues) -> None:
            """A key taken over from a rescaled group's old instance: its engine's state, and its timer armed again."""
            token = ""
            for token, snapshot in zip(initialState["token"], initialState["snapshot"], strict=True):
                self.state.update((token, bytes(snapshot)))
            now = _processing_time(timerValues)
            cache_key, cached = self._engine(key, now, create=False)
            if cached is not None:
                cached.token = token  # the engine holds what the store does: the next batch reuses it
                self._save(cache_key, cached, now, changed=False)

        def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
            now = max(_processing_time(timerValues), expiredTimerInfo.getExpiryTimeInMs())
            cache_key, cached = self._engine(key, now, create=False)
            if cached is None:
                return
            wakeup = cached.runtime.next_wakeup()
            due = wakeup is not None and wakeup <= now
            out = pack(_delivered(plan, cached.runtime.advance(now), dead_letters), published) if due else []
            self._save(cache_key, cached, now, changed=due)
            yield from _output_frames(out)

        def close(self) -> None:
            pass

    return PartialAppProcessor()


def _stateless_function(plan: InstancePlan, dead_letters: str | None):
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        cache_key = (plan.name, plan.siddhi, "stateless")
        _freeze_once()
        cached = _RUNTIMES.get(cache_key) or _Cached("stateless", InstanceRuntime(plan, dead_letters))
        _keep(cache_key, cached)
        runtime = cached.runtime
        runtime.forget()  # a retried task publishes what its first attempt did (downstream drops the twice-seen)
        batched, published = batched_inputs(plan), batched_outputs(plan)
        for batch in batches:
            out = _delivered(plan, runtime.process(_messages([column.to_pylist() for column in batch.columns], batched)), dead_letters)
            out = pack(out, published)
            yield pa.RecordBatch.from_pydict(_output_columns(out), schema=OUTPUT_SCHEMA)

    return run


def _partitions(source, layer: str, options: dict) -> tuple[int, ...]:
    """The partitions of an input the query reads: those the plan names, else this instance's share
    of all of them (a user kafka source read by N instances), as `InstanceLoop` reads them."""
    if source.partitions:
        return source.partitions
    from sp_dagster.worker.spark import kafka_source, nats_source

    transport = (nats_source if layer == "sp-nats" else kafka_source).transport_from_options(options)
    try:
        count = transport.require_topic(source.topic).partitions
    finally:
        transport.close()
    return share_of(count, *(source.share or (1, 1)))


_HTTP_SINKS: dict[tuple, HttpSinks] = {}


def _delivered(plan: InstancePlan, out: list[Message], dead_letters: str | None) -> list[Message]:
    """The outputs once the HTTP requests among them are sent (or dead-lettered): a micro-batch
    commits only after its HTTP sends ended, as a continuous turn does. One client per process."""
    if not plan.http_outputs:
        return out
    sinks = _HTTP_SINKS.get((plan.name, plan.siddhi))
    if sinks is None:
        sinks = _HTTP_SINKS[(plan.name, plan.siddhi)] = HttpSinks(plan.http_outputs, plan.name)
    return sinks.deliver(out, dead_letters)


def build_query(spark, plan: InstancePlan, settings: QuerySettings):
    """The (not yet started) DataStreamWriter of one instance:

        sources (sp-kafka or Spark's Kafka connector, raw form, exactly the instance's partitions, unioned)
          -> the engine: transformWithStateInPandas keyed by the partition key (one engine per
             key; a constant key when the instance cannot be split by key), or mapInArrow when
             the partial app is stateless
          -> sink (sp-kafka, raw form: messages already encoded and routed by strategy); the
             user's HTTP sinks send their requests from the engine's task, before the batch commits

    The engine's state lives in Spark's state store (RocksDB) next to the offsets in the query's
    checkpoint, so a restarted query resumes exactly where its last committed batch ended."""
    from pyspark.sql import functions as F

    for place in (*plan.inputs, *plan.outputs):
        if place.nats is not None:
            raise InstancePlanError(f"{plan.name}: the nats @source/@sink of {place.stream} runs in continuous mode only; set spark.executionMode: continuous")
    for output in plan.outputs:
        if output.bootstrap and output.bootstrap != settings.bootstrap:
            raise InstancePlanError(f"{plan.name}: publishing {output.stream} to another Kafka cluster ({output.bootstrap}) is not supported yet")
    kafka = {f"kafka.{k}": v for k, v in settings.kafka_properties}
    # The cluster's own layer: sp-kafka (or Spark's connector), or sp-nats; other Kafka clusters: sp-kafka.
    own = {"format": "sp-nats", "cluster.id": settings.cluster_id or ""} if settings.messaging == "nats" else {"format": "sp-kafka", **kafka}
    native = settings.messaging == "kafka" and kafka_source_kind(spark, settings.kafka_source) == "native"
    frames = []
    for source in plan.inputs:
        properties = resolved_properties(source.properties, f"{plan.name}: optional.configuration")  # ${VAR}s from this node
        user = {f"kafka.{k}": v for k, v in properties}  # a user source's optional.configuration
        layer = {"format": "sp-kafka", **kafka, **user} if source.bootstrap or user else own
        options = {
            "bootstrap.servers": source.bootstrap or settings.bootstrap,
            "topic": source.topic,
            "format": "raw",
            **{k: v for k, v in layer.items() if k != "format"},
        }
        partitions = _partitions(source, layer["format"], options)
        if native:
            frames.append(
                read_native(
                    spark,
                    source.bootstrap or settings.bootstrap,
                    source.topic,
                    partitions,
                    kafka_properties=settings.kafka_properties + properties,
                    max_events=settings.max_events_per_trigger,
                    starting=settings.handover.start_at.get(source.topic),
                )
            )
            continue
        options["partitions"] = ",".join(map(str, partitions))
        options["pauseFlag"] = str(pause_flag(settings.checkpoint))
        if source.topic in settings.handover.start_at:
            options["startingOffsets"] = json.dumps({str(p): offset for p, offset in settings.handover.start_at[source.topic].items()})
        if settings.max_events_per_trigger:
            options["maxEventsPerTrigger"] = str(settings.max_events_per_trigger)
        frames.append(spark.readStream.format(layer["format"]).options(**options).load())
    frame = frames[0]
    for other in frames[1:]:
        frame = frame.unionByName(other)
    if plan.stateless:
        out = frame.mapInArrow(_stateless_function(plan, settings.dead_letter_topic), OUTPUT_DDL)
    else:
        key = F.coalesce(F.col("_key").cast("string"), F.lit("")) if plan.partition_key else F.lit("")
        timers = needs_wakeups(plan)
        indexed = bool(plan.partition_key and batched_inputs(plan))
        if indexed:  # grouped by each event's own key: batches cut first
            frame = frame.mapInArrow(_exploded(batched_inputs(plan)), EXPLODED_DDL)
        out = (
            frame.withColumn("_engine_key", key)
            .groupBy("_engine_key")
            .transformWithStateInPandas(
                statefulProcessor=_stateful_processor(plan, settings.dead_letter_topic, timers, indexed=indexed),
                outputStructType=OUTPUT_DDL,
                outputMode="Append",
                timeMode="ProcessingTime" if timers else "None",
                initialState=settings.handover.initial_state,
            )
        )
    return (
        out.writeStream.format(own["format"])
        .options(**{"bootstrap.servers": settings.bootstrap, **{k: v for k, v in own.items() if k != "format"}, "format": "raw"})
        .option("checkpointLocation", settings.checkpoint)
        .queryName(plan.name)
        .trigger(processingTime=settings.trigger_interval)
    )


def pause_flag(checkpoint: str | Path) -> Path:
    """The file whose presence has an instance's `sp-kafka`/`sp-nats` sources offer no new events (a stop between batches)."""
    return Path(checkpoint) / PAUSE_FILE


def start_query(spark, plan: InstancePlan, settings: QuerySettings):
    """Start the instance's streaming query; returns the StreamingQuery."""
    pause_flag(settings.checkpoint).unlink(missing_ok=True)  # left by a stop that did not end
    return build_query(spark, plan, settings).start()


class MicroBatchInstance:
    """The worker's handle on one instance run as a Structured Streaming query (micro-batch mode)."""

    mode = "microbatch"

    def __init__(self, query, pause: Path | None = None):
        self.query = query
        self.pause = pause
        self.totals = {"rows_in_total": 0, "rows_out_total": 0}
        self.last_batch = -1

    @property
    def active(self) -> bool:
        """True while the query runs."""
        return self.query.isActive

    @property
    def ready(self) -> bool:
        """True once the instance consumes its inputs (a started query does)."""
        return True

    def failure(self) -> str:
        """Why the query stopped."""
        error = self.query.exception()
        return str(error).splitlines()[0] if error else "the query stopped"

    def drain(self) -> None:
        """Process what its inputs hold before it stops (a rescale whose upstream is held: see deploy.rescale)."""
        try:
            self.query.processAllAvailable()
        except Exception as exc:  # a query that already failed: its checkpoint stands as it is
            log.warning("draining %s: %s", self.query.name, str(exc).splitlines()[0] if str(exc) else exc)

    def stop(self, *, save: bool, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the query (its checkpoint holds what a restart needs, whatever `save` says); with `save`, between two
        batches: its sources are paused and the batch under way ends first, so none of its outputs is written twice."""
        try:
            if save and self.pause is not None and self.query.isActive:
                self.pause.parent.mkdir(parents=True, exist_ok=True)
                self.pause.touch()
                deadline = time.monotonic() + timeout
                while self.query.status.get("isTriggerActive") and time.monotonic() < deadline:
                    time.sleep(0.05)
            self.query.stop()
        except Exception as exc:  # a query that already failed
            log.debug("stopping %s: %s", self.query.name, exc)
        finally:
            if self.pause is not None:
                self.pause.unlink(missing_ok=True)

    def metrics(self) -> dict:
        """Rows in/out (last batch and in total), batch duration and lag per partition."""
        query = self.query
        for batch in query.recentProgress:
            if batch.get("batchId", -1) > self.last_batch:
                self.last_batch = batch["batchId"]
                self.totals["rows_in_total"] += batch.get("numInputRows", 0) or 0
                self.totals["rows_out_total"] += max(0, (batch.get("sink") or {}).get("numOutputRows", 0) or 0)
        progress = query.lastProgress or {}
        lag = {}
        for source in progress.get("sources") or []:
            end, latest = source.get("endOffset"), source.get("latestOffset")
            if isinstance(end, str):
                end, latest = json.loads(end), json.loads(latest) if isinstance(latest, str) else latest
            if isinstance(end, dict) and isinstance(latest, dict):
                for partition, offset in latest.items():
                    lag[f"{source.get('description', '')}:{partition}"] = max(0, int(offset) - int(end.get(partition, 0)))
        sink = progress.get("sink") or {}
        batch_ms = (progress.get("durationMs") or {}).get("triggerExecution")
        return {
            "mode": self.mode,
            "batch": progress.get("batchId"),
            "rows_in": progress.get("numInputRows", 0),
            "rows_per_s": round(progress.get("processedRowsPerSecond", 0.0) or 0.0, 1),
            "busy": _busy(progress),
            "rows_out": sink.get("numOutputRows", -1),
            "batch_ms": batch_ms,
            "latency_ms_p50": batch_ms,  # an event waits for its whole micro-batch
            "lag": sum(lag.values()),
            "lag_by_partition": lag,
            **self.totals,
        }


def _busy(progress: dict) -> float | None:
    """The fraction of wall time the query spends running batches: events in per second over events
    processed per second (a batch's rows over the time since the last one, over the same rows over its duration)."""
    arriving, processed = progress.get("inputRowsPerSecond") or 0.0, progress.get("processedRowsPerSecond") or 0.0
    return round(min(1.0, arriving / processed), 3) if processed > 0 else None
