"""One HTTP receiver on the real broker: group commit (requests that arrive while a batch is being
made durable are published together and answered together, each with its own answer), no 200
before the broker acknowledged, 400 for an undecodable request without losing the others, 401
with the credentials never logged, 503 when publishing fails or the receiver stops.

The receiver's publisher is wrapped so that a test can hold a batch's flush (the real flush runs
once released): what a client sees meanwhile is what it would see while the broker is slow."""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import logging
import threading
import uuid
from pathlib import Path

import pytest
import requests

from sp_dagster.embedded.broker import free_port
from sp_dagster.errors import MessagingError
from sp_dagster.messaging import EARLIEST
from sp_dagster.messaging.codecs import BinaryCodec, RawCodec
from sp_dagster.worker.instance.batching import expand
from sp_dagster.worker.instance.loop import LoopSettings
from sp_dagster.worker.instance.plan import plan_instance
from sp_dagster.worker.instance.runtime import ORIGIN_HEADER, Message
from sp_dagster.worker.receivers.http import MAX_BODY, HostedReceiver
from tests.fixtures.loops import deploy_topics
from tests.fixtures.waiting import wait_until

pytestmark = [pytest.mark.broker]

USERS = {"ops": "s3cret-pass", "bench": "other:pass"}
APP = """@App:name('{name}')
@source(type='http', receiver.url='http://127.0.0.1:{port}/readings', basic.auth.enabled='true', @map(type='json'))
define stream Readings (deviceID string, power int);
@dist(execGroup='work') from Readings[power > 0] select * insert into Kept;
"""


class HeldPublisher:
    """The receiver's real publisher, whose flush waits until released (and can be made to fail)."""

    def __init__(self, publisher):
        self.publisher = publisher
        self.released = threading.Event()
        self.released.set()
        self.flushing = threading.Event()  # a flush has started (and waits for `released`)
        self.fail: str | None = None
        self.produced = 0

    def produce_all(self, records, header: str = "") -> None:
        records = list(records)
        self.produced += len(records)
        self.publisher.produce_all(records, header)

    @property
    def max_message_bytes(self) -> int:
        return self.publisher.max_message_bytes

    def too_large(self, size: int, topic: str):
        return self.publisher.too_large(size, topic)

    def flush(self, timeout: float = 30.0) -> None:
        self.flushing.set()
        self.released.wait(60)
        self.flushing.clear()
        if self.fail:
            raise MessagingError(self.fail)
        self.publisher.flush(timeout)

    def close(self) -> None:
        self.publisher.close()


class Receiver:
    """A receiver instance hosted on threads, with its entry topic read back."""

    def __init__(self, kafka):
        self.kafka = kafka
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/readings"
        topology = deploy_topics(kafka, APP.format(name=f"Recv{uuid.uuid4().hex[:6]}", port=self.port))
        instance = next(i for g in topology.groups if g.receiver for i in g.instances)
        self.plan = plan_instance(instance.name, instance.siddhi)
        settings = LoopSettings(None, metrics_interval_s=0.1, idle_wait_s=0.05, flush_timeout_s=30)
        self.hosted = HostedReceiver(self.plan, kafka, settings, users=USERS).start()
        self.loop = self.hosted.loop
        self.publisher = self.loop.publisher = HeldPublisher(self.loop.publisher)
        self.output = self.plan.outputs[0]
        self.reader = kafka.reader(self.output.topic, {p: EARLIEST for p in range(kafka.require_topic(self.output.topic).partitions)}, RawCodec())
        self.codec = BinaryCodec(self.output.attributes)  # the entry topic is an inter-group one
        self.pool = concurrent.futures.ThreadPoolExecutor(16)

    def post(self, data, auth=("ops", "s3cret-pass"), **kwargs):
        return requests.post(self.url, data=data, auth=auth, timeout=60, **kwargs)

    def post_later(self, data, **kwargs) -> concurrent.futures.Future:
        return self.pool.submit(self.post, data, **kwargs)

    def in_topic(self, at_least: int) -> list[tuple]:
        """(row, origin) of every event in the entry topic once there are `at_least`, then a little more."""
        got: list[Message] = []

        def more():
            got.extend(expand(self.output.topic, self.reader.poll_raw(1000, 0.2, ORIGIN_HEADER), self.codec))
            return len(got) >= at_least

        wait_until(more, timeout=60, what=f"{at_least} events in the entry topic")
        got.extend(expand(self.output.topic, self.reader.poll_raw(1000, 0.5, ORIGIN_HEADER), self.codec))  # nothing more should come
        return [(m.value, m.origin) for m in got]  # rows: the receiver publishes batches by column

    def close(self):
        self.publisher.released.set()
        self.hosted.stop()
        self.reader.close()
        self.pool.shutdown(wait=False, cancel_futures=True)


@pytest.fixture
def receiver(kafka):
    running = Receiver(kafka)
    yield running
    running.close()


def event(device: str, power: int) -> bytes:
    return f'{{"event": {{"deviceID": "{device}", "power": {power}}}}}'.encode()


def test_requests_waiting_for_a_flush_are_published_as_one_batch_and_answered_once_durable(receiver):
    held = receiver.publisher
    assert receiver.post(event("first", 1)).status_code == 200
    batches = receiver.loop.batches
    held.released.clear()
    blocked = receiver.post_later(event("a", 1))
    assert held.flushing.wait(30), "the first request's batch is being flushed"
    # While that flush waits, more requests arrive: one does not decode, the others wait for the next batch.
    later = [receiver.post_later(event(f"b{n}", n + 1)) for n in range(8)]
    bad = receiver.post(b'{"event": {"deviceID": "x", "power": "many"}}')
    assert bad.status_code == 400 and "does not decode" in bad.text, bad.text
    wait_until(lambda: receiver.loop.waiting == 8, timeout=60, what="eight requests waiting for the next batch")
    # Nothing is answered before the broker acknowledged: the flush still waits.
    assert not blocked.done() and not any(f.done() for f in later)
    assert receiver.publisher.produced == 2  # the first request's event and the held batch's: the waiting ones are not produced yet
    held.released.set()
    assert blocked.result(60).status_code == 200
    answers = [f.result(60) for f in later]
    assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers]
    assert receiver.loop.batches == batches + 2  # the held request's batch, then the eight together
    got = receiver.in_topic(10)
    assert sorted(row for row, _origin in got) == sorted([("first", 1), ("a", 1)] + [(f"b{n}", n + 1) for n in range(8)])
    origins = [origin for _row, origin in got]
    assert len(set(origins)) == len(origins) and all(origin.startswith(f"{receiver.plan.name.rsplit('-', 1)[0]}>".encode()) for origin in origins)
    assert receiver.loop.metrics()["accepted_total"] == 10 and receiver.loop.metrics()["refused_total"] == 1


def test_a_json_array_is_one_request_all_accepted_or_all_refused(receiver):
    good = b'[{"event": {"deviceID": "d1", "power": 1}}, {"event": {"deviceID": "d2", "power": 2}}]'
    bad = b'[{"event": {"deviceID": "d3", "power": 3}}, {"event": {"deviceID": "d4"}}]'
    assert receiver.post(bad).status_code == 400
    assert receiver.post(good).status_code == 200
    assert sorted(row for row, _origin in receiver.in_topic(2)) == [("d1", 1), ("d2", 2)]


def test_a_failed_flush_answers_503_and_the_next_batch_is_published(receiver):
    receiver.publisher.fail = "the broker is away"
    answer = receiver.post(event("lost", 1))
    assert answer.status_code == 503 and "the broker is away" in answer.text and "retry" in answer.text
    receiver.publisher.fail = None
    assert receiver.post(event("kept", 2)).status_code == 200
    rows = [row for row, _origin in receiver.in_topic(1)]
    assert ("kept", 2) in rows


def test_an_event_over_the_message_limit_is_refused_413_with_the_limit_and_the_rest_of_its_batch_stored(receiver):
    held = receiver.publisher
    held.released.clear()
    blocked = receiver.post_later(event("first", 1))
    assert held.flushing.wait(30), "the first request's batch is being flushed"
    # The next batch holds the huge event between small ones: only its request is refused.
    later = []
    for n, device in enumerate(["s0", "x" * 1_500_000, "s1", "s2"]):
        later.append(receiver.post_later(event(device, n + 1)))
        wait_until(lambda: receiver.loop.waiting == n + 1, timeout=60, what=f"{n + 1} requests waiting")
    held.released.set()
    answers = [f.result(60) for f in later]
    assert [a.status_code for a in answers] == [200, 413, 200, 200], [a.text[:200] for a in answers]
    assert "1000000-byte limit" in answers[1].text and "never" in answers[1].text and "retry" not in answers[1].text, answers[1].text
    assert blocked.result(60).status_code == 200
    assert sorted(row for row, _origin in receiver.in_topic(4)) == [("first", 1), ("s0", 1), ("s1", 3), ("s2", 4)]
    assert receiver.loop.metrics()["refused_total"] == 1


def test_a_body_over_max_body_is_refused_413_with_the_limit(receiver):
    answer = receiver.post(b"x" * (MAX_BODY + 1))
    assert answer.status_code == 413 and f"limit of {MAX_BODY} bytes; send fewer events" in answer.text, answer.text[:200]
    assert receiver.post(event("after", 1)).status_code == 200


def test_basic_auth_refuses_without_valid_credentials_and_never_logs_them(receiver, caplog):
    caplog.set_level(logging.DEBUG)
    assert receiver.post(event("x", 1), auth=None).status_code == 401
    assert receiver.post(event("x", 1), auth=("ops", "wrong-secret")).status_code == 401
    assert receiver.post(event("x", 1), auth=("nobody", "s3cret-pass")).status_code == 401
    assert receiver.post(event("x", 1), auth=None, headers={"Authorization": "Bearer s3cret-pass"}).status_code == 401
    assert receiver.post(event("x", 1), auth=None, headers={"Authorization": "Basic !!not-base64"}).status_code == 401
    # Basic in any case and a password with a colon are as valid as the canonical header
    token = base64.b64encode(b"bench:other:pass").decode()
    assert receiver.post(event("y", 1), auth=("bench", "other:pass")).status_code == 200
    assert receiver.post(event("z", 2), auth=None, headers={"Authorization": f"basic  {token}"}).status_code == 200
    answer = receiver.post(event("x", 1), auth=None)
    assert answer.headers["WWW-Authenticate"].startswith("Basic")
    assert sorted(row for row, _origin in receiver.in_topic(2)) == [("y", 1), ("z", 2)]
    logged = "\n".join(record.getMessage() for record in caplog.records)
    for secret in ("s3cret-pass", "wrong-secret", "other:pass", token):
        assert secret not in logged


def test_other_paths_and_methods_are_refused(receiver):
    assert requests.get(receiver.url, timeout=10).status_code == 405
    assert requests.post(receiver.url.replace("/readings", "/other"), data=event("x", 1), auth=("ops", "s3cret-pass"), timeout=10).status_code == 404


def test_stopping_answers_the_batch_in_flight_once_durable_and_the_waiting_requests_503(receiver):
    held = receiver.publisher
    held.released.clear()
    in_flight = receiver.post_later(event("in-flight", 1))
    assert held.flushing.wait(30)
    waiting = receiver.post_later(event("waiting", 2))
    wait_until(lambda: receiver.loop.waiting == 1, timeout=60, what="a request waiting for the next batch")
    stopping = threading.Thread(target=receiver.hosted.stop)
    stopping.start()
    answer = waiting.result(60)
    assert answer.status_code == 503 and "stopping" in answer.text
    assert not in_flight.done()  # its batch is still being made durable
    held.released.set()
    assert in_flight.result(60).status_code == 200
    stopping.join(60)
    assert [row for row, _origin in receiver.in_topic(1)] == [("in-flight", 1)]


def test_worker_count_serves_one_url_from_several_processes_and_loses_nothing(kafka):
    # worker.count='2': a helper process listens on the same port (SO_REUSEPORT); the kernel spreads
    # connections over both, each publishes under an origin of its own, metrics add up, stop ends both.
    from sp_dagster.config.model import MessagingSettings

    port = free_port()
    app = APP.format(name=f"Recv{uuid.uuid4().hex[:6]}", port=port).replace("basic.auth.enabled='true'", "basic.auth.enabled='true', worker.count='2'")
    topology = deploy_topics(kafka, app)
    instance = next(i for g in topology.groups if g.receiver for i in g.instances)
    plan = plan_instance(instance.name, instance.siddhi)
    assert [i.workers for i in plan.http_inputs] == [2]
    settings = LoopSettings(None, metrics_interval_s=0.1, idle_wait_s=0.05, flush_timeout_s=30)
    messaging = MessagingSettings("kafka", tuple(kafka.bootstrap_servers.split(",")))
    hosted = HostedReceiver(plan, kafka, settings, users=USERS, messaging=messaging).start()
    helpers = hosted.loop.helper_pids
    try:
        assert len(helpers) == 1
        url = f"http://127.0.0.1:{port}/readings"

        def post(n: int) -> int:
            with requests.Session() as session:  # a connection of its own: the kernel places each on a process
                return session.post(url, data=event(f"d{n}", n + 1), auth=("ops", "s3cret-pass"), timeout=60).status_code

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(post, range(200)))
        assert answers == [200] * 200
        wait_until(lambda: hosted.metrics().get("accepted_total") == 200, timeout=60, what="both processes' counts in the receiver's metrics")
        assert hosted.metrics()["processes"] == 2
        assert 0 < hosted.loop.accepted < 200  # the rest the helper accepted (the metrics sum both)
        output = plan.outputs[0]
        reader = kafka.reader(output.topic, {p: EARLIEST for p in range(kafka.require_topic(output.topic).partitions)}, RawCodec())
        codec = BinaryCodec(output.attributes)
        got: list[Message] = []
        wait_until(
            lambda: got.extend(expand(output.topic, reader.poll_raw(1000, 0.2, ORIGIN_HEADER), codec)) or len(got) >= 200,
            timeout=60,
            what="200 events in the entry topic",
        )
        got.extend(expand(output.topic, reader.poll_raw(1000, 0.5, ORIGIN_HEADER), codec))
        reader.close()
        rows = sorted(m.value for m in got)
        assert rows == sorted((f"d{n}", n + 1) for n in range(200))
        keys = {(m.origin or b"").decode().rpartition("|")[0].rpartition(">")[2] for m in got}  # the receiver's key, passed on
        assert keys == {f"{plan.name}@http", f"{plan.name}@http1"}
    finally:
        hosted.stop()
    assert not any(Path(f"/proc/{pid}").exists() for pid in helpers), "a helper process outlived its receiver"


def test_a_receiver_with_basic_auth_on_a_node_without_users_fails_saying_what_to_add():
    from sp_dagster.config.loader import parse_config
    from sp_dagster.worker.instance.plan import InstancePlanError
    from sp_dagster.worker.node import require_receiver_users

    plan = plan_instance("Locked-1", APP.format(name="Locked", port=8281))
    bare = parse_config("deployment.config:\n  type: distributed\n", "worker.yaml", node_id="receiver-1")
    with pytest.raises(InstancePlanError) as refused:
        require_receiver_users(plan, bare)
    assert str(refused.value) == (
        "Locked-1: the http source of Readings has basic.auth.enabled='true', but node receiver-1 has no "
        "deployment.config.receiverUsers in worker.yaml: add the users it accepts"
    )
    users = parse_config("deployment.config:\n  type: distributed\n  receiverUsers: [{username: ops, password: pw}]\n", "worker.yaml", node_id="receiver-1")
    require_receiver_users(plan, users)  # served


def test_an_https_receiver_serves_tls_with_the_nodes_certificate_and_nothing_in_clear(kafka, tmp_path):
    from sp_dagster.errors import ConfigError
    from tests.fixtures.certificates import certificate

    cert, key = certificate(tmp_path, "receiver")
    port = free_port()
    app = APP.replace("http://", "https://").replace(", basic.auth.enabled='true'", "")
    topology = deploy_topics(kafka, app.format(name=f"Tls{uuid.uuid4().hex[:6]}", port=port))
    instance = next(i for g in topology.groups if g.receiver for i in g.instances)
    plan = plan_instance(instance.name, instance.siddhi)
    settings = LoopSettings(None, metrics_interval_s=0.1, idle_wait_s=0.05)
    with pytest.raises(ConfigError, match=r"https://127\.0\.0\.1:\d+ needs a certificate: set deployment.config.receiverTls"):
        HostedReceiver(plan, kafka, settings).start()

    hosted = HostedReceiver(plan, kafka, dataclasses.replace(settings, receiver_tls=(str(cert), str(key)))).start()
    try:
        url = f"https://127.0.0.1:{port}/readings"
        answer = requests.post(url, data=event("d1", 5), timeout=30, verify=str(cert))
        assert answer.status_code == 200, answer.text
        with pytest.raises(requests.exceptions.SSLError):
            requests.post(url, data=event("d2", 6), timeout=30)  # a client that does not trust the certificate
        # Plain HTTP on the TLS port is no way in: the server answers it with a TLS alert, not a receipt.
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.post(url.replace("https://", "http://"), data=event("d3", 7), timeout=30)
        output = plan.outputs[0]
        reader = kafka.reader(output.topic, {p: EARLIEST for p in range(kafka.require_topic(output.topic).partitions)}, RawCodec())
        codec = BinaryCodec(output.attributes)
        got: list[Message] = []

        def arrived():
            got.extend(expand(output.topic, reader.poll_raw(1000, 0.2, ORIGIN_HEADER), codec))
            return bool(got)

        wait_until(arrived, timeout=60, what="the event in the entry topic")
        got.extend(expand(output.topic, reader.poll_raw(1000, 0.5, ORIGIN_HEADER), codec))
        reader.close()
        assert [m.value for m in got] == [("d1", 5)]
    finally:
        hosted.stop()


def test_a_receiver_on_https_on_a_node_without_a_certificate_fails_saying_what_to_add():
    from sp_dagster.config.loader import parse_config
    from sp_dagster.worker.instance.plan import InstancePlanError
    from sp_dagster.worker.node import require_receiver_users

    plan = plan_instance("Secure-1", APP.replace("http://", "https://").format(name="Secure", port=8282))
    users = "  receiverUsers: [{username: ops, password: pw}]\n"
    bare = parse_config(f"deployment.config:\n  type: distributed\n{users}", "worker.yaml", node_id="receiver-1")
    with pytest.raises(InstancePlanError) as refused:
        require_receiver_users(plan, bare)
    assert str(refused.value) == (
        "Secure-1: the http source of Readings listens on https://, but node receiver-1 has no "
        "deployment.config.receiverTls in worker.yaml: add its certFile and keyFile"
    )
    tls = parse_config(
        f"deployment.config:\n  type: distributed\n{users}  receiverTls: {{certFile: r.crt, keyFile: r.key}}\n", "worker.yaml", node_id="receiver-1"
    )
    require_receiver_users(plan, tls)  # served


def test_a_receiver_certificate_that_cannot_load_is_one_line_naming_the_setting(tmp_path):
    from sp_dagster.config.loader import parse_config
    from sp_dagster.config.tls import receiver_tls_files
    from sp_dagster.errors import ConfigError
    from tests.fixtures.certificates import certificate

    def conf(tls: str):
        return parse_config(f"deployment.config:\n  type: distributed\n  receiverTls: {tls}\n", "worker.yaml", node_id="receiver-1")

    with pytest.raises(ConfigError, match=r"^worker.yaml: deployment.config.receiverTls: certFile and keyFile go together"):
        receiver_tls_files(conf("{certFile: r.crt}"))
    missing = tmp_path / "missing.crt"
    with pytest.raises(ConfigError) as refused:
        receiver_tls_files(conf(f"{{certFile: {missing}, keyFile: {tmp_path / 'missing.key'}}}"))
    assert str(refused.value).startswith(f"worker.yaml: deployment.config.receiverTls: cannot load certFile {missing}")
    assert "name PEM files this user can read" in str(refused.value)
    cert, key = certificate(tmp_path)
    assert receiver_tls_files(conf(f"{{certFile: {cert}, keyFile: {key}}}")) == (str(cert), str(key))
