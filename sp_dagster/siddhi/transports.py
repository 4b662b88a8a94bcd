"""The one support check of sources, sinks and maps: what workers and receivers can run.
`check_transports` reports each problem at the option (or annotation) that causes it, in one
sentence. The maps' small languages live here too, as the check and the mappers both use them:
JSON paths (`$.a.b[0]`), XPaths as ElementTree reads them, and `{{attribute}}` templates.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit
from xml.etree import ElementTree

from sp_dagster.siddhi import ast

Report = Callable[[str, ast.Node], None]

#: Added by the planner to a user kafka @source read by several instances: "i/N" (1-based i).
INSTANCE_SHARE = "sp.instance"
#: The cluster's own messaging layer, filled in by the worker (`bootstrap.servers='${bootstrap}'`).
BOOTSTRAP_PLACEHOLDER = "${bootstrap}"
#: What names a topic of the NATS layer (a nats @source/@sink's destination) and a clusterId.
NATS_TOPIC = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
NATS_CLUSTER_ID = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class TransportSpec:
    """What one source or sink type takes: options it needs and options it understands."""

    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    destination: tuple[str, ...] = ()  # options a @destination of a @distribution may set


SOURCES = {
    "kafka": TransportSpec(
        ("topic.list",),
        ("group.id", "threading.option", "partition.no.list", "seq.enabled", "bootstrap.servers", "optional.configuration", INSTANCE_SHARE),
    ),
    "http": TransportSpec((), ("receiver.url", "basic.auth.enabled", "worker.count")),
    "nats": TransportSpec(
        ("destination",),
        ("bootstrap.servers", "cluster.id", "client.id", "queue.group.name", "durable.name", "subscription.sequence", INSTANCE_SHARE),
    ),
}
SINKS = {
    "kafka": TransportSpec((), ("topic", "partition.no", "key", "bootstrap.servers", "optional.configuration"), ("topic", "partition.no", "bootstrap.servers")),
    "http": TransportSpec(
        (),
        ("publisher.url", "method", "headers", "basic.auth.username", "basic.auth.password", "content.type"),
        ("publisher.url", "headers", "basic.auth.username", "basic.auth.password"),
    ),
    "log": TransportSpec((), ("prefix", "priority")),
    "nats": TransportSpec((), ("destination", "bootstrap.servers", "cluster.id", "client.id"), ("destination",)),
}
#: Map types and the options each takes on a @source and on a @sink.
MAPS = {
    "json": (("enclosing.element", "fail.on.missing.attribute"), ("enclosing.element", "validate.json")),
    "text": (("fail.on.missing.attribute", "event.grouping.enabled", "delimiter"), ("event.grouping.enabled", "delimiter", "new.line.character")),
    "csv": (("delimiter", "header", "event.grouping.enabled", "fail.on.unknown.attribute"), ("delimiter", "header", "event.grouping.enabled")),
    "keyvalue": (("fail.on.missing.attribute",), ()),
    "xml": (("enclosing.element", "fail.on.missing.attribute"), ("enclosing.element", "validate.xml")),
    "binary": (("wire",), ("wire",)),  # between execution groups
}
#: The wire formats of `@map(type='binary')` (inter-group topics) that plans record as its `wire`: one
#: event per message (what a map without `wire` means: planned before batches), event batches of encoded
#: events, or event batches by column (`messaging/batches.py`; what plans record now). A worker refuses a
#: format it does not know instead of misreading it.
EVENT_WIRE, BATCH_WIRE, COLUMN_WIRE = "event/1", "batch/1", "batch/2"
WIRE_FORMATS = (EVENT_WIRE, BATCH_WIRE, COLUMN_WIRE)
LOG_PRIORITIES = ("INFO", "DEBUG", "WARN", "ERROR", "FATAL", "TRACE", "OFF")
HTTP_METHODS = ("POST", "PUT", "GET", "DELETE", "PATCH")
_TEMPLATE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_JSON_STEP = re.compile(r"\.([A-Za-z_$][\w$-]*)|\[(\d+)\]|\['([^']*)'\]|\[\"([^\"]*)\"\]")


class PathError(ValueError):
    """A JSON path or XPath that cannot be read."""


def json_path(text: str) -> tuple[str | int, ...]:
    """The steps of a JSON path such as `$.a.b[0]` or `$['a b']` (names and list indexes)."""
    text = text.strip()
    if not text.startswith("$"):
        raise PathError(f"JSON path '{text}' must start with '$'")
    steps: list[str | int] = []
    position = 1
    while position < len(text):
        match = _JSON_STEP.match(text, position)
        if match is None:
            raise PathError(f"JSON path '{text}' cannot be read at '{text[position:]}'")
        name, index, quoted, double = match.groups()
        steps.append(int(index) if index is not None else (name or quoted or double))
        position = match.end()
    return tuple(steps)


def xpath(text: str) -> tuple[str, str | None]:
    """(element path, attribute name or None) of an XPath as ElementTree reads it (`a/b/@id`).

    A path from the root (`/events/event`, `//event`) is read from above the document's root."""
    text = text.strip()
    attribute = None
    if text.startswith("@"):
        path, attribute = ".", text[1:]
    elif "/@" in text:
        path, attribute = text.rsplit("/@", 1)
    else:
        path = text
    path = path or "."
    if path.startswith("/"):
        path = "." + path
    try:
        ElementTree.Element("x").findall(path)
    except (SyntaxError, KeyError, TypeError) as exc:
        raise PathError(f"XPath '{text}' cannot be read: {exc}") from None
    if attribute is not None and not re.fullmatch(r"[A-Za-z_][\w.-]*", attribute):
        raise PathError(f"XPath '{text}' names a bad attribute '@{attribute}'")
    return path, attribute


def template_names(text: str) -> tuple[str, ...]:
    """The attribute names a `{{attr}}` template uses, in order."""
    return tuple(match.group(1) for match in _TEMPLATE.finditer(text))


def fill_template(text: str, value_of: Callable[[str], str]) -> str:
    """The template with every `{{attr}}` replaced by value_of(attr)."""
    return _TEMPLATE.sub(lambda match: value_of(match.group(1)), text)


def check_transports(app: ast.App, report: Report) -> None:
    """Report every @source, @sink or @map that workers and receivers cannot run as written.

    `sp-dagster validate`, `plan`, `deploy`, the Dagster `load_app` op (all through `siddhi.validate.check`) and the
    worker (`worker.instance.plan.plan_instance`) call it, so an app a worker would refuse is refused before
    anything is recorded."""
    for definition in app.definitions:
        if not isinstance(definition, ast.StreamDefinition):
            continue
        names = {a.name for a in definition.attributes}
        for source in definition.annotations_named("source"):
            _check(source, SOURCES, "source", names, report)
        for sink in definition.annotations_named("sink"):
            _check(sink, SINKS, "sink", names, report)


def _check(annotation: ast.Annotation, specs: dict[str, TransportSpec], role: str, names: set[str], report: Report) -> None:
    kind = (annotation.get("type") or "").strip()
    spec = specs.get(kind.lower())
    if spec is None:
        if kind:
            where = annotation.element("type") or annotation
            report(f"@{role}(type='{kind}') is not supported; workers run {role}s of type {', '.join(sorted(specs))}.", where)
        return
    distribution = annotation.annotation("distribution") if role == "sink" else None
    destinations = distribution.annotations_named("destination") if distribution else ()
    for element in annotation.elements:
        key = (element.key or "").lower()
        if element.key is None:
            report(f"@{role}(type='{kind}') options need a name, as in key='value', not '{element.value}'.", element)
        elif key != "type" and key not in spec.required and key not in spec.optional:
            report(f"@{role}(type='{kind}') has no option '{element.key}'; it takes {', '.join(spec.required + spec.optional)}.", element)
    for required in spec.required:
        if annotation.get(required) is None:
            report(f"@{role}(type='{kind}') needs {required}.", annotation)
    for destination in destinations:
        for element in destination.elements:
            if (element.key or "").lower() not in spec.destination:
                allowed = ", ".join(spec.destination) or "no options"
                report(f"@destination of a {kind} sink takes {allowed}, not '{element.key or element.value}'.", element)
    for nested in annotation.annotations:
        if nested.name.lower() not in ("map", "distribution", "dist"):
            report(f"@{nested.name} cannot be used inside @{role}; it takes @map" + (" and @distribution." if role == "sink" else "."), nested)
    _CHECKS[(role, kind.lower())](annotation, destinations, report)
    if kind.lower() != "log":
        _check_map(annotation, role, names, report)


def _boolean_option(annotation: ast.Annotation, key: str, report: Report) -> None:
    element = annotation.element(key)
    if element is not None and element.value.strip().lower() not in ("true", "false"):
        report(f"{key} must be 'true' or 'false', not '{element.value}'.", element)


def _int_list_option(element: ast.AnnotationElement | None, report: Report) -> None:
    if element is None:
        return
    parts = [p.strip() for p in element.value.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        report(f"{element.key} must be partition numbers separated by commas, as in '0,1', not '{element.value}'.", element)


def _properties_option(element: ast.AnnotationElement | None, report: Report) -> None:
    if element is None:
        return
    for item in (p.strip() for p in element.value.split(",") if p.strip()):
        name, colon, value = item.partition(":")
        if not colon or not name.strip() or not value.strip():
            report(f"optional.configuration must be name:value pairs separated by commas, as in 'fetch.min.bytes:1', not '{item}'.", element)
            return


def _kafka_source(annotation: ast.Annotation, destinations, report: Report) -> None:
    topics = [t for t in (annotation.get("topic.list") or "").split(",") if t.strip()]
    if annotation.get("topic.list") is not None and not topics:
        report("topic.list must name at least one topic.", annotation.present("topic.list"))
    _int_list_option(annotation.element("partition.no.list"), report)
    _boolean_option(annotation, "seq.enabled", report)
    _properties_option(annotation.element("optional.configuration"), report)
    threading = annotation.element("threading.option")
    if threading is not None and threading.value not in ("single.thread", "topic.wise", "partition.wise"):
        report(f"threading.option must be single.thread, topic.wise or partition.wise, not '{threading.value}'.", threading)


def _kafka_sink(annotation: ast.Annotation, destinations, report: Report) -> None:
    by_destination = {(e.key or "").lower() for d in destinations for e in d.elements}
    # Without bootstrap.servers the sink writes the cluster's own Kafka, and the topic defaults to <app>.<stream>.
    if annotation.get("topic") is None and "topic" not in by_destination and annotation.get("bootstrap.servers") is not None:
        report("@sink(type='kafka') to another cluster needs a topic, on the sink or on every @destination.", annotation)
    if "topic" in by_destination and not all(d.get("topic") for d in destinations):
        report("When one @destination of a kafka sink names a topic, every @destination must.", destinations[0])
    for element in [annotation.element("partition.no")] + [d.element("partition.no") for d in destinations]:
        if element is not None and not element.value.strip().isdigit():
            report(f"partition.no must be a partition number, not '{element.value}'.", element)
    _properties_option(annotation.element("optional.configuration"), report)


def _http_source(annotation: ast.Annotation, destinations, report: Report) -> None:
    element = annotation.element("receiver.url")
    if element is not None:
        _url(element, report)
    _boolean_option(annotation, "basic.auth.enabled", report)
    workers = annotation.element("worker.count")
    if workers is not None and not (workers.value.strip().isdigit() and int(workers.value) >= 1):
        report(f"worker.count must be a number of processes of at least 1, as in '2', not '{workers.value}'.", workers)


def basic_auth_enabled(source: ast.Annotation) -> bool:
    """True when an http @source asks its callers for basic auth (basic.auth.enabled='true')."""
    return (source.get("type") or "").lower() == "http" and (source.get("basic.auth.enabled") or "false").lower() == "true"


def basic_auth_streams(app: ast.App) -> list[str]:
    """The streams of `app` whose http @source asks for basic auth: only a node with receiverUsers can serve them."""
    return [d.name for d in app.definitions if isinstance(d, ast.StreamDefinition) and any(basic_auth_enabled(s) for s in d.annotations_named("source"))]


def serves_https(source: ast.Annotation) -> bool:
    """True when an http @source listens on an https:// receiver.url."""
    return (source.get("type") or "").lower() == "http" and (source.get("receiver.url") or "").strip().lower().startswith("https://")


def https_streams(app: ast.App) -> list[str]:
    """The streams of `app` whose http @source listens on https://: only a node with receiverTls can serve them."""
    return [d.name for d in app.definitions if isinstance(d, ast.StreamDefinition) and any(serves_https(s) for s in d.annotations_named("source"))]


def wire_formats(app: ast.App) -> list[str]:
    """The wire formats of `app`'s inter-group topics (their binary maps' `wire`): a node that says it cannot read one must not run it."""
    found = set()
    for definition in app.definitions:
        if isinstance(definition, ast.StreamDefinition):
            for transport in (*definition.annotations_named("source"), *definition.annotations_named("sink")):
                mapping = transport.annotation("map")
                if mapping is not None and (mapping.get("type") or "").lower() == "binary":
                    found.add(mapping.get("wire") or EVENT_WIRE)
    return sorted(found)


def default_receiver_url(app: str, stream: str) -> str:
    """siddhi-io-http's receiver.url for an http @source of `stream` in `app` that names none."""
    return f"http://0.0.0.0:9763/{app}/{stream}"


def _http_sink(annotation: ast.Annotation, destinations, report: Report) -> None:
    urls = [annotation.element("publisher.url")] + [d.element("publisher.url") for d in destinations]
    if annotation.get("publisher.url") is None and not (destinations and all(d.get("publisher.url") for d in destinations)):
        report("@sink(type='http') needs publisher.url, on the sink or on every @destination.", annotation)
    for element in urls:
        if element is not None:
            _url(element, report)
    method = annotation.element("method")
    if method is not None and method.value.upper() not in HTTP_METHODS:
        report(f"method must be one of {', '.join(HTTP_METHODS)}, not '{method.value}'.", method)
    for element in [annotation.element("headers")] + [d.element("headers") for d in destinations]:
        if element is not None:
            try:
                http_headers(element.value)
            except ValueError as exc:
                report(f"{exc}.", element)
    user, password = annotation.element("basic.auth.username"), annotation.element("basic.auth.password")
    if (user is None) != (password is None):
        given = user or password
        assert given is not None  # exactly one of them is given
        report("basic.auth.username and basic.auth.password go together.", given)


def _nats_source(annotation: ast.Annotation, destinations, report: Report) -> None:
    _nats_options(annotation, [annotation.element("destination")], report)
    sequence = annotation.element("subscription.sequence")
    if sequence is not None and not sequence.value.strip().isdigit():
        report(f"subscription.sequence must be a sequence number, as in '100', not '{sequence.value}'.", sequence)


def _nats_sink(annotation: ast.Annotation, destinations, report: Report) -> None:
    if annotation.get("destination") is None and not (destinations and all(d.get("destination") for d in destinations)):
        report("@sink(type='nats') needs destination, on the sink or on every @destination.", annotation)
    _nats_options(annotation, [annotation.element("destination")] + [d.element("destination") for d in destinations], report)


def _nats_options(annotation: ast.Annotation, subjects: list, report: Report) -> None:
    """destination (a topic of the NATS layer), bootstrap.servers (NATS URLs) and cluster.id."""
    for element in subjects:
        if element is not None and not NATS_TOPIC.fullmatch(element.value.strip()):
            report(
                f"destination '{element.value}' cannot name a NATS topic: use letters, digits, '_' or '-', in parts joined by '.' "
                "(no {{templates}} or wildcards).",
                element,
            )
    servers = annotation.element("bootstrap.servers")
    if servers is not None and servers.value != BOOTSTRAP_PLACEHOLDER:
        for server in (s.strip() for s in servers.value.split(",")):
            parts = urlsplit(server if "://" in server else f"nats://{server}")
            try:
                good = parts.scheme in ("nats", "tls") and bool(parts.hostname) and parts.port is not None
            except ValueError:
                good = False
            if not good:
                report(f"bootstrap.servers must be NATS URLs separated by commas, as in 'nats://host:4222', not '{server}'.", servers)
                break
    cluster = annotation.element("cluster.id")
    if cluster is not None and not NATS_CLUSTER_ID.fullmatch(cluster.value.strip()):
        report(f"cluster.id '{cluster.value}' cannot name NATS streams: use letters, digits, '_' or '-'.", cluster)


def _log_sink(annotation: ast.Annotation, destinations, report: Report) -> None:
    priority = annotation.element("priority")
    if priority is not None and priority.value.upper() not in LOG_PRIORITIES:
        report(f"priority must be one of {', '.join(LOG_PRIORITIES)}, not '{priority.value}'.", priority)
    if annotation.annotations:
        report("@sink(type='log') takes no @map or @distribution.", annotation.annotations[0])


_CHECKS = {
    ("source", "kafka"): _kafka_source,
    ("source", "http"): _http_source,
    ("source", "nats"): _nats_source,
    ("sink", "kafka"): _kafka_sink,
    ("sink", "http"): _http_sink,
    ("sink", "log"): _log_sink,
    ("sink", "nats"): _nats_sink,
}


def _url(element: ast.AnnotationElement, report: Report) -> None:
    parts = urlsplit(element.value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        report(f"{element.key} must be an http:// or https:// URL with a host, not '{element.value}'.", element)
        return
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        report(f"{element.key} has a bad port: '{element.value}'.", element)


def http_headers(text: str) -> tuple[tuple[str, str], ...]:
    """Siddhi's headers option, `'Name:value','Other:value'` (quotes optional), as pairs."""
    pairs = []
    for item in re.findall(r"'([^']*)'|\"([^\"]*)\"|([^,]+)", text):
        part = next((p for p in item if p), "").strip()
        if not part:
            continue
        name, colon, value = part.partition(":")
        if not colon or not name.strip():
            raise ValueError(f"headers must be 'Name:value' items separated by commas, not '{part}'")
        pairs.append((name.strip(), value.strip()))
    return tuple(pairs)


def _check_map(annotation: ast.Annotation, role: str, names: set[str], report: Report) -> None:
    mapping = annotation.annotation("map")
    if mapping is None:
        return
    kind = (mapping.get("type") or "").lower()
    if kind not in MAPS:
        where = mapping.element("type") or mapping
        report(f"@map(type='{mapping.get('type')}') is not supported; maps are {', '.join(k for k in MAPS if k != 'binary')}.", where)
        return
    allowed = MAPS[kind][0 if role == "source" else 1]
    for element in mapping.elements:
        key = (element.key or "").lower()
        if key == "type" or (kind == "text" and role == "source" and key.startswith("regex.")):
            continue
        if key not in allowed:
            report(
                f"@map(type='{kind}') on a {role} has no option '{element.key or element.value}'" + (f"; it takes {', '.join(allowed)}." if allowed else "."),
                element,
            )
    for key in ("fail.on.missing.attribute", "event.grouping.enabled", "header", "validate.json", "validate.xml"):
        _boolean_option(mapping, key, report)
    wire = mapping.element("wire")
    if wire is not None and wire.value not in WIRE_FORMATS:
        report(
            f"wire format '{wire.value}' is not one this version of sp-dagster reads or writes ({', '.join(WIRE_FORMATS)}): "
            "the app was planned by a newer version; upgrade sp-dagster on this machine.",
            wire,
        )
    for nested in mapping.annotations:
        nested_kind = nested.name.lower()
        if role == "source" and nested_kind == "attributes":
            _check_attributes(nested, kind, mapping, names, report)
        elif role == "sink" and nested_kind == "payload":
            _check_payload(nested, kind, names, report)
        else:
            wanted = "@attributes" if role == "source" else "@payload"
            report(f"@{nested.name} cannot be used in the @map of a {role}; it takes {wanted}.", nested)
    if kind in ("json", "xml"):
        element = mapping.element("enclosing.element")
        if element is not None:
            try:
                json_path(element.value) if kind == "json" else xpath(element.value)
            except PathError as exc:
                report(f"{exc}.", element)


def _check_attributes(attributes: ast.Annotation, kind: str, mapping: ast.Annotation, names: set[str], report: Report) -> None:
    if kind == "binary":
        report("@map(type='binary') takes no @attributes.", attributes)
        return
    keyed = [e for e in attributes.elements if e.key is not None]
    if keyed and len(keyed) != len(attributes.elements):
        report("@attributes must name every attribute (symbol='...') or none of them.", attributes)
        return
    if keyed:
        for element in keyed:
            if element.key not in names:
                report(f"@attributes names '{element.key}', which is not an attribute of the stream.", element)
        missing = names - {e.key for e in keyed}
        if missing:
            report(f"@attributes leaves out {', '.join(sorted(missing))}; map every attribute of the stream.", attributes)
    elif len(attributes.elements) != len(names):
        report(f"@attributes gives {len(attributes.elements)} mappings for {len(names)} attributes.", attributes)
    regexes = {(e.key or "")[len("regex.") :] for e in mapping.elements if (e.key or "").lower().startswith("regex.")}
    for element in attributes.elements:
        try:
            _check_mapping(kind, element.value, regexes)
        except PathError as exc:
            report(f"{exc}.", element)


def _check_mapping(kind: str, text: str, regexes: set[str]) -> None:
    if kind == "json":
        json_path(text)
    elif kind == "xml":
        xpath(text)
    elif kind == "csv":
        if not text.strip().isdigit():
            raise PathError(f"a csv mapping is a column number counted from 0, not '{text}'")
    elif kind == "text":
        match = re.fullmatch(r"\s*(\w+)\[(\d+)\]\s*", text)
        if match is None or match.group(1) not in regexes:
            raise PathError(f"a text mapping is NAME[group] naming a regex.NAME option of the @map, not '{text}'")
    elif kind == "keyvalue" and not text.strip():
        raise PathError("a keyvalue mapping names a key")


def _check_payload(payload: ast.Annotation, kind: str, names: set[str], report: Report) -> None:
    if kind == "binary":
        report("@map(type='binary') takes no @payload.", payload)
        return
    if len(payload.elements) != 1 or payload.elements[0].key is not None:
        report('@payload takes one template, as in @payload("{{symbol}} costs {{price}}").', payload)
        return
    for element in payload.elements:
        for name in template_names(element.value):
            if name not in names:
                report(f"@payload uses {{{{{name}}}}}, which is not an attribute of the stream.", element)
