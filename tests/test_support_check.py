"""The one support check of sources, sinks and maps, walked through every entry point.

Each app below holds one thing workers cannot run. `sp-dagster validate`, `sp-dagster plan`,
`sp-dagster deploy` (before any topic or record: the conf names a broker nobody listens on and
a fresh control-plane file) and the Dagster `load_app` op all refuse it with file:line:col and
the same sentence, and the worker's `plan_instance` refuses the partial app with that sentence.
"""

from __future__ import annotations

import socket
import textwrap
from pathlib import Path

import dagster as dg
import pytest

from sp_dagster.cli import main
from sp_dagster.orchestration.ops import LoadAppConfig, load_app
from sp_dagster.siddhi import parse
from sp_dagster.topology import plan
from sp_dagster.worker.instance.plan import InstancePlanError, plan_instance

S = "define stream S (symbol string, price double);\n"
OUT = "define stream O (symbol string, price double);\n"
Q = "from S select symbol, price insert into O;\n"

#: (the app's annotated lines, the sentence, the text the error points at)
REFUSED = [
    (
        "@source(type='tcp', @map(type='json'))\n" + S + OUT,
        "@source(type='tcp') is not supported; workers run sources of type http, kafka, nats.",
        "type='tcp'",
    ),
    ("@source(type='kafka', @map(type='json'))\n" + S + OUT, "@source(type='kafka') needs topic.list.", "@source"),
    (
        "@source(type='kafka', topic.list='t', topic.offsets.map='t=5')\n" + S + OUT,
        "@source(type='kafka') has no option 'topic.offsets.map'",
        "topic.offsets.map",
    ),
    (
        "@source(type='kafka', topic.list='t', partition.no.list='0,x')\n" + S + OUT,
        "partition.no.list must be partition numbers separated by commas",
        "partition.no.list",
    ),
    ("@source(type='kafka', topic.list='t', seq.enabled='yes')\n" + S + OUT, "seq.enabled must be 'true' or 'false', not 'yes'.", "seq.enabled"),
    (
        "@source(type='kafka', topic.list='t', optional.configuration='fetch.min.bytes')\n" + S + OUT,
        "optional.configuration must be name:value pairs",
        "optional.configuration",
    ),
    (
        "@source(type='http', receiver.url='ftp://x/y')\n" + S + OUT,
        "receiver.url must be an http:// or https:// URL with a host, not 'ftp://x/y'.",
        "receiver.url",
    ),
    (
        "@source(type='http', receiver.url='http://0.0.0.0:8280/in', basic.auth.enabled='maybe')\n" + S + OUT,
        "basic.auth.enabled must be 'true' or 'false'",
        "basic.auth.enabled",
    ),
    (
        "@source(type='http', receiver.url='http://0.0.0.0:8280/in', worker.count='0')\n" + S + OUT,
        "worker.count must be a number of processes of at least 1, as in '2', not '0'.",
        "worker.count",
    ),
    (
        "@source(type='kafka', topic.list='t', @map(type='avro'))\n" + S + OUT,
        "@map(type='avro') is not supported; maps are json, text, csv, keyvalue, xml.",
        "type='avro'",
    ),
    (
        "@source(type='kafka', topic.list='t', @map(type='json', @attributes(symbol='symbol', price='$.price')))\n" + S + OUT,
        "JSON path 'symbol' must start with '$'.",
        "symbol='symbol'",
    ),
    ("@source(type='kafka', topic.list='t', @map(type='xml', @attributes(symbol='a[', price='p')))\n" + S + OUT, "XPath 'a[' cannot be read", "symbol='a['"),
    (
        "@source(type='kafka', topic.list='t', @map(type='json', @attributes(symbol='$.s')))\n" + S + OUT,
        "@attributes leaves out price; map every attribute of the stream.",
        "@attributes",
    ),
    (
        "@source(type='kafka', topic.list='t', @map(type='text', regex.A='(\\w+)', @attributes(symbol='B[1]', price='A[1]')))\n" + S + OUT,
        "a text mapping is NAME[group] naming a regex.NAME option of the @map, not 'B[1]'.",
        "symbol='B[1]'",
    ),
    ("@source(type='kafka', topic.list='t', @map(type='csv', quote='x'))\n" + S + OUT, "@map(type='csv') on a source has no option 'quote'", "quote='x'"),
    (S + "@sink(type='email', to='a@b.c')\n" + OUT, "@sink(type='email') is not supported; workers run sinks of type http, kafka, log, nats.", "type='email'"),
    (
        S + "@sink(type='kafka', bootstrap.servers='other:9092', @map(type='json'))\n" + OUT,
        "@sink(type='kafka') to another cluster needs a topic, on the sink or on every @destination.",
        "@sink",
    ),
    (S + "@sink(type='kafka', topic='t', partition.no='one')\n" + OUT, "partition.no must be a partition number, not 'one'.", "partition.no"),
    (
        S + "@sink(type='kafka', topic='t', @distribution(strategy='roundRobin', @destination(publisher.url='http://h')))\n" + OUT,
        "@destination of a kafka sink takes topic, partition.no, bootstrap.servers, not 'publisher.url'.",
        "publisher.url",
    ),
    (S + "@sink(type='http', method='POST')\n" + OUT, "@sink(type='http') needs publisher.url, on the sink or on every @destination.", "@sink"),
    (S + "@sink(type='http', publisher.url='http://h/x', method='SEND')\n" + OUT, "method must be one of POST, PUT, GET, DELETE, PATCH, not 'SEND'.", "method"),
    (
        S + "@sink(type='http', publisher.url='http://h/x', headers='nocolon')\n" + OUT,
        "headers must be 'Name:value' items separated by commas, not 'nocolon'.",
        "headers",
    ),
    (
        S + "@sink(type='http', publisher.url='http://h/x', basic.auth.username='u')\n" + OUT,
        "basic.auth.username and basic.auth.password go together.",
        "basic.auth.username",
    ),
    (
        S + "@sink(type='http', publisher.url='http://h/x', @map(type='json', @payload('{{sym}}')))\n" + OUT,
        "@payload uses {{sym}}, which is not an attribute of the stream.",
        "'{{sym}}'",
    ),
    ("@source(type='nats', cluster.id='c')\n" + S + OUT, "@source(type='nats') needs destination.", "@source"),
    ("@source(type='nats', destination='in.*')\n" + S + OUT, "destination 'in.*' cannot name a NATS topic", "destination"),
    (
        "@source(type='nats', destination='in', bootstrap.servers='http://h:4222')\n" + S + OUT,
        "bootstrap.servers must be NATS URLs separated by commas",
        "bootstrap.servers",
    ),
    (
        "@source(type='nats', destination='in', subscription.sequence='last')\n" + S + OUT,
        "subscription.sequence must be a sequence number",
        "subscription.sequence",
    ),
    (S + "@sink(type='nats', cluster.id='a b', destination='out')\n" + OUT, "cluster.id 'a b' cannot name NATS streams", "cluster.id"),
    (S + "@sink(type='nats', @map(type='json'))\n" + OUT, "@sink(type='nats') needs destination, on the sink or on every @destination.", "@sink"),
    (S + "@sink(type='log', priority='LOUD')\n" + OUT, "priority must be one of INFO, DEBUG, WARN, ERROR, FATAL, TRACE, OFF, not 'LOUD'.", "priority"),
]


def _app(body: str) -> str:
    return "@App:name('Refused')\n" + body + Q


def _position(text: str, fragment: str) -> tuple[int, int]:
    for number, line in enumerate(text.splitlines(), start=1):
        if fragment in line:
            return number, line.index(fragment) + 1
    raise AssertionError(f"{fragment!r} is not in the app")


@pytest.fixture
def deploy_conf(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens: reaching the broker would fail differently
    conf = tmp_path / "deployment.yaml"
    conf.write_text(
        textwrap.dedent(
            f"""\
            wso2.carbon:
              id: manager-1
            deployment.config:
              type: distributed
              bootstrapURLs: 127.0.0.1:{port}
              datasource: SP_MGT_DB
            datasources:
              SP_MGT_DB: sqlite:///{tmp_path}/plane.db
            """
        )
    )
    return conf


@pytest.mark.parametrize("body, sentence, at", REFUSED, ids=[f"refused-{i:02d}" for i in range(len(REFUSED))])
def test_every_entry_point_refuses_what_workers_cannot_run(body, sentence, at, tmp_path, capsys, deploy_conf):
    text = _app(body)
    line, column = _position(text, at)
    path = tmp_path / "refused.siddhi"
    path.write_text(text)
    where = f"{path}:{line}:{column}: "

    for command in (["validate", str(path)], ["plan", str(path)], ["deploy", str(path), "--no-wait", "--conf", str(deploy_conf)]):
        assert main(command) != 0, command
        err = capsys.readouterr().err
        assert where + sentence in err, (command, err)
    assert not (tmp_path / "plane.db").exists() or "Refused" not in (tmp_path / "plane.db").read_bytes().decode("latin-1")

    result = dg.build_op_context()
    with pytest.raises(dg.Failure) as failure:
        load_app(result, LoadAppConfig(path=str(path)))
    assert where + sentence in failure.value.description

    # The worker makes the same check of each partial app (planned here without it).
    topology = plan(parse(text), transports=False)
    refused = []
    for instance in topology.partial_apps:
        try:
            plan_instance(instance.name, instance.siddhi)
        except InstancePlanError as exc:
            refused.append(str(exc))
    assert refused and all(sentence in message for message in refused), refused


def test_what_workers_run_passes_every_entry_point(tmp_path, capsys):
    text = _app(
        "@source(type='kafka', topic.list='a,b', group.id='g', seq.enabled='true', optional.configuration='fetch.min.bytes:1',\n"
        "        @map(type='json', enclosing.element='$.batch', @attributes(symbol='$.s', price='$.p')))\n"
        + S
        + "@sink(type='http', method='PUT', headers=\"'X-A:1'\", basic.auth.username='u', basic.auth.password='p', @map(type='xml', @payload('<s>{{symbol}}</s>')),\n"
        "      @distribution(strategy='partitioned', partitionKey='symbol', @destination(publisher.url='http://h1/x'), @destination(publisher.url='http://h2/x')))\n"
        "@sink(type='log', prefix='out', priority='WARN')\n"
        "@sink(type='nats', bootstrap.servers='nats://a:4222,b:4222', cluster.id='c-1', client.id='x', @map(type='json'),\n"
        "      @distribution(strategy='roundRobin', @destination(destination='o.1'), @destination(destination='o.2')))\n" + OUT
    )
    path = tmp_path / "runs.siddhi"
    path.write_text(text)
    assert main(["validate", str(path)]) == 0
    assert main(["plan", str(path)]) == 0
    topology = plan(parse(text))
    for instance in topology.partial_apps:
        plan_instance(instance.name, instance.siddhi)
    assert Path(path).exists()
    nats = "@source(type='nats', destination='in', cluster.id='c', queue.group.name='q', durable.name='d', subscription.sequence='5', @map(type='csv'))\n"
    assert main(["validate", str(_written(tmp_path / "nats.siddhi", _app(nats + S + OUT)))]) == 0


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
