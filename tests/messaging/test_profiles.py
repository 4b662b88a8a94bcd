"""Broker profiles: the embedded broker's workarounds are on where it runs and off where Kafka's ordering holds."""

from __future__ import annotations

import pytest

from sp_dagster.config import load_config
from sp_dagster.errors import MessagingError
from sp_dagster.messaging import codec_for
from sp_dagster.messaging.kafka import KafkaTransport
from sp_dagster.messaging.profiles import PROFILES, profile_for
from sp_dagster.messaging.skips import WRITER_HEADER


def test_auto_tells_the_embedded_broker_by_its_cluster_id():
    assert profile_for("auto", "tansu_cluster") is PROFILES["tansu"]
    assert profile_for("auto", "Xk3q-kafka-cluster") is PROFILES["kafka"]
    assert profile_for("auto", None) is PROFILES["kafka"]
    assert profile_for("kafka", "tansu_cluster") is PROFILES["kafka"]
    with pytest.raises(MessagingError, match="brokerProfile to one of auto, kafka, tansu"):
        profile_for("redpanda", None)


def _headers_of_a_published_message(transport: KafkaTransport, topic: str) -> set[str]:
    transport.ensure_topic(topic, 1)
    publisher = transport.raw_publisher()
    publisher.produce_all([(topic, b"v", None, 0, 1_000, b"origin")], "sp-origin")
    publisher.close()
    reader = transport.reader(topic, {0: 0}, codec_for("raw", [("value", "object")]))
    try:
        (event,) = reader.poll(timeout=10).events
        return {name for name, _value in event.headers}
    finally:
        reader.close()


def test_writer_stamps_and_second_reads_follow_the_profile(broker, topic_name):
    embedded = KafkaTransport(broker.bootstrap_servers)
    assert embedded.profile.name == "tansu"  # auto, on the embedded broker
    assert _headers_of_a_published_message(embedded, topic_name) == {"sp-origin", WRITER_HEADER}
    plain = KafkaTransport(broker.bootstrap_servers, profile="kafka")
    assert _headers_of_a_published_message(plain, f"{topic_name}.plain") == {"sp-origin"}
    reader = plain.reader(f"{topic_name}.plain", {0: 0}, codec_for("raw", [("value", "object")]))
    assert reader.guard is None and reader.read_again() is False
    reader.close()
    embedded.close()
    plain.close()


def test_the_setting_reaches_the_messaging_settings(tmp_path):
    path = tmp_path / "deployment.yaml"
    path.write_text("wso2.carbon:\n  id: w1\ndeployment.config:\n  type: distributed\n  bootstrapURLs: localhost:9092\n  brokerProfile: kafka\n")
    assert load_config(path, role="worker").messaging.broker_profile == "kafka"
    path.write_text("wso2.carbon:\n  id: w1\ndeployment.config:\n  type: distributed\n  brokerProfile: fast\n")
    with pytest.raises(Exception, match="brokerProfile"):
        load_config(path, role="worker")
