"""Events cross execution groups in batches: what one turn publishes to a partition is one message, read back event by event."""

from __future__ import annotations

import json
import random

from sp_dagster.messaging import batches, codec_for
from sp_dagster.messaging.codecs import BinaryCodec
from sp_dagster.siddhi import parse
from sp_dagster.topology import plan
from sp_dagster.worker.instance.batching import batched_inputs, batched_outputs, expand, pack
from sp_dagster.worker.instance.plan import plan_instance
from sp_dagster.worker.instance.runtime import InstanceRuntime, Message

APP = """@App:name('Trades')
define stream TradeStream (symbol string, price double, volume long);
@sink(type = 'kafka', topic = 'Trades.Averages', @map(type = 'json'))
define stream AverageStream (symbol string, avgPrice double, total long);
@dist(execGroup = 'filter', parallel = '2')
from TradeStream[volume >= 20] select symbol, price, volume insert into BigTradeStream;
@dist(execGroup = 'average', parallel = '2')
partition with (symbol of BigTradeStream)
begin
    from BigTradeStream#window.length(3) select symbol, avg(price) as avgPrice, sum(volume) as total insert into AverageStream;
end;
"""


def _instances():
    topology = plan(parse(APP))
    return [plan_instance(g.instances[0].name, g.instances[0].siddhi) for g in (topology.group("filter"), topology.group("average"))]


def _trades(count: int, topic: str, codec) -> list[Message]:
    rng = random.Random(11)
    rows = [(rng.choice(["IBM", "WSO2", "ORCL", "MSFT", "AAPL"]), float(rng.randint(1, 99)), rng.randint(1, 40)) for _ in range(count)]
    return [Message(topic, n % 2, n // 2, 1_000 + n, None, codec.encode(row)) for n, row in enumerate(rows)]


def _as_read(published: list[Message], topic: str, first_offset: int = 0) -> list[Message]:
    """Messages as a reader of `topic` gets them: each published one at the next offset of its partition."""
    offsets: dict[int, int] = {}
    raws: dict[int, list] = {}
    for m in published:
        if m.topic != topic:
            continue
        offset = offsets[m.partition] = offsets.get(m.partition, first_offset - 1) + 1
        raws.setdefault(m.partition, []).append((m.partition, offset, m.timestamp, m.key, m.value, m.origin))
    return [message for partition in sorted(raws) for message in expand(topic, raws[partition], BinaryCodec(_instances()[1].inputs[0].attributes))]


def test_only_inter_group_topics_carry_batches():
    filter_, average = _instances()
    assert set(batched_outputs(filter_)) == {filter_.outputs[0].topic} == set(batched_inputs(average))
    assert batched_outputs(average) == {}  # the user's json sink: one event per message


def test_a_turn_is_one_message_per_partition_and_reads_back_event_by_event():
    filter_, _average = _instances()
    source, output = filter_.inputs[0], filter_.outputs[0]
    out = InstanceRuntime(filter_).process(_trades(300, source.topic, codec_for(source.codec, source.attributes)), 10_000)
    packed = pack(out, batched_outputs(filter_))
    assert len(out) > 100
    assert sorted((m.topic, m.partition) for m in packed) == [(output.topic, p) for p in sorted({m.partition for m in out})]
    assert all(m.origin is None and batches.is_batch(m.value) for m in packed)
    read = _as_read(packed, output.topic, first_offset=40)
    assert [m[:2] + m[3:7] for m in read] == [m[:2] + m[3:7] for p in sorted({m.partition for m in out}) for m in out if m.partition == p]
    assert {m.offset for m in read} == {40} and [m.index for m in read if m.partition == read[0].partition][:3] == [0, 1, 2]


def test_the_next_group_gives_what_one_message_per_event_gives_and_drops_a_replayed_batch():
    filter_, average = _instances()
    source, topic = filter_.inputs[0], filter_.outputs[0].topic
    out = InstanceRuntime(filter_).process(_trades(400, source.topic, codec_for(source.codec, source.attributes)), 10_000)
    one_by_one = InstanceRuntime(average).process(_as_read(out, topic), 10_000)
    in_batches = InstanceRuntime(average)
    packed = pack(out, batched_outputs(filter_), max_bytes=1_500)  # several batches per partition
    got = in_batches.process(_as_read(packed, topic), 10_000)
    assert len(got) > 100 and [m.value for m in got] == [m.value for m in one_by_one]
    assert len({m.origin for m in got}) == len(got)  # each event of a batch names its outputs apart
    assert in_batches.process(_as_read(packed, topic, first_offset=500), 10_000) == []  # the upstream published again
    assert in_batches.duplicates == len(out)


def test_single_event_messages_and_bad_batches_on_a_batched_topic():
    filter_, average = _instances()
    topic, codec = filter_.outputs[0].topic, BinaryCodec(average.inputs[0].attributes)
    single = (0, 3, 1_000, b"IBM", codec.encode(("IBM", 50.0, 30)), b"Trades-filter>x:0|1.1")  # as published before batches
    broken = (0, 4, 1_001, None, batches.encode([1_001], [None], [b"o|1"], [codec.encode(("IBM", 60.0, 30))])[:-2], None)
    runtime = InstanceRuntime(average, "Trades.dead")
    out = runtime.process(expand(topic, [single, broken], codec), 10_000)
    assert sorted(m.topic for m in out) == ["Trades.Averages", "Trades.dead"]
    (dead,) = [m for m in out if m.topic == "Trades.dead"]
    assert json.loads(dead.value)["offset"] == 4 and runtime.rejected == 1
