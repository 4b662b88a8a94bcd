"""Event codecs: a stream's rows to message bytes and back, with type checks on the way in."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, Sequence

from sp_dagster.messaging.errors import CodecError, EventDecodeError

SIDDHI_TYPES = ("string", "int", "long", "float", "double", "bool", "object")
_INT_RANGE = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


@dataclass(frozen=True)
class Attribute:
    """One attribute of a stream: a name and a Siddhi type."""

    name: str
    type: str

    def __post_init__(self) -> None:
        if self.type not in SIDDHI_TYPES:
            raise CodecError(f"attribute '{self.name}': unknown type '{self.type}'; expected one of {', '.join(SIDDHI_TYPES)}")


def schema_of(attributes: Sequence[Attribute | tuple[str, str]]) -> tuple[Attribute, ...]:
    """Normalize (name, type) pairs to Attributes."""
    return tuple(a if isinstance(a, Attribute) else Attribute(*a) for a in attributes)


def check_value(attribute: Attribute, value: Any) -> Any:
    """Return value if it fits the attribute's type (ints widen to float/double), else raise."""
    if value is None:
        return None
    kind = attribute.type
    if kind in ("int", "long"):
        if isinstance(value, int) and not isinstance(value, bool):
            low, high = _INT_RANGE[kind]
            if low <= value <= high:
                return value
            raise EventDecodeError(f"attribute '{attribute.name}': {value} is out of range for {kind}")
    elif kind in ("float", "double"):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind == "string":
        if isinstance(value, str):
            return value
    elif kind == "bool":
        if isinstance(value, bool):
            return value
    else:
        return value
    raise EventDecodeError(f"attribute '{attribute.name}': expected {kind}, got {type(value).__name__} {value!r}")


class Codec:
    """Encodes one row (values in attribute order) per message; decodes a message to rows."""

    name = "codec"

    def __init__(self, attributes: Sequence[Attribute | tuple[str, str]]):
        self.attributes = schema_of(attributes)
        self.names = tuple(a.name for a in self.attributes)

    def encode(self, row: Sequence[Any]) -> bytes:
        """The message bytes of one row."""
        raise NotImplementedError

    def decode(self, data: bytes) -> list[tuple]:
        """The rows in one message; EventDecodeError says why a message is unusable."""
        raise NotImplementedError

    def _check_width(self, row: Sequence[Any]) -> None:
        if len(row) != len(self.attributes):
            raise EventDecodeError(f"expected {len(self.attributes)} values ({', '.join(self.names)}), got {len(row)}")


class JsonCodec(Codec):
    """Siddhi's default JSON mapping: {"event": {"attr": value, ...}}.

    Decoding also takes a bare object, a list of values in attribute order, and a JSON array
    of any of these (several events in one message).
    """

    name = "json"

    def encode(self, row):
        self._check_width(row)
        event = dict(zip(self.names, row))
        return json.dumps({"event": event}, separators=(",", ":"), default=str).encode("utf-8")

    def decode(self, data):
        try:
            document = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EventDecodeError(f"not valid JSON: {exc}") from None
        items = document if isinstance(document, list) and document and not _is_value_row(document, self) else [document]
        return [self._row(item) for item in items]

    def _row(self, item: Any) -> tuple:
        if isinstance(item, dict) and set(item) == {"event"} and isinstance(item["event"], dict):
            item = item["event"]
        if isinstance(item, dict):
            missing = [name for name in self.names if name not in item]
            if missing:
                raise EventDecodeError(f"missing attribute{'s' if len(missing) > 1 else ''} {', '.join(repr(m) for m in missing)}")
            return tuple(check_value(a, item[a.name]) for a in self.attributes)
        if isinstance(item, list):
            self._check_width(item)
            return tuple(check_value(a, v) for a, v in zip(self.attributes, item))
        raise EventDecodeError(f"expected a JSON object with attributes {', '.join(self.names)}, got {type(item).__name__}")


def _is_value_row(document: list, codec: Codec) -> bool:
    """A JSON list of scalars is one event's values, not a list of events."""
    return not any(isinstance(item, (dict, list)) for item in document)


class BinaryCodec(Codec):
    """A compact binary form for inter-group topics: a null bitmap, then fixed-width values.

    Layout: magic byte 0xB1, ceil(n/8) bytes of null flags, then each non-null value:
    int i32, long i64, float f32, double f64, bool u8, string/object as u32 length + UTF-8
    (objects as JSON), all little-endian.
    """

    name = "binary"
    MAGIC = 0xB1
    _FIXED = {"int": "<i", "long": "<q", "float": "<f", "double": "<d", "bool": "<?"}

    def encode(self, row):
        self._check_width(row)
        flags = bytearray((len(row) + 7) // 8)
        parts = [b""]
        for index, (attribute, value) in enumerate(zip(self.attributes, row)):
            if value is None:
                flags[index // 8] |= 1 << (index % 8)
                continue
            fmt = self._FIXED.get(attribute.type)
            if fmt:
                parts.append(struct.pack(fmt, value))
            else:
                text = value if attribute.type == "string" else json.dumps(value, default=str)
                raw = str(text).encode("utf-8")
                parts.append(struct.pack("<I", len(raw)) + raw)
        return bytes([self.MAGIC]) + bytes(flags) + b"".join(parts)

    def decode(self, data):
        if not data or data[0] != self.MAGIC:
            raise EventDecodeError("not a binary-encoded event (wrong codec on this topic?)")
        count = len(self.attributes)
        flags_end = 1 + (count + 7) // 8
        flags, pos, values = data[1:flags_end], flags_end, []
        try:
            for index, attribute in enumerate(self.attributes):
                if flags[index // 8] & (1 << (index % 8)):
                    values.append(None)
                    continue
                fmt = self._FIXED.get(attribute.type)
                if fmt:
                    (value,) = struct.unpack_from(fmt, data, pos)
                    pos += struct.calcsize(fmt)
                else:
                    (length,) = struct.unpack_from("<I", data, pos)
                    pos += 4
                    raw = bytes(data[pos : pos + length])
                    if len(raw) != length:
                        raise struct.error("truncated string")
                    pos += length
                    value = raw.decode("utf-8")
                    if attribute.type == "object":
                        value = json.loads(value)
                values.append(value)
        except (struct.error, IndexError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EventDecodeError(f"truncated or corrupt binary event: {exc}") from None
        if pos != len(data):
            raise EventDecodeError(f"binary event has {len(data) - pos} unexpected trailing bytes")
        return [tuple(values)]


class RawCodec(Codec):
    """Messages as they are: one `value` attribute holding the bytes (decoding happens later)."""

    name = "raw"

    def __init__(self, attributes: Sequence[Attribute | tuple[str, str]] = (("value", "object"),)):
        super().__init__(attributes)

    def encode(self, row):
        return bytes(row[0])

    def decode(self, data):
        return [(bytes(data),)]


CODECS = {"json": JsonCodec, "binary": BinaryCodec, "raw": RawCodec}


def codec_for(name: str, attributes: Sequence[Attribute | tuple[str, str]]) -> Codec:
    """A codec by name (json, binary) for a stream's attributes."""
    try:
        return CODECS[name.lower()](attributes)
    except KeyError:
        raise CodecError(f"unknown codec '{name}'; expected one of {', '.join(CODECS)}") from None

