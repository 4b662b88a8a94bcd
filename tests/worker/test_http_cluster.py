"""HTTP at both edges of a deployed cluster: seed 004's partitioning layer and WSO2's distributed Energy
sample on a LocalCluster of two Spark workers and one receiver node. Events POSTed to the receivers
come out, partitioned by key, at two local HTTP servers per app; a worker killed mid-stream loses none.
The app files are tests/worker/apps/seed-004.siddhi and energy-alert.siddhi (ports rewritten here)."""

from __future__ import annotations

import collections
import random
import time
import uuid
from pathlib import Path

import pytest
import requests

from sp_dagster.cluster.status import cluster_status, render_status
from sp_dagster.cluster.store.deployments import list_instances
from sp_dagster.embedded.broker import free_port
from sp_dagster.embedded.local_cluster import LocalCluster
from sp_dagster.engine import AppRuntime
from sp_dagster.engine.clock import PlaybackClock
from sp_dagster.worker.instance.sinks import java_hash_destination
from tests.fixtures.http import Collector
from tests.fixtures.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.broker]

APPS = Path(__file__).parent / "apps"
USERS = {"ops": "s3cret"}
TENANTS = ["foo.com", "bar.com", "baz.org", "qux.io", "carbon.super", "wso2.com"]
DEVICES = [f"dev{i}" for i in range(8)]
SEED_FIELDS = [
    ("meta_clientType", str),
    ("applicationConsumerKey", str),
    ("applicationName", str),
    ("applicationId", str),
    ("applicationOwner", str),
    ("apiContext", str),
    ("apiName", str),
    ("apiVersion", str),
    ("apiCreator", str),
    ("apiTier", str),
    ("apiHostname", str),
    ("username", str),
    ("userTenantDomain", str),
    ("requestTimestamp", int),
    ("throttledOut", bool),
    ("responseTime", int),
    ("backendTime", int),
]


class App:
    """One app file deployed with its own name, receiver port and two collecting HTTP servers."""

    def __init__(self, home: Path, file: str, name: str, receiver_port: int, path: str, sink_ports: tuple[int, int], workers: int = 1):
        self.collectors = (Collector(), Collector())
        self.name = f"{name}{uuid.uuid4().hex[:6]}"
        self.url = f"http://127.0.0.1:{free_port()}/{path}"
        self.workers = workers
        receiver = f"http://127.0.0.1:{receiver_port}/{path}'"
        served = f"{self.url}'" + (f", worker.count = '{workers}'" if workers > 1 else "")
        text = (APPS / file).read_text().replace(f"'{name}'", f"'{self.name}'").replace(receiver, served)
        for old, collector in zip(sink_ports, self.collectors):
            text = text.replace(f"127.0.0.1:{old}/", f"127.0.0.1:{collector.port}/")
        self.text = text
        self.path = home / file
        self.path.write_text(text)

    def received(self) -> list[dict]:
        return self.collectors[0].events() + self.collectors[1].events()


@pytest.fixture(scope="module")
def cluster(broker, tmp_path_factory):
    """Two workers and a receiver node (basic-auth users from its deployment.yaml) with both apps deployed."""
    home = tmp_path_factory.mktemp("http-cluster")
    running = LocalCluster(home / "cluster", broker.bootstrap_servers, workers=2, receivers=1, receiver_users=USERS, slots=8).start()
    seed = App(home, "seed-004.siddhi", "Seed004", 8280, "requests", (9001, 9002))
    # the Energy receiver serves from two processes (worker.count), spawned by its Spark task
    energy = App(home, "energy-alert.siddhi", "Energy-Alert-App", 8281, "device-power", (9001, 9002), workers=2)
    try:
        for app in (seed, energy):
            running.deploy(app.path, timeout=240)
        yield running, seed, energy
    except Exception:
        print(running.logs())
        raise
    finally:
        running.stop()


def seed_event(n: int) -> dict:
    values = {name: (f"{name}-{n % 4}" if kind is str else n) for name, kind in SEED_FIELDS}
    values.update(username=f"user{n}", userTenantDomain=TENANTS[n % len(TENANTS)], throttledOut=n % 7 == 0)
    return values


def energy_events(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    kinds = ["monitored"] * 8 + ["internal", "other"]
    return [{"type": rng.choice(kinds), "deviceID": (d := rng.choice(DEVICES)), "power": rng.randint(60, 240), "roomID": f"room-{d[-1]}"} for _ in range(count)]


def expected_alerts(text: str, events: list[dict]) -> list[tuple]:
    """AlertStream as the in-process engine computes it from the same events (all within the 2 min window)."""
    out = []
    names = ["type", "deviceID", "power", "roomID"]
    with AppRuntime(text, clock=PlaybackClock()) as runtime:
        runtime.add_callback("AlertStream", lambda got: out.extend(tuple(e.data) for e in got if not e.is_expired))
        for stamp, event in enumerate(events, start=1_700_000_000_000):
            runtime.send("DevicePowerStream", [tuple(event[n] for n in names)], [stamp])
    return out


def post(url: str, event: dict, auth=None) -> requests.Response:
    return requests.post(url, json={"event": event}, auth=auth, timeout=30)


def test_http_in_partitioned_http_out_through_a_worker_kill(cluster):
    running, seed, energy = cluster
    auth = tuple(next(iter(USERS.items())))
    plane = running.plane()
    placed = {i.instance_id: i.node_id for i in list_instances(plane)}
    receivers = {i for i, node in placed.items() if "passthrough" in i}
    assert len(receivers) == 2 and all(placed[i] == "receiver-1" for i in receivers), placed
    assert not [i for i, node in placed.items() if node == "receiver-1" and i not in receivers], placed
    victims = {i for i, node in placed.items() if node == "worker-2"}
    assert any(v.startswith(seed.name) for v in victims) and any(v.startswith(energy.name) for v in victims), placed

    # the receivers' URLs, as `sp-dagster status` shows them
    shown = lambda: render_status(cluster_status(plane))  # noqa: E731
    wait_until(lambda: f"receiving at {seed.url}" in shown() and f"receiving at {energy.url}" in shown(), timeout=30, what="receiver URLs in the status")

    def processes() -> list[int]:
        """How many processes each receiver serves from, as its worker reports."""
        receivers = [i for d in cluster_status(plane)["deployments"] for i in d["instances"] if i["receiver"]]
        return sorted((i["metrics"] or {}).get("processes") or 0 for i in receivers)

    wait_until(lambda: processes() == [1, 2], timeout=30, what="one receiver on 1 process, the Energy one on 2")

    assert post(seed.url, seed_event(0)).status_code == 401
    bad = requests.post(seed.url, data=b'{"event": {"username": 3}}', auth=auth, timeout=30)
    assert bad.status_code == 400 and "does not decode" in bad.text

    seed_sent = [seed_event(n) for n in range(240)]
    power = energy_events(240, seed=5)
    for n, (request, reading) in enumerate(zip(seed_sent, power)):
        answer = post(seed.url, request, auth)
        assert answer.status_code == 200, answer.text
        answer = post(energy.url, reading)
        assert answer.status_code == 200, answer.text
        if n == 80:
            time.sleep(2)  # into the stream, a state revision saved: then worker-2 dies without a word
            running.kill("worker-2")
        time.sleep(0.02)

    wanted = collections.Counter(expected_alerts(energy.text, power))
    assert wanted, "the Energy events were meant to raise alerts"
    alert_fields = ["deviceID", "roomID", "initialPower", "finalPower", "autorityContactEmail"]
    alerts = lambda: collections.Counter(tuple(e[f] for f in alert_fields) for e in energy.received())  # noqa: E731
    users = {e["username"] for e in seed_sent}
    try:
        wait_until(lambda: {e["username"] for e in seed.received()} >= users, timeout=240, what="every seed 004 request at a destination")
        wait_until(lambda: not wanted - alerts(), timeout=240, what="every Energy alert at a destination")
    except AssertionError:
        print(running.logs(80))
        raise
    time.sleep(2)  # anything beyond

    moved = {i.instance_id: i.node_id for i in list_instances(plane)}
    plane.close()
    assert all(moved[v] == "worker-1" for v in victims), moved
    assert set(alerts()) == set(wanted), "alerts the engine never raised"
    got_seed = seed.received()
    assert all(e in seed_sent for e in got_seed), "seed 004 events changed on the way"
    for app, key in ((seed, "userTenantDomain"), (energy, "deviceID")):
        for index, collector in enumerate(app.collectors):
            keys = {e[key] for e in collector.events()}
            assert keys and all(java_hash_destination(k, 2) == index for k in keys), (app.name, index, keys)
    seed_duplicates = len(got_seed) - len(users)
    alert_duplicates = sum(alerts().values()) - sum(wanted.values())
    print(f"seed 004: {len(users)} events, {seed_duplicates} sent again; energy: {sum(wanted.values())} alerts, {alert_duplicates} sent again")
