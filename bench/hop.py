"""CPU per event of each hop of a two-group app in process, beside its engine alone: the worker's own cost.

Run: python bench/hop.py [--events N] [--turn T] [--repeats R]
The app is the pipeline benchmark's (tests/worker/apps/trades.siddhi: a parallel filter, then a
keyed length-window average to a JSON sink). Its first instance of each group runs as a worker
runs it, without a broker: JSON input decoded, the engine, outputs encoded and packed into
inter-group batches (`pack`), cut again (`expand`), the second group, its JSON outputs. The peer
is the engine alone: the same partial apps fed the same rows already decoded, one `send_each`
per turn. One JSON line: microseconds of CPU per event per stage (best of the repeats), the
engine's, and their ratio (how many times the engine's cost a worker pays per hop).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from sp_dagster.deploy import load_app, plan_app
from sp_dagster.engine import AppRuntime
from sp_dagster.engine.clock import DrivenClock
from sp_dagster.messaging import codec_for
from sp_dagster.siddhi import parse
from sp_dagster.worker.instance.batching import batched_inputs, batched_outputs, expand, pack
from sp_dagster.worker.instance.plan import plan_instance
from sp_dagster.worker.instance.runtime import InstanceRuntime, Message

APP = Path(__file__).resolve().parent.parent / "tests" / "worker" / "apps" / "trades.siddhi"
T0 = 1_700_000_000_000


def workload(events: int) -> list[tuple]:
    """Trades of 20 symbols, every one passing the filter."""
    return [(f"S{i % 20}", 100.0 + i % 50, 10 + i % 7) for i in range(events)]


def instance(group: str):
    """The first instance of one of the app's groups."""
    found = plan_app(load_app(APP)).group(group)
    assert found is not None, group
    return found.instances[0]


def hops(events: int, turn: int) -> dict[str, float]:
    """CPU seconds per stage for `events` through both groups' first instances, `turn` messages a turn."""
    first, second = instance("filter"), instance("average")
    front, back = plan_instance(first.name, first.siddhi), plan_instance(second.name, second.siddhi)
    (entry,) = front.inputs
    codec = codec_for(entry.codec, entry.attributes)
    rows = workload(events)
    messages = [Message(entry.topic, 0, i, T0 + i, None, codec.encode(row)) for i, row in enumerate(rows)]
    filters, averages = InstanceRuntime(front, now=T0, partitions_of=lambda _t: 2), InstanceRuntime(back, now=T0, partitions_of=lambda _t: 2)
    batched, middle = batched_outputs(front), front.outputs[0].topic
    reading = batched_inputs(back)[middle]
    spent: dict[str, float] = dict.fromkeys(("filter", "pack", "expand", "average"), 0.0)
    offset = 0
    for start in range(0, events, turn):
        chunk = messages[start : start + turn]
        now = chunk[-1].timestamp
        t0 = time.process_time()
        out = filters.process(chunk, now)
        t1 = time.process_time()
        out = pack(out, batched)
        t2 = time.process_time()
        read = []
        for partition in sorted({m.partition for m in out}):
            raws = [(m.partition, offset + n, m.timestamp, m.key, m.value, m.origin) for n, m in enumerate(out) if m.partition == partition]
            offset += len(raws)
            read += expand(middle, raws, reading)
        t3 = time.process_time()
        averages.process(read, now)
        t4 = time.process_time()
        for stage, seconds in zip(spent, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            spent[stage] += seconds
    filters.close()
    averages.close()
    return spent


def engines(events: int, turn: int) -> float:
    """CPU seconds of both groups' engines alone: the same rows, decoded, one send_each per turn."""
    rows = workload(events)
    spent = 0.0
    stamps = [T0 + i for i in range(events)]
    for group, stream in (("filter", "TradeStream"), ("average", "BigTradeStream")):
        partial = instance(group)
        engine = AppRuntime(parse(partial.siddhi, partial.name), clock=DrivenClock(T0))
        t0 = time.process_time()
        for start in range(0, events, turn):
            engine.send_each(stream, rows[start : start + turn], stamps[start : start + turn])
        spent += time.process_time() - t0
        engine.shutdown()
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--turn", type=int, default=1_000, help="messages a turn (a worker's poll)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each; the best counts")
    args = parser.parse_args()
    best: dict[str, float] = {}
    engine = min(engines(args.events, args.turn) for _ in range(args.repeats))
    for _ in range(args.repeats):
        for stage, seconds in hops(args.events, args.turn).items():
            best[stage] = min(best.get(stage, seconds), seconds)
    per_event = {stage: round(seconds / args.events * 1e6, 2) for stage, seconds in best.items()}
    total, engine_us = sum(best.values()) / args.events * 1e6, engine / args.events * 1e6
    figure = {
        "bench": "hop",
        "events": args.events,
        "turn": args.turn,
        "us_per_event": per_event,
        "us_per_event_per_hop": round(total / 2, 2),
        "engine_us_per_event_per_hop": round(engine_us / 2, 2),
        "vs_engine": round(total / engine_us, 2),
        "load_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(figure), flush=True)


if __name__ == "__main__":
    main()
