"""Checks of the annotations Siddhi and the distributed deployment understand.
Each known annotation says where it may stand and what its values must look like; an
unknown annotation is kept as data and never rejected. Names compare case-insensitively.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from sp_dagster.siddhi import ast
from sp_dagster.siddhi.errors import SiddhiQLError

Report = Callable[[str, ast.Node], None]

_STREAM, _TABLE, _WINDOW, _AGGREGATION = "stream", "table", "window", "aggregation"
_QUERY, _PARTITION, _PARTITION_QUERY = "query", "partition", "query inside a partition"
# Where each element annotation may stand.
_PLACES = {
    "info": {_QUERY, _PARTITION_QUERY, _PARTITION, _AGGREGATION},
    "dist": {_QUERY, _PARTITION, _AGGREGATION},
    "source": {_STREAM},
    "sink": {_STREAM},
    "store": {_TABLE, _AGGREGATION, _WINDOW},
    "primarykey": {_TABLE},
    "index": {_TABLE},
    "partitionbyid": {_AGGREGATION},
    "purge": {_AGGREGATION},
    "async": {_STREAM},
}
_STRATEGIES = ("roundRobin", "partitioned", "broadcast")
_BOOLEANS = ("true", "false")
_PLAYBACK_KEYS = ("idle.time", "increment")


def check_annotations(app: ast.App, report: Report) -> None:
    """Report every misplaced or malformed annotation of `app`."""
    _app_annotations(app.annotations, report)
    names: dict[str, ast.Node] = {}
    for element, place, _partition in _placed(app):
        for annotation in element.annotations:
            _element_annotation(annotation, element, place, report)
        info = element.annotation("info") if place not in (_PARTITION, _AGGREGATION) else None
        name = info.get("name") if info else None
        if info is not None and name is not None:
            if name in names:
                report(f"Query name '{name}' is already used on line {names[name].line}.", info.present("name"))
            else:
                names[name] = info


def _placed(app: ast.App) -> Iterator[tuple[ast.Annotated, str, ast.Partition | None]]:
    kinds = {
        ast.StreamDefinition: _STREAM,
        ast.TableDefinition: _TABLE,
        ast.WindowDefinition: _WINDOW,
        ast.AggregationDefinition: _AGGREGATION,
        ast.TriggerDefinition: "trigger",
        ast.FunctionDefinition: "function",
        ast.Query: _QUERY,
        ast.Partition: _PARTITION,
    }
    for element in app.elements:
        yield element, kinds[type(element)], None
        if isinstance(element, ast.Partition):
            for query in element.queries:
                yield query, _PARTITION_QUERY, element


def _app_annotations(annotations: tuple[ast.Annotation, ...], report: Report) -> None:
    for annotation in annotations:
        kind = annotation.name.lower()
        if kind == "app:name" and not (annotation.values or annotation.get("name")):
            report("@app:name needs a name, as in @app:name('Orders').", annotation)
        elif kind == "app:playback":
            for element in annotation.elements:
                if element.key is None or element.key.lower() not in _PLAYBACK_KEYS:
                    report("@app:playback takes only idle.time and increment.", element)
                elif not _is_time(element.value):
                    report(f"{element.key} must be a time such as '2 sec', not '{element.value}'.", element)
        elif kind == "app:transportchannelcreationenabled":
            _boolean(annotation, annotation.values[0] if annotation.values else annotation.get("enabled"), report)


def _element_annotation(annotation: ast.Annotation, element: ast.Annotated, place: str, report: Report) -> None:
    kind = annotation.name.lower()
    if kind == "dist" and place == _PARTITION_QUERY:
        report("@dist cannot be used on a query inside a partition; put it on the partition.", annotation)
        return
    places = _PLACES.get(kind)
    if places is None:
        return  # unknown annotations are kept as data
    if place not in places:
        report(f"@{annotation.name} cannot be used on a {place}.", annotation)
        return
    _CHECKS.get(kind, _nothing)(annotation, element, report)


def _nothing(annotation: ast.Annotation, element: ast.Annotated, report: Report) -> None:
    return None


def _info(annotation: ast.Annotation, element: ast.Annotated, report: Report) -> None:
    if annotation.get("name") is None:
        report("@info needs a name, as in @info(name = 'query1').", annotation)
    elif not annotation.get("name", "").strip():
        report("@info(name) must not be empty.", annotation.present("name"))


def _dist(annotation: ast.Annotation, element: ast.Annotated | None, report: Report) -> None:
    counts: dict[str, int] = {}
    for item in annotation.elements:
        key = (item.key or "").lower()
        if key in ("parallel", "maxparallel"):
            if item.value.strip().isdigit() and int(item.value) >= 1:
                counts[key] = int(item.value)
            else:
                report(f"@dist({item.key}) must be a whole number of at least 1, not '{item.value}'.", item)
        elif key == "execgroup":
            if not item.value.strip():
                report("@dist(execGroup) must not be empty.", item)
        else:
            report(f"@dist takes parallel, maxParallel and execGroup, not '{item.key or item.value}'.", item)
    if counts.get("maxparallel", counts.get("parallel", 1)) < counts.get("parallel", 1):
        report(
            f"@dist(maxParallel='{counts['maxparallel']}') is below parallel='{counts['parallel']}': the maximum is what the group "
            "may grow to; set it to at least the parallelism.",
            annotation.element("maxParallel") or annotation,
        )


def _transport(annotation: ast.Annotation, element: ast.Annotated, report: Report) -> None:
    assert isinstance(element, ast.StreamDefinition)  # _PLACES admits @source and @sink only on streams
    if annotation.get("type") is None:
        report(f"@{annotation.name} needs a type, as in @{annotation.name}(type = 'kafka', ...).", annotation)
    for nested in annotation.annotations:
        kind = nested.name.lower()
        if kind == "map" and nested.get("type") is None:
            report("@map needs a type, as in @map(type = 'json').", nested)
        elif kind == "dist":
            _dist(nested, None, report)
            most = nested.element("maxParallel")
            if most is not None:
                report("@dist(maxParallel) is for execution groups; a source's @dist takes parallel only.", most)
        elif kind == "distribution":
            if annotation.name.lower() != "sink":
                report("@distribution can only be used inside @sink.", nested)
            else:
                _distribution(nested, element, report)


def _distribution(annotation: ast.Annotation, element: ast.StreamDefinition, report: Report) -> None:
    strategy = annotation.get("strategy")
    if strategy not in _STRATEGIES:
        report(f"@distribution(strategy) must be roundRobin, partitioned or broadcast, not '{strategy}'.", annotation.element("strategy") or annotation)
        return
    key = annotation.element("partitionKey")
    if strategy == "partitioned":
        if key is None:
            report("A partitioned @distribution needs a partitionKey.", annotation)
        elif _attribute(element, key.value) is None:
            report(f"partitionKey '{key.value}' is not an attribute of '{element.name}'.", key)


def _attribute_list(annotation: ast.Annotation, element: ast.Annotated, report: Report) -> None:
    assert isinstance(element, ast.TableDefinition)  # _PLACES admits @primaryKey and @index only on tables
    values = [e for e in annotation.elements if e.key is None]
    if not values:
        report(f"@{annotation.name} needs at least one attribute name, as in @{annotation.name}('symbol').", annotation)
    for value in values:
        if _attribute(element, value.value) is None:
            report(f"@{annotation.name} names '{value.value}', which is not an attribute of '{element.name}'.", value)


def _partition_by_id(annotation: ast.Annotation, element: ast.Annotated, report: Report) -> None:
    enable = annotation.get("enable")
    if enable is not None:
        _boolean(annotation.present("enable"), enable, report)


def _purge(annotation: ast.Annotation, element: ast.Annotated, report: Report) -> None:
    if annotation.get("enable") is not None:
        _boolean(annotation.present("enable"), annotation.get("enable"), report)
    interval = annotation.element("interval")
    if interval is not None and not _is_time(interval.value):
        report(f"@purge(interval) must be a time such as '10 sec', not '{interval.value}'.", interval)
    for period in annotation.annotations_named("retentionPeriod"):
        for item in period.elements:
            if item.key is None or item.key.lower() not in _DURATION_WORDS:
                report(f"@retentionPeriod keys are durations such as sec or day, not '{item.key or item.value}'.", item)
            elif item.value.lower() != "all" and not _is_time(item.value):
                report(f"A retention period must be a time such as '120 sec' or 'all', not '{item.value}'.", item)


def _async(annotation: ast.Annotation, element: ast.Annotated, report: Report) -> None:
    for item in annotation.elements:
        if (item.key or "").lower() in ("buffer.size", "workers", "batch.size.max") and not (item.value.isdigit() and int(item.value) >= 1):
            report(f"@async({item.key}) must be a whole number of at least 1, not '{item.value}'.", item)


_DURATION_WORDS = {
    "sec", "second", "seconds", "min", "minute", "minutes", "hour", "hours",
    "day", "days", "week", "weeks", "month", "months", "year", "years",
}  # fmt: skip
_CHECKS = {
    "info": _info,
    "dist": _dist,
    "source": _transport,
    "sink": _transport,
    "primarykey": _attribute_list,
    "index": _attribute_list,
    "partitionbyid": _partition_by_id,
    "purge": _purge,
    "async": _async,
}


def _attribute(element: ast.Annotated, name: str) -> ast.AttributeDef | None:
    return next((a for a in getattr(element, "attributes", ()) if a.name == name), None)


def _boolean(node: ast.Node, value: str | None, report: Report) -> None:
    if (value or "").lower() not in _BOOLEANS:
        report(f"Expected 'true' or 'false', not '{value}'.", node)


def _is_time(text: str) -> bool:
    from sp_dagster.siddhi.parser import parse_expression  # the parser is loaded lazily

    try:
        value = parse_expression(text)
    except SiddhiQLError:
        return False
    return isinstance(value, ast.TimeConstant) or (isinstance(value, ast.Constant) and value.type in ("int", "long"))
