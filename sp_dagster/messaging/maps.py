"""Siddhi's maps (`@map(type=...)`): message bytes to a stream's rows and back, for user sources and
sinks, in json, text, csv, keyvalue, xml or the binary form between execution groups, or through a
sink's `@payload` template. What a message does not give raises EventDecodeError with the reason,
which sends the event to the app's dead-letter topic (or a 400 at an HTTP receiver).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode
from xml.etree import ElementTree

from sp_dagster.errors import EventDecodeError
from sp_dagster.javatext import java_str
from sp_dagster.messaging.codecs import CODECS, Attribute, Codec, JsonCodec, check_value, schema_of
from sp_dagster.siddhi.transports import fill_template, json_path, xpath

GROUP_SEPARATOR = "~~~~~~~~~~"  # between events of one text message (event.grouping.enabled)


@dataclass(frozen=True)
class MapSpec:
    """A `@map`: its type, options, `@attributes` mappings (attribute, mapping) and `@payload` template."""

    type: str = "json"
    options: tuple[tuple[str, str], ...] = ()
    attributes: tuple[tuple[str | None, str], ...] = ()  # (None, mapping) when given by position
    payload: str | None = None

    def option(self, key: str, default: str | None = None) -> str | None:
        """The value of option `key` (case-insensitive), or default."""
        return next((v for k, v in self.options if k.lower() == key.lower()), default)

    def flag(self, key: str, default: bool) -> bool:
        """A true/false option."""
        return (self.option(key) or str(default)).strip().lower() == "true"


def mapper_for(spec: MapSpec | str, attributes: Sequence[Attribute | tuple[str, str]]) -> Codec:
    """The codec of a map (or a codec name) for a stream's attributes."""
    if isinstance(spec, str):
        spec = MapSpec(spec)
    kind = spec.type.lower()
    if kind in MAPPERS:
        return MAPPERS[kind](attributes, spec)
    if kind in CODECS:
        return CODECS[kind](attributes)
    raise ValueError(f"unknown map '{spec.type}'; expected one of {', '.join(sorted(set(MAPPERS) | set(CODECS)))}")


def convert(attribute: Attribute, value: Any) -> Any:
    """A value read from text (or JSON) as the attribute's type; EventDecodeError when it is not one."""
    if not isinstance(value, str) or attribute.type in ("string", "object"):
        return check_value(attribute, value)
    text = value.strip()
    if not text:
        return None
    try:
        if attribute.type in ("int", "long"):
            return check_value(attribute, int(text))
        if attribute.type in ("float", "double"):
            return float(text)
    except ValueError:
        pass
    if attribute.type == "bool" and text.lower() in ("true", "false"):
        return text.lower() == "true"
    return _wrong(attribute, value)


def _wrong(attribute: Attribute, value: Any):
    raise EventDecodeError(f"attribute '{attribute.name}': expected {attribute.type}, got {value!r}")


class Mapper(Codec):
    """A codec configured by a @map: custom mappings and a payload template on top of a default form.

    A sink's `@payload("...{{a}}...")` writes each event through the template instead of the default
    form. What each map accepts is checked before deployment by `siddhi.transports`."""

    name = "map"

    def __init__(self, attributes, spec: MapSpec):
        super().__init__(attributes)
        self.spec = spec
        self.fail_on_missing = spec.flag("fail.on.missing.attribute", True)
        by_name = {name: mapping for name, mapping in spec.attributes if name is not None}
        positional = [mapping for name, mapping in spec.attributes if name is None]
        self.mappings: tuple[str, ...] | None = None
        if by_name:
            self.mappings = tuple(by_name[a.name] for a in self.attributes)
        elif positional:
            self.mappings = tuple(positional)

    def encode(self, row):
        self._check_width(row)
        if self.spec.payload is not None:
            values = dict(zip(self.names, row))
            return fill_template(self.spec.payload, lambda name: _text(values.get(name))).encode("utf-8")
        return self.encode_default(row)

    def encode_default(self, row) -> bytes:
        """The map's default form of one row."""
        raise NotImplementedError

    def _values(self, found: Sequence[Any]) -> tuple:
        """Found values (None: missing) as a row of the stream's types."""
        row = []
        for attribute, value in zip(self.attributes, found):
            if value is _MISSING:
                if self.fail_on_missing:
                    raise EventDecodeError(f"missing attribute '{attribute.name}'")
                value = None
            row.append(convert(attribute, value))
        return tuple(row)


_MISSING = object()


def _text(value: Any) -> str:
    """A value as Siddhi prints it in text (templates, csv, keyvalue)."""
    return java_str(value) if value is not None else "null"


def _text_decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EventDecodeError(f"not UTF-8 text: {exc}") from None


class JsonMapper(Mapper):
    """json: Siddhi's {"event": {...}} form, or JSON paths (`enclosing.element`, `@attributes`)."""

    name = "json"

    def __init__(self, attributes, spec):
        super().__init__(attributes, spec)
        self._default = JsonCodec(self.attributes)
        enclosing = spec.option("enclosing.element")
        self.enclosing = json_path(enclosing) if enclosing else None
        self.paths = tuple(json_path(m) for m in self.mappings) if self.mappings else None
        if self.enclosing is None and self.paths is None:
            self.decode = self._default.decode  # Siddhi's default form: the codec's, without a call in between
            self.decode_many, self.bulk = self._default.decode_many, True

    def decode(self, data):
        try:
            document = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EventDecodeError(f"not valid JSON: {exc}") from None
        if self.enclosing is not None:
            document = _follow(document, self.enclosing)
            if document is _MISSING:
                raise EventDecodeError(f"no '{self.spec.option('enclosing.element')}' in the message")
        items = document if isinstance(document, list) else [document]
        rows = []
        for item in items:
            if self.paths is None:
                rows.extend(self._default.decode(json.dumps(item).encode()))
            else:
                rows.append(self._values([_follow(item, path) for path in self.paths]))
        return rows

    def encode_default(self, row):
        if self.enclosing is None:
            return self._default.encode(row)
        document: Any = {"event": dict(zip(self.names, row))}
        for step in reversed(self.enclosing):
            document = {str(step): document}
        return json.dumps(document, separators=(",", ":"), default=str).encode("utf-8")


def _follow(document: Any, steps: tuple) -> Any:
    for step in steps:
        if isinstance(step, int) and isinstance(document, list) and -len(document) <= step < len(document):
            document = document[step]
        elif isinstance(step, str) and isinstance(document, dict) and step in document:
            document = document[step]
        else:
            return _MISSING
    return document


class TextMapper(Mapper):
    """text: Siddhi's `name:value` lines (strings in double quotes), or `regex.X` groups."""

    name = "text"
    _LINE = re.compile(r'\s*([A-Za-z_]\w*)\s*:\s*(".*?(?<!\\)"|[^,\n]*)\s*,?\s*$')

    def __init__(self, attributes, spec):
        super().__init__(attributes, spec)
        self.grouped = spec.flag("event.grouping.enabled", False)
        self.delimiter = spec.option("delimiter", GROUP_SEPARATOR)
        self.regexes = {k[len("regex.") :]: re.compile(v, re.S) for k, v in spec.options if k.lower().startswith("regex.")}
        self.groups = None if self.mappings is None else tuple(self._group(m) for m in self.mappings)

    def _group(self, mapping: str) -> tuple[re.Pattern, int]:
        """The regex and group number an @attributes value NAME[N] names."""
        parts = re.fullmatch(r"\s*(\w+)\[(\d+)\]\s*", mapping)
        if parts is None or parts.group(1) not in self.regexes:
            known = ", ".join(f"regex.{name}" for name in self.regexes) or "none"
            raise ValueError(f"text @map: @attributes value '{mapping}' must be NAME[N], group N of a regex.NAME option (options: {known})")
        return self.regexes[parts.group(1)], int(parts.group(2))

    def decode(self, data):
        text = _text_decode(data)
        parts = text.split(self.delimiter) if self.grouped else [text]
        return [self._event(part) for part in parts if part.strip()]

    def _event(self, text: str) -> tuple:
        if self.groups is not None:
            found = []
            for regex, group in self.groups:
                match = regex.search(text)
                found.append(match.group(group) if match and match.group(group) is not None else _MISSING)
            return self._values(found)
        values: dict[str, Any] = {}
        for line in text.splitlines():
            if not line.strip():
                continue
            match = self._LINE.match(line)
            if match is None:
                raise EventDecodeError(f"not Siddhi's text form (name:value lines): {line.strip()[:80]!r}")
            raw = match.group(2).strip()
            values[match.group(1)] = None if raw == "null" else json.loads(raw) if raw.startswith('"') else raw
        found = [values.get(name, _MISSING) for name in self.names]
        return self._values(found)

    def encode_default(self, row):
        lines = []
        for attribute, value in zip(self.attributes, row):
            shown = json.dumps(value) if attribute.type == "string" and value is not None else _text(value)
            lines.append(f"{attribute.name}:{shown}")
        return ",\n".join(lines).encode("utf-8")


class CsvMapper(Mapper):
    """csv: one event per line (`delimiter`, `header`), values in attribute order (or the columns @attributes name)."""

    name = "csv"

    def __init__(self, attributes, spec):
        super().__init__(attributes, spec)
        self.delimiter: str = spec.option("delimiter", ",") or ","
        self.header = spec.flag("header", False)
        self.columns = tuple(int(m) for m in self.mappings) if self.mappings else tuple(range(len(self.attributes)))

    def decode(self, data):
        reader = csv.reader(io.StringIO(_text_decode(data)), delimiter=self.delimiter)
        records = [r for r in reader if r]
        if self.header:
            records = records[1:]
        rows = []
        for record in records:
            if self.mappings is None and len(record) != len(self.attributes):
                raise EventDecodeError(f"expected {len(self.attributes)} values ({', '.join(self.names)}), got {len(record)}")
            found = [record[c] if c < len(record) else _MISSING for c in self.columns]
            rows.append(self._values([None if v == "null" else v for v in found]))
        return rows

    def encode_default(self, row):
        out = io.StringIO()
        writer = csv.writer(out, delimiter=self.delimiter, lineterminator="\n")
        if self.header:
            writer.writerow(self.names)
        writer.writerow([_text(v) for v in row])
        return out.getvalue().encode("utf-8")


class KeyValueMapper(Mapper):
    """keyvalue: `a=x&b=1` (form encoding); keys are attribute names or what @attributes names."""

    name = "keyvalue"

    def decode(self, data):
        pairs = dict(parse_qsl(_text_decode(data), keep_blank_values=True))
        keys = self.mappings or self.names
        return [self._values([pairs.get(k.strip(), _MISSING) for k in keys])]

    def encode_default(self, row):
        return urlencode([(n, _text(v)) for n, v in zip(self.names, row)]).encode("utf-8")


class XmlMapper(Mapper):
    """xml: `<events><event><a>x</a></event></events>`, or XPaths as ElementTree reads them (`enclosing.element`, `@attributes`)."""

    name = "xml"

    def __init__(self, attributes, spec):
        super().__init__(attributes, spec)
        enclosing = spec.option("enclosing.element")
        self.enclosing = xpath(enclosing)[0] if enclosing else None
        self.paths = tuple(xpath(m) for m in self.mappings) if self.mappings else None

    def decode(self, data):
        try:
            root = ElementTree.fromstring(data)
        except ElementTree.ParseError as exc:
            raise EventDecodeError(f"not valid XML: {exc}") from None
        holder = ElementTree.Element("document")
        holder.append(root)
        if self.enclosing is not None:
            containers = holder.findall(self.enclosing)
            if not containers:
                raise EventDecodeError(f"no '{self.spec.option('enclosing.element')}' in the message")
            events = [child for container in containers for child in container]
        else:
            events = list(root) if root.tag == "events" else [root]
        return [self._event(event) for event in events]

    def _event(self, event: ElementTree.Element) -> tuple:
        found = []
        for index, attribute in enumerate(self.attributes):
            path, name = self.paths[index] if self.paths else (attribute.name, None)
            node = event.find(path)
            if node is None:
                found.append(_MISSING)
            elif name is not None:
                found.append(node.get(name, _MISSING))
            else:
                found.append(node.text or "")
        return self._values(found)

    def encode_default(self, row):
        root = ElementTree.Element(self._root_name())
        event = ElementTree.SubElement(root, "event")
        for name, value in zip(self.names, row):
            child = ElementTree.SubElement(event, name)
            if value is not None:  # null: an empty element
                child.text = _text(value)
        return ElementTree.tostring(root, encoding="utf-8")

    def _root_name(self) -> str:
        enclosing = self.spec.option("enclosing.element")
        return (enclosing or "events").strip().strip("</>").split("/")[-1] or "events"


MAPPERS = {"json": JsonMapper, "text": TextMapper, "csv": CsvMapper, "keyvalue": KeyValueMapper, "xml": XmlMapper}


def spec_of(mapping, default: str = "json") -> MapSpec:
    """A MapSpec from a parsed `@map` annotation (or the default map when there is none)."""
    if mapping is None:
        return MapSpec(default)
    options = tuple((e.key, e.value) for e in mapping.elements if e.key is not None and e.key.lower() != "type")
    attributes: tuple = ()
    payload = None
    for nested in mapping.annotations:
        if nested.name.lower() == "attributes":
            attributes = tuple((e.key, e.value) for e in nested.elements)
        elif nested.name.lower() == "payload" and nested.elements:
            payload = nested.elements[0].value
    return MapSpec((mapping.get("type") or default).lower(), options, attributes, payload)


__all__ = ["MapSpec", "mapper_for", "spec_of", "schema_of"]
