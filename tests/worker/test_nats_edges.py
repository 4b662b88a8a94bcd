"""User `@source(type='nats')` and `@sink(type='nats')` (siddhi-io-nats's options) run by instance loops
against a real nats-server: on a Kafka cluster (a NATS connection of their own) and on a NATS
cluster (its own server and clusterId when they name none)."""

from __future__ import annotations

import json
import uuid

import pytest

from sp_dagster.messaging import EARLIEST
from sp_dagster.messaging.codecs import RawCodec
from sp_dagster.messaging.nats import NatsTransport
from sp_dagster.worker.instance.plan import NatsEndpoint, plan_instance
from sp_dagster.worker.instance.sinks import java_hash_destination
from tests.fixtures.loops import Running, deploy_topics
from tests.fixtures.waiting import wait_until

pytestmark = [pytest.mark.nats]


def test_a_nats_endpoint_falls_back_to_the_clusters_nats_then_to_siddhi_io_nats_defaults():
    assert NatsEndpoint().resolve("nats://own:4222", "own") == ("nats://own:4222", "own")
    assert NatsEndpoint(cluster_id="c").resolve("nats://own:4222", "own") == ("nats://own:4222", "c")
    assert NatsEndpoint("nats://x:1").resolve("nats://own:4222", "own") == ("nats://x:1", "test-cluster")
    assert NatsEndpoint().resolve(None, None) == ("nats://localhost:4222", "test-cluster")


def _read(transport, topic, count):
    partitions = transport.require_topic(topic).partitions
    reader = transport.reader(topic, {p: EARLIEST for p in range(partitions)}, RawCodec())
    got = []
    try:
        wait_until(lambda: got.extend(reader.poll(1000, 0.3).events) or len(got) >= count, timeout=60, what=f"{count} events on {topic}")
    finally:
        reader.close()
    return got


@pytest.mark.broker
def test_user_nats_source_and_sink_on_a_kafka_cluster(kafka, nats_server):
    name = f"Nats{uuid.uuid4().hex[:6]}"
    cluster = f"user-{uuid.uuid4().hex[:6]}"
    user = NatsTransport(nats_server.url, cluster, timeout=15)
    user.ensure_topic(f"{name}.in", 4)
    text = f"""@App:name('{name}')
@source(type='nats', destination='{name}.in', bootstrap.servers='{nats_server.url}', cluster.id='{cluster}', client.id='sp',
        @map(type='csv'), @dist(parallel='2'))
define stream In (k string, v int);
@sink(type='nats', bootstrap.servers='{nats_server.url}', cluster.id='{cluster}', @map(type='json'),
      @distribution(strategy='partitioned', partitionKey='k', @destination(destination='{name}.a'), @destination(destination='{name}.b')))
define stream Out (k string, v int);
@dist(execGroup='work', parallel='1') from In select k, v insert into Out;
"""
    topology = deploy_topics(kafka, text)
    assert not any(t.name.startswith(f"{name}.in") for t in topology.topics)  # nothing of the user's NATS lands on Kafka
    publisher = user.raw_publisher()
    for n in range(40):
        publisher.produce(f"{name}.in", f"k{n},{n}".encode(), None, n % 4, None)
    publisher.flush()
    loops = [Running(kafka, plan_instance(i.name, i.siddhi)) for g in topology.groups for i in g.instances]
    readers = {}
    try:
        wait_until(lambda: all(user.topic_info(f"{name}.{s}") for s in "ab"), timeout=60, what="the sink to make its topics")
        readers.update({suffix: user.reader(f"{name}.{suffix}", {0: EARLIEST}, RawCodec()) for suffix in "ab"})
        got = {suffix: [] for suffix in "ab"}

        def poll():
            failed = [r.error for r in loops if r.error is not None]
            assert not failed, f"an instance loop failed: {failed!r}"  # at once, not after the wait's minute
            for suffix, reader in readers.items():
                got[suffix] += [json.loads(e.row[0])["event"] for e in reader.poll(1000, 0.2).events]
            return len(got["a"]) + len(got["b"]) >= 40

        wait_until(poll, timeout=60, what="40 events out")
        assert sorted(e["v"] for e in got["a"] + got["b"]) == list(range(40))
        for index, suffix in enumerate("ab"):
            assert all(java_hash_destination(e["k"], 2) == index for e in got[suffix])
        assert [sorted({p for (_t, p) in r.loop.positions}) for r in loops[:2]] == [[0, 2], [1, 3]]
        assert all(r.error is None for r in loops)
    finally:
        for running in loops:
            running.stop(save=False)
        for reader in readers.values():
            reader.close()
        user.close()


def test_user_nats_source_and_sink_on_a_nats_cluster_use_its_server_and_start_at_subscription_sequence(nats):
    name = f"Own{uuid.uuid4().hex[:6]}"
    nats.ensure_topic(f"{name}-in", 1)
    publisher = nats.raw_publisher()
    for n in range(5):
        publisher.produce(f"{name}-in", json.dumps({"event": {"k": f"k{n}", "v": n}}).encode(), None, 0, None)
    publisher.flush()
    third = nats.end_offsets(f"{name}-in")[0] - 3  # the sequence of the third event
    text = f"""@App:name('{name}')
@source(type='nats', destination='{name}-in', subscription.sequence='{third}', @map(type='json'))
define stream In (k string, v int);
@sink(type='nats', destination='{name}-out', @map(type='json'))
define stream Out (k string, v int);
from In[v >= 0] select k, v insert into Out;
"""
    (instance,) = deploy_topics(nats, text).partial_apps
    running = Running(nats, plan_instance(instance.name, instance.siddhi))
    try:
        wait_until(lambda: nats.topic_info(f"{name}-out") is not None, timeout=60, what="the sink's topic")
        publisher.produce(f"{name}-in", json.dumps({"event": {"k": "late", "v": 5}}).encode(), None, 0, None)
        publisher.flush()
        got = [json.loads(e.row[0])["event"]["v"] for e in _read(nats, f"{name}-out", 4)]
        assert sorted(got) == [2, 3, 4, 5]
        assert running.loop.connections.others == {} and running.error is None  # the cluster's own connection, no other
    finally:
        running.stop(save=False)
        publisher.close()


def test_micro_batch_mode_refuses_user_nats_sources_and_sinks_clearly():
    from sp_dagster.worker.instance.plan import InstancePlanError
    from sp_dagster.worker.spark.microbatch import QuerySettings, build_query

    text = "@App:name('Mb')\n@source(type='nats', destination='in')\ndefine stream In (k string);\nfrom In select k insert into Out;\n"
    plan = plan_instance("Mb-1", text)
    with pytest.raises(InstancePlanError, match="nats @source/@sink of In runs in continuous mode only; set spark.executionMode: continuous"):
        build_query(None, plan, QuerySettings("localhost:9092", "/nowhere"))


@pytest.mark.slow
def test_an_unreachable_user_nats_server_is_named_with_the_option_to_fix(nats):
    from sp_dagster.embedded import free_port
    from sp_dagster.errors import BrokerUnavailable
    from sp_dagster.worker.instance.loop import InstanceLoop, LoopSettings
    from tests.fixtures.loops import Line

    address = f"nats://127.0.0.1:{free_port()}"
    text = f"@App:name('Gone')\n@source(type='nats', destination='in', bootstrap.servers='{address}')\ndefine stream In (k string);\nfrom In select k insert into Out;\n"
    loop = InstanceLoop(plan_instance("Gone-1", text), nats, LoopSettings(), checkpoint=None, control=Line())
    with pytest.raises(BrokerUnavailable, match=rf"cannot reach the NATS server at {address} .*fix bootstrap.servers of the nats @source/@sink in Gone-1$"):
        loop.run()


def test_user_nats_sinks_are_not_shown_as_cluster_topics():
    from sp_dagster.orchestration.assets import _user_sinks

    text = (
        "@App:name('As')\n@source(type='kafka', topic.list='i')\ndefine stream In (k string);\n"
        "@sink(type='nats', destination='n')\n@sink(type='kafka', topic='k')\ndefine stream Out (k string);\nfrom In select k insert into Out;\n"
    )
    assert _user_sinks({"instances": [{"name": "As-1", "siddhi": text}], "outputs": {}}) == [{"topic": "k", "partitions": 0}]
