"""Apps a new user wrote badly (issue 29), each refused alike by every entry point.

`sp-dagster validate`, `sp-dagster plan` (text and JSON), the deploy path (`sp_dagster.deploy`,
before any record: the conf names a broker nobody listens on and a fresh control plane) and the
deploy run the app-repository sensor asks for all give the same `file:line:column: sentence`.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from sp_dagster.cli import main
from sp_dagster.cluster.db import ControlPlane
from sp_dagster.cluster.store.deployments import get_deployment, record_deployment
from sp_dagster.config.loader import load_config
from sp_dagster.deploy import deploy, instance_specs, load_app
from sp_dagster.deploy.streams import stream_topic
from sp_dagster.errors import SpDagsterError
from sp_dagster.orchestration.jobs import deploy_job, undeploy_job
from sp_dagster.orchestration.resources import ControlPlaneResource, MessagingResource
from sp_dagster.orchestration.sensors import build_app_repository_sensor
from sp_dagster.topology.output import to_dict
from sp_dagster.worker.instance.plan import plan_instance
from sp_dagster.worker.receivers.http import receiver_urls
from tests import test_support_check

#: A conf naming a broker nobody listens on and a fresh SQLite control plane (plane.db in tmp_path).
deploy_conf = test_support_check.deploy_conf

EMPTY = "The app defines no stream and runs no query, so there is nothing to deploy; write its definitions and queries."
NOT_UTF8 = "The file is not UTF-8 text (byte 0x{:02x} cannot be read); save it as UTF-8."
PARALLEL_WINDOW = (
    "Bad-default Window queries used with parallel greater than 1 outside partitioned stream; "
    "put the query inside a partition (partition with (key of Stream) begin ... end;) or set parallel='1'"
)

#: (file content, line, column, sentence)
BAD = {
    "latin-1": (b"@App:name('Bad')\ndefine stream S (a int);\n-- caf\xe9\nfrom S select a insert into O;\n", 3, 7, NOT_UTF8.format(0xE9)),
    # The column counts characters, not bytes: the e-acute before the bad byte is one column.
    "after-utf8": (b"@App:name('Bad')\n-- \xc3\xa9 \xff\ndefine stream S (a int);\n", 2, 6, NOT_UTF8.format(0xFF)),
    "empty": (b"", 1, 1, EMPTY),
    "comments-only": (b"  \n-- nothing here\n/* nor here */\n\t\n", 1, 1, EMPTY),
    "annotation-only": (b"@App:name('Bad')\n", 1, 1, EMPTY),
    "parallel-window": (
        b"@App:name('Bad')\ndefine stream S (symbol string, price double);\n"
        b"@dist(parallel='2')\nfrom S#window.length(5) select symbol, avg(price) as p insert into O;\n",
        4,
        15,
        PARALLEL_WINDOW,
    ),
}


@pytest.mark.parametrize("name", BAD)
def test_every_entry_point_refuses_the_app_with_one_message(name, tmp_path, capsys, deploy_conf):
    content, line, column, sentence = BAD[name]
    path = tmp_path / "bad.siddhi"
    path.write_bytes(content)
    expected = f"{path}:{line}:{column}: {sentence}"

    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr()
    assert out.err.splitlines()[0] == expected and "OK" not in out.out

    assert main(["plan", str(path)]) == 1
    out = capsys.readouterr()
    assert out.err.splitlines()[0] == f"error: {expected}" and out.out == ""

    assert main(["plan", str(path), "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out) == {"error": {"line": line, "column": column, "message": sentence}}

    assert main(["deploy", str(path), "--no-wait", "--conf", str(deploy_conf)]) == 1
    out = capsys.readouterr()
    assert out.err.splitlines()[0] == f"error: {expected}" and out.out == ""

    with pytest.raises(SpDagsterError) as refused:
        deploy(path, load_config(deploy_conf), wait=False)
    assert str(refused.value).splitlines()[0] == expected
    assert not (tmp_path / "plane.db").exists()  # refused before the control plane or the broker


@pytest.mark.parametrize("name", BAD)
def test_the_sensors_deploy_run_fails_with_the_same_line(name, tmp_path, deploy_conf):
    content, line, column, sentence = BAD[name]
    repo = tmp_path / "apps"
    repo.mkdir()
    (repo / "bad.siddhi").write_bytes(content)
    sensor = build_app_repository_sensor(repo, [deploy_job, undeploy_job])
    [request] = sensor.evaluate_tick(dg.build_sensor_context()).run_requests or []

    resources = {"control_plane": ControlPlaneResource(conf=str(deploy_conf)), "messaging": MessagingResource(conf=str(deploy_conf))}
    result = deploy_job.execute_in_process(run_config=request.run_config, resources=resources, raise_on_error=False)
    failure = result.failure_data_for_node("load_app")
    assert not result.success and failure is not None
    assert failure.user_failure_data is not None, failure.error  # a Failure with the message, not a raw step error
    assert failure.user_failure_data.description.splitlines()[0] == f"{repo / 'bad.siddhi'}:{line}:{column}: {sentence}"


HTTP_APP = """\
@App:name('Orders')
@source(type='http', @map(type='json'))
define stream In (id int, total double);
@sink(type='log')
define stream Big (id int, total double);
from In[total > 100] select id, total insert into Big;
"""


def test_an_http_source_without_receiver_url_receives_at_siddhi_io_https_default(tmp_path, capsys):
    path = tmp_path / "orders.siddhi"
    path.write_text(HTTP_APP)
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().err == ""
    assert main(["plan", str(path)]) == 0
    assert "receiver.url = 'http://0.0.0.0:9763/Orders/In'" in capsys.readouterr().out

    topology = load_app(path).topology
    [receiver] = [group for group in topology.groups if group.receiver]
    [instance] = receiver.instances
    assert receiver_urls(plan_instance(instance.name, instance.siddhi)) == ("http://0.0.0.0:9763/Orders/In",)


def test_a_given_receiver_url_is_kept(tmp_path):
    path = tmp_path / "orders.siddhi"
    path.write_text(HTTP_APP.replace("@source(type='http', ", "@source(type='http', receiver.url='http://0.0.0.0:8280/orders', "))
    [instance] = [i for g in load_app(path).topology.groups if g.receiver for i in g.instances]
    assert receiver_urls(plan_instance(instance.name, instance.siddhi)) == ("http://0.0.0.0:8280/orders",)


TERMINAL_APP = """\
@App:name('Shop')
define stream Orders (id int, total double);
from Orders[total > 100] select id, total insert into Big;
"""
TERMINAL_NOTE = (
    "note: stream 'Big' is read by no query and has no @sink, so nothing can consume its events; add "
    "@sink(type='kafka', @map(type='json')) above its `define stream Big (...)` (write one if there is none) to publish them to topic 'Shop.Big'."
)


def test_a_terminal_stream_without_a_sink_gets_a_note_not_a_refusal(tmp_path, capsys):
    path = tmp_path / "shop.siddhi"
    path.write_text(TERMINAL_APP)
    note = f"{path}:3:55: {TERMINAL_NOTE}"  # at the stream the query inserts into
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().err.splitlines() == [note]
    assert main(["plan", str(path), "--format", "json"]) == 0
    out = capsys.readouterr()
    assert out.err.splitlines() == [note] and json.loads(out.out)["app"] == "Shop"

    published = tmp_path / "published.siddhi"
    published.write_text(TERMINAL_APP + "@sink(type='kafka', @map(type='json'))\ndefine stream Big (id int, total double);\n")
    assert main(["validate", str(published)]) == 0
    assert capsys.readouterr().err == ""


def test_consuming_a_terminal_stream_says_what_to_add(tmp_path, deploy_conf):
    path = tmp_path / "shop.siddhi"
    path.write_text(TERMINAL_APP)
    loaded = load_app(path)
    plane = ControlPlane.from_config(load_config(deploy_conf))
    try:
        record_deployment(
            plane, "Shop", content_hash=loaded.content_hash, source=loaded.text, plan=to_dict(loaded.topology), instances=instance_specs(loaded.topology)
        )
        assert get_deployment(plane, "Shop") is not None
        with pytest.raises(SpDagsterError) as refused:
            stream_topic(plane, "Shop", "Big", writing=False)
        assert str(refused.value).endswith(TERMINAL_NOTE.removeprefix("note: "))
        assert stream_topic(plane, "Shop", "Orders", writing=True).topic == "Shop.Orders"
    finally:
        plane.close()


def test_writing_into_a_stream_between_execution_groups_is_refused_with_the_entry_streams(deploy_conf):
    loaded = load_app(Path(__file__).resolve().parents[1] / "apps" / "stock-alerts.siddhi")
    plane = ControlPlane.from_config(load_config(deploy_conf))
    try:
        record_deployment(
            plane, "StockAlerts", content_hash=loaded.content_hash, source=loaded.text, plan=to_dict(loaded.topology), instances=instance_specs(loaded.topology)
        )
        with pytest.raises(SpDagsterError) as refused:
            stream_topic(plane, "StockAlerts", "LargeTradeStream", writing=True)
        assert str(refused.value) == (
            "stream 'LargeTradeStream' of 'StockAlerts' is internal: its events come from StockAlerts-filter, and events written there "
            "would skip the queries before it; write to an entry stream instead: TradeStream"
        )
        assert stream_topic(plane, "StockAlerts", "TradeStream", writing=True).topic == "StockAlerts.TradeStream"
        assert stream_topic(plane, "StockAlerts", "LargeTradeStream", writing=False).topic == "StockAlerts.LargeTradeStream.symbol"  # reading is fine
    finally:
        plane.close()
