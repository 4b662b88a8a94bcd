"""Events in and out at the edges, on the real broker with real HTTP servers: a receiver partial
app behind an HTTP endpoint (basic auth, 400 for undecodable events, 200 once durable), seed 004's
partitioned HTTP sink over two servers, user kafka sources read by several instances, kafka sinks
with destinations and keys. Loops run in threads (`test_continuous.Running`); the same loops run as
Spark tasks on workers."""

from __future__ import annotations

import json
import uuid

import pytest
import requests

from sp_dagster.embedded.broker import free_port
from sp_dagster.messaging import EARLIEST
from sp_dagster.messaging.codecs import RawCodec
from sp_dagster.worker.instance.loop import LoopSettings
from sp_dagster.worker.instance.plan import plan_instance
from sp_dagster.worker.instance.sinks import java_hash_destination
from sp_dagster.worker.receivers.http import HostedReceiver
from tests.fixtures.http import Collector
from tests.fixtures.loops import Running, deploy_topics
from tests.fixtures.waiting import wait_until

pytestmark = [pytest.mark.broker, pytest.mark.slow]


SEED_004 = """@App:name('{name}')
@source(type='http', receiver.url='http://127.0.0.1:{port}/requests', basic.auth.enabled='true', @map(type='json'))
define stream RequestIn (meta_clientType string, apiName string, username string, userTenantDomain string, responseTime long);

// seed 004's distributed sink, repaired: its @destination lines and closing brackets were lost
@sink(type = 'http', method = 'POST', headers = "'X-From:sp-dagster'",
      @map(type = 'json'),
      @distribution(strategy = 'partitioned', partitionKey = 'userTenantDomain',
          @destination(publisher.url = 'http://127.0.0.1:{p1}/stateful'),
          @destination(publisher.url = 'http://127.0.0.1:{p2}/stateful')))
define stream Request (meta_clientType string, apiName string, username string, userTenantDomain string, responseTime long);

@dist(execGroup = 'partitioning', parallel = '2')
from RequestIn[responseTime >= 0]
select *
insert into Request;
"""


def test_seed_004_http_in_partitioned_http_out(kafka):
    name = f"Seed004x{uuid.uuid4().hex[:6]}"
    port, one, two = free_port(), Collector(fail_first=2), Collector()
    topology = deploy_topics(kafka, SEED_004.format(name=name, port=port, p1=one.port, p2=two.port))
    receiver_group, work = topology.groups
    assert receiver_group.receiver and not work.receiver
    settings = LoopSettings(None, metrics_interval_s=0.2, idle_wait_s=0.05)
    receiver = HostedReceiver(plan_instance(*_named(receiver_group.instances[0])), kafka, settings, users={"ops": "s3cret"}).start()
    workers = [Running(kafka, plan_instance(*_named(i)), dead_letters=f"{name}.deadletter") for i in work.instances]
    try:
        url = f"http://127.0.0.1:{port}/requests"
        assert _up(url), "the receiver listens once started"
        auth = ("ops", "s3cret")
        assert requests.post(url, json={"event": {}}).status_code == 401
        assert requests.post(url, json={"event": {}}, auth=("ops", "wrong")).status_code == 401
        bad = requests.post(url, data=b'{"event": {"apiName": 1}}', auth=auth)
        assert bad.status_code == 400 and "missing attribute" in bad.text
        tenants = ["foo.com", "bar.com", "baz.org", "qux.io", "carbon.super"]
        sent = []
        for n in range(60):
            event = {"meta_clientType": "web", "apiName": f"api{n % 3}", "username": f"u{n}", "userTenantDomain": tenants[n % 5], "responseTime": n}
            answer = requests.post(url, json={"event": event}, auth=auth)
            assert answer.status_code == 200, answer.text
            sent.append(event)
        # a worker dies mid-stream (no checkpoint saved): a new owner replays, nothing is lost
        workers[0].line.lease = False
        workers[0].thread.join(30)
        checkpoint = workers[0].line.checkpoints[-1] if workers[0].line.checkpoints else None
        workers[0] = Running(kafka, workers[0].loop.plan, checkpoint=checkpoint, dead_letters=f"{name}.deadletter")
        for n in range(60, 100):
            event = {"meta_clientType": "app", "apiName": "late", "username": f"u{n}", "userTenantDomain": tenants[n % 5], "responseTime": n}
            assert requests.post(url, json={"event": event}, auth=auth).status_code == 200
            sent.append(event)
        wait_until(lambda: len({e["username"] for e in one.events() + two.events()}) == len(sent), timeout=60, what="every event at a destination")
        for index, collector in enumerate((one, two)):
            for event in collector.events():
                assert java_hash_destination(event["userTenantDomain"], 2) == index, event
        assert {e["username"] for e in one.events()} | {e["username"] for e in two.events()} == {e["username"] for e in sent}
        assert one.events() and two.events()
        assert all(h.get("X-From") == "sp-dagster" for h in one.headers + two.headers)
        wait_until(lambda: receiver.metrics().get("accepted_total") == len(sent), timeout=60, what="the receiver's metrics")
        assert receiver.metrics()["receiver_urls"] == [url] and receiver.metrics()["refused_total"] == 3
        with pytest.raises(OSError):  # the port is taken: the instance fails to start, and says why
            HostedReceiver(receiver.loop.plan, kafka, settings).start()
    finally:
        receiver.stop()
        for running in workers:
            running.stop(save=False)


def _named(instance):
    return instance.name, instance.siddhi


def _up(url):
    try:
        requests.get(url, timeout=1)
        return True
    except requests.ConnectionError:
        return False


def test_user_kafka_source_on_four_partitions_with_parallel_two(kafka):
    name = f"Src{uuid.uuid4().hex[:6]}"
    topic = f"{name}-in"
    kafka.ensure_topic(topic, 4)
    text = f"""@App:name('{name}')
@source(type='kafka', topic.list='{topic}', group.id='readers', @map(type='csv'), @dist(parallel='2'))
define stream In (k string, v int);
@sink(type='kafka', topic='{name}-out', key='{{{{k}}}}', @map(type='text'))
define stream Out (k string, v int);
@dist(execGroup='work', parallel='1') from In select k, v insert into Out;
"""
    topology = deploy_topics(kafka, text)
    passthrough = topology.groups[0]
    shares = [plan_instance(i.name, i.siddhi).inputs[0].share for i in passthrough.instances]
    assert shares == [(1, 2), (2, 2)]
    publisher = kafka.raw_publisher()
    for n in range(40):
        publisher.produce(topic, f"k{n},{n}".encode(), None, n % 4, None)
    publisher.flush()
    loops = [Running(kafka, plan_instance(i.name, i.siddhi)) for g in topology.groups for i in g.instances]
    try:
        reader = kafka.reader(f"{name}-out", {p: EARLIEST for p in range(kafka.require_topic(f"{name}-out").partitions)}, RawCodec())
        got = []
        wait_until(lambda: got.extend(reader.poll(1000, 0.5).events) or len(got) >= 40, timeout=60, what="40 events out")
        values = sorted(int(e.row[0].decode().split("v:")[1]) for e in got)
        assert values == list(range(40))
        assert {e.key for e in got} == {f"k{n}".encode() for n in range(40)}
        read = [set(p for (_t, p) in r.loop.positions) for r in loops[:2]]
        assert read == [{0, 2}, {1, 3}]
    finally:
        for running in loops:
            running.stop(save=False)


def test_kafka_sink_destinations_by_topic_and_partition(kafka):
    name = f"Dst{uuid.uuid4().hex[:6]}"
    text = f"""@App:name('{name}')
define stream In (k string, v int);
@sink(type='kafka', @map(type='json'), @distribution(strategy='partitioned', partitionKey='k',
      @destination(topic='{name}-a'), @destination(topic='{name}-b')))
define stream ByTopic (k string, v int);
@sink(type='kafka', topic='{name}-p', @map(type='xml'), @distribution(strategy='roundRobin',
      @destination(partition.no='0'), @destination(partition.no='2')))
define stream ByPartition (k string, v int);
from In select k, v insert into ByTopic;
from In select k, v insert into ByPartition;
"""
    topology = deploy_topics(kafka, text)
    sizes = {t.name: t.partitions for t in topology.topics}
    assert sizes[f"{name}-a"] == 1 and sizes[f"{name}-b"] == 1 and sizes[f"{name}-p"] == 3
    (instance,) = topology.partial_apps
    loop = Running(kafka, plan_instance(instance.name, instance.siddhi))
    try:
        entry = next(t.name for t in topology.topics if t.role == "entry")
        publisher = kafka.raw_publisher()
        for n in range(10):
            publisher.produce(entry, json.dumps({"event": {"k": f"key{n}", "v": n}}).encode(), None, 0, None)
        publisher.flush()
        readers = {suffix: kafka.reader(f"{name}-{suffix}", {0: EARLIEST}, RawCodec()) for suffix in "ab"}
        by_topic = {"a": [], "b": []}

        def poll():
            for suffix, reader in readers.items():
                by_topic[suffix] += [json.loads(e.row[0])["event"]["k"] for e in reader.poll(100, 0.2).events]
            return len(by_topic["a"]) + len(by_topic["b"]) >= 10

        wait_until(poll, timeout=60, what="events at both topics")
        assert sorted(by_topic["a"] + by_topic["b"]) == sorted(f"key{n}" for n in range(10))
        for index, suffix in enumerate("ab"):
            assert all(java_hash_destination(k, 2) == index for k in by_topic[suffix])
        reader = kafka.reader(f"{name}-p", {p: EARLIEST for p in range(3)}, RawCodec())
        got = []
        wait_until(lambda: got.extend(reader.poll(100, 0.3).events) or len(got) >= 10, timeout=60, what="partitioned events")
        assert sorted({e.partition for e in got}) == [0, 2]
        assert all(e.row[0].startswith(b"<events><event>") for e in got)
    finally:
        loop.stop(save=False)


def test_micro_batch_queries_run_user_maps_and_http_sinks(spark, kafka, broker, tmp_path):
    from sp_dagster.worker.spark.microbatch import QuerySettings, start_query

    name = f"Mb{uuid.uuid4().hex[:6]}"
    topic = f"{name}-in"
    kafka.ensure_topic(topic, 4)
    one, two = Collector(fail_first=1), Collector()
    text = f"""@App:name('{name}')
@source(type='kafka', topic.list='{topic}', group.id='readers', @map(type='csv', @attributes(v='1', k='0')), @dist(parallel='2'))
define stream In (k string, v int);
@sink(type='http', @map(type='json', enclosing.element='$.reading'),
      @distribution(strategy='partitioned', partitionKey='k',
          @destination(publisher.url='http://127.0.0.1:{one.port}/a'), @destination(publisher.url='http://127.0.0.1:{two.port}/b')))
define stream Out (k string, v int);
@dist(execGroup='work', parallel='1') from In[v >= 0] select k, v insert into Out;
"""
    topology = deploy_topics(kafka, text)
    publisher = kafka.raw_publisher()
    for n in range(40):
        publisher.produce(topic, f"k{n % 7},{n}".encode(), None, n % 4, None)
    publisher.produce(topic, b"k1,not-a-number", None, 3, None)
    publisher.flush()
    dead = f"{name}.deadletter"
    kafka.ensure_topic(dead, 1)
    queries = []
    try:
        for index, instance in enumerate(i for g in topology.groups for i in g.instances):
            settings = QuerySettings(broker.bootstrap_servers, str(tmp_path / f"ck{index}"), dead, trigger_interval="200 milliseconds")
            queries.append(start_query(spark, plan_instance(instance.name, instance.siddhi), settings))
        for query in queries:  # upstream first: each reads everything its predecessors wrote
            query.processAllAvailable()
        got = [json.loads(b)["reading"]["event"] for b in one.bodies + two.bodies]
        assert sorted(e["v"] for e in got) == list(range(40))  # the four partitions, read by the two instances
        for index, collector in enumerate((one, two)):
            keys = {json.loads(b)["reading"]["event"]["k"] for b in collector.bodies}
            assert keys and all(java_hash_destination(k, 2) == index for k in keys)
        reader = kafka.reader(dead, {0: EARLIEST}, RawCodec())
        letters = []
        wait_until(lambda: letters.extend(reader.poll(10, 0.5).events) or letters, timeout=60, what="the dead letter")
        assert b"not-a-number" in letters[0].row[0]
    finally:
        for query in queries:
            query.stop()
