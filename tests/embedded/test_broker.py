"""The embedded broker's life cycle: start, answer, stop, and never outlive its owner."""

import os
import signal
import subprocess
import sys

import pytest

from sp_dagster.embedded import EmbeddedBroker, port_open
from tests.fixtures.waiting import wait_until

pytestmark = pytest.mark.broker


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_start_answers_and_stop_frees_the_port():
    broker = EmbeddedBroker().start()
    pid = broker.process.pid
    assert port_open(broker.host, broker.port)
    broker.stop()
    assert not _alive(pid)
    assert not port_open(broker.host, broker.port)


def test_a_crashed_owner_leaves_no_broker_behind():
    code = "from sp_dagster.embedded import EmbeddedBroker; b = EmbeddedBroker().start(); print(b.process.pid, flush=True); import time; time.sleep(120)"
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    broker_pid = int(owner.stdout.readline())
    assert _alive(broker_pid)
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    wait_until(lambda: not _alive(broker_pid), timeout=10, interval=0.1, what="the broker ending with its owner")


def test_a_broker_on_every_address_tells_clients_the_address_it_was_given():
    from confluent_kafka.admin import AdminClient

    from sp_dagster.errors import SpDagsterError

    with pytest.raises(SpDagsterError, match="--advertised-host"):
        EmbeddedBroker(host="0.0.0.0")
    broker = EmbeddedBroker(host="0.0.0.0", advertised_host="127.0.0.2").start()  # loopback, as another address of this host
    try:
        assert broker.bootstrap_servers == f"127.0.0.2:{broker.port}"
        metadata = AdminClient({"bootstrap.servers": f"127.0.0.1:{broker.port}", "log_level": 0}).list_topics(timeout=10)
        assert [b.host for b in metadata.brokers.values()] == ["127.0.0.2"]
    finally:
        broker.stop()
