"""Event codecs: a stream's rows to message bytes and back, with type checks on the way in."""

from __future__ import annotations

import itertools
import json
import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from sp_dagster.messaging import batches
from sp_dagster.messaging.errors import CodecError, EventDecodeError

SIDDHI_TYPES = ("string", "int", "long", "float", "double", "bool", "object")
_LENGTH = struct.Struct("<I")
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


_EXACT = {"string": str, "double": float, "float": float, "bool": bool}
_PLAIN = object()  # a message decode_many read in the common shape


def checker(attribute: Attribute):
    """check_value for one attribute, with the common case (the value already of its type) first."""
    exact = _EXACT.get(attribute.type)
    if attribute.type in _INT_RANGE:
        low, high = _INT_RANGE[attribute.type]

        def in_range(value):
            return value if type(value) is int and low <= value <= high else check_value(attribute, value)

        return in_range
    if exact is not None:

        def exactly(value):
            return value if type(value) is exact else check_value(attribute, value)

        return exactly
    return lambda value: check_value(attribute, value)


class Codec:
    """Encodes one row (values in attribute order) per message; decodes a message to rows."""

    name = "codec"

    def __init__(self, attributes: Sequence[Attribute | tuple[str, str]]):
        self.attributes = schema_of(attributes)
        self.names = tuple(a.name for a in self.attributes)

    def __reduce__(self):
        return (type(self), (self.attributes,))  # made again where it is unpickled (a Spark task): its struct packers cannot be pickled

    def encode(self, row: Sequence[Any]) -> bytes:
        """The message bytes of one row."""
        raise NotImplementedError

    def decode(self, data: bytes) -> list[tuple]:
        """The rows in one message; EventDecodeError says why a message is unusable."""
        raise NotImplementedError

    #: True when decode_many reads a poll's worth of messages faster than decode one by one.
    bulk = False

    def decode_many(self, values: Sequence[bytes]) -> list[list[tuple] | EventDecodeError]:
        """decode() of each message: its rows, or the EventDecodeError that says why it is unusable."""
        return [self._decoded(data) for data in values]

    def _decoded(self, data: bytes) -> list[tuple] | EventDecodeError:
        try:
            return self.decode(data)
        except EventDecodeError as exc:
            return exc

    def _check_width(self, row: Sequence[Any]) -> None:
        if len(row) != len(self.attributes):
            raise EventDecodeError(f"expected {len(self.attributes)} values ({', '.join(self.names)}), got {len(row)}")


class JsonCodec(Codec):
    """Siddhi's default JSON mapping: {"event": {"attr": value, ...}}.

    Decoding also takes a bare object, a list of values in attribute order, and a JSON array
    of any of these (several events in one message).
    """

    name = "json"

    def __init__(self, attributes: Sequence[Attribute | tuple[str, str]]):
        super().__init__(attributes)
        # orjson writes what json writes, except NaN and infinities (as null) and objects of any
        # type: rows that may hold those take json's path.
        self._fast = all(a.type != "object" for a in self.attributes)
        self._floats = tuple(i for i, a in enumerate(self.attributes) if a.type in ("float", "double"))
        self._checks = tuple((a.name, checker(a)) for a in self.attributes)
        get = operator.itemgetter(*self.names)
        self._get = get if len(self.names) > 1 else (lambda item: (get(item),))
        # Per column: the types its values may already have, and the range of an integer one (None: any value).
        self._columns = tuple((None, None) if a.type == "object" else ({_EXACT.get(a.type, int), type(None)}, _INT_RANGE.get(a.type)) for a in self.attributes)

    def encode(self, row):
        self._check_width(row)
        document = {"event": dict(zip(self.names, row))}
        if self._fast:
            for i in self._floats:
                value = row[i]
                if value is not None and value - value != 0:  # NaN or an infinity (x - x is NaN for both)
                    break
            else:
                try:
                    return orjson.dumps(document)
                except orjson.JSONEncodeError:  # integers wider than 64 bits
                    pass
        return json.dumps(document, separators=(",", ":"), default=str).encode("utf-8")

    def decode(self, data):
        try:
            document = orjson.loads(data)
        except orjson.JSONDecodeError:
            try:  # json's reading (NaN, wide integers) and its message
                document = json.loads(data)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise EventDecodeError(f"not valid JSON: {exc}") from None
        if type(document) is dict:  # the common case: one event
            return [self._row(document)]
        items = document if isinstance(document, list) and document and not _is_value_row(document, self) else [document]
        return [self._row(item) for item in items]

    bulk = True

    def decode_many(self, values):
        """decode() of each message, messages of the common shape (one object, values already of their types)
        read together: the values picked by one C call per message, their types checked a column at a time."""
        loads, get = orjson.loads, self._get
        found: list = []
        plain: list[tuple] = []  # rows of the messages in the common shape, in order
        for data in values:
            try:
                document = loads(data)
                if type(document) is not dict:
                    raise KeyError
                inner = document.get("event") if len(document) == 1 else None
                plain.append(get(inner if type(inner) is dict else document))
                found.append(_PLAIN)
            except (orjson.JSONDecodeError, KeyError):  # another shape, or a bad message: decode() says which
                found.append(self._decoded(data))
        if not plain:
            return found
        if self._clean(plain):
            rows = iter(plain)
            return [[next(rows)] if item is _PLAIN else item for item in found]
        return [self._decoded(data) if item is _PLAIN else item for data, item in zip(values, found)]

    def _clean(self, rows: list[tuple]) -> bool:
        """True when every value of `rows` is already of its attribute's type (and in its range)."""
        for column, (allowed, bounds) in zip(zip(*rows), self._columns):
            if allowed is None:
                continue
            if not set(map(type, column)) <= allowed:
                return False
            if bounds is not None:
                values = [v for v in column if v is not None] if None in column else column
                if values and (min(values) < bounds[0] or max(values) > bounds[1]):
                    return False
        return True

    def _row(self, item: Any) -> tuple:
        if isinstance(item, dict) and len(item) == 1 and isinstance(item.get("event"), dict):
            item = item["event"]
        if isinstance(item, dict):
            try:
                return tuple([check(item[name]) for name, check in self._checks])
            except KeyError:
                missing = [name for name in self.names if name not in item]
                raise EventDecodeError(f"missing attribute{'s' if len(missing) > 1 else ''} {', '.join(repr(m) for m in missing)}") from None
        if isinstance(item, list):
            self._check_width(item)
            return tuple(check_value(a, v) for a, v in zip(self.attributes, item))
        raise EventDecodeError(f"expected a JSON object with attributes {', '.join(self.names)}, got {type(item).__name__}")


def _is_value_row(document: list, codec: Codec) -> bool:
    """A JSON list of scalars is one event's values, not a list of events."""
    return not any(isinstance(item, (dict, list)) for item in document)


class BinaryCodec(Codec):
    """A compact binary form for inter-group topics: a null bitmap, then fixed-width values.

    A message may also hold a batch of such events (`batches.py`); decode() returns them all.

    Layout: magic byte 0xB1, ceil(n/8) bytes of null flags, then each non-null value:
    int i32, long i64, float f32, double f64, bool u8, string/object as u32 length + UTF-8
    (objects as JSON), all little-endian.
    """

    name = "binary"
    MAGIC = 0xB1
    _FIXED = {"int": "<i", "long": "<q", "float": "<f", "double": "<d", "bool": "<?"}
    _HEAD = bytes([MAGIC])

    def __init__(self, attributes: Sequence[Attribute | tuple[str, str]]):
        super().__init__(attributes)
        self._packers = tuple((struct.Struct(self._FIXED[a.type]) if a.type in self._FIXED else None, a.type) for a in self.attributes)
        self._flag_bytes = (len(self.attributes) + 7) // 8
        self._no_nulls = bytes(self._flag_bytes)
        self._plain_head = self._HEAD + self._no_nulls
        # Most rows have no nulls and no objects: each run of fixed-width values is then one pack call.
        self._runs = None if any(a.type == "object" for a in self.attributes) else self._fixed_runs()
        self._readers = (
            None if self._runs is None else [(None if pack is None else struct.Struct(pack.__self__.format), first) for pack, first, _end in self._runs]
        )

    def _plain(self, data: bytes) -> tuple:
        """A row without nulls or objects: each run of fixed-width values is one unpack call."""
        pos, values = len(self._plain_head), []
        for reader, _first in self._readers:  # type: ignore[union-attr]
            if reader is None:
                (length,) = _LENGTH.unpack_from(data, pos)
                pos += 4
                end = pos + length
                if end > len(data):
                    raise struct.error("truncated string")
                values.append(data[pos:end].decode("utf-8"))
                pos = end
            else:
                values += reader.unpack_from(data, pos)
                pos += reader.size
        if pos != len(data):
            raise struct.error("trailing bytes")
        return tuple(values)

    def _fixed_runs(self) -> list[tuple[Any, int, int]]:
        """(pack, first, end) per run of fixed-width attributes, (None, i, i + 1) per string attribute."""
        runs: list[tuple[Any, int, int]] = []
        for fixed, group in itertools.groupby(enumerate(self.attributes), key=lambda item: item[1].type in self._FIXED):
            items = list(group)
            if fixed:
                codes = "".join(self._FIXED[a.type][1:] for _index, a in items)
                runs.append((struct.Struct(f"<{codes}").pack, items[0][0], items[-1][0] + 1))
            else:
                runs += [(None, index, index + 1) for index, _a in items]
        return runs

    def encode(self, row):
        runs = self._runs
        if runs is not None and len(row) == len(self.attributes) and None not in row:
            parts = [self._plain_head]
            for pack, first, end in runs:
                if pack is None:
                    value = row[first]
                    raw = (value if type(value) is str else str(value)).encode("utf-8")
                    parts += (_LENGTH.pack(len(raw)), raw)
                else:
                    parts.append(pack(*row[first:end]))
            return b"".join(parts)
        self._check_width(row)
        flags = None
        parts = [self._HEAD, b""]
        for index, ((packer, kind), value) in enumerate(zip(self._packers, row)):
            if value is None:
                if flags is None:
                    flags = bytearray(self._flag_bytes)
                flags[index >> 3] |= 1 << (index & 7)
            elif packer is not None:
                parts.append(packer.pack(value))
            else:
                text = value if kind == "string" and isinstance(value, str) else str(value) if kind == "string" else json.dumps(value, default=str)
                raw = text.encode("utf-8")
                parts.append(_LENGTH.pack(len(raw)))
                parts.append(raw)
        parts[1] = bytes(flags) if flags is not None else self._no_nulls
        return b"".join(parts)

    def decode(self, data):
        if data and data[0] == batches.MAGIC:  # a batch of events (inter-group topics): every one of them
            values = batches.decode(data, self)[3]
            return values if not values or type(values[0]) is tuple else [row for value in values for row in self.decode(value)]
        if not data or data[0] != self.MAGIC:
            raise EventDecodeError("not a binary-encoded event (wrong codec on this topic?)")
        if self._readers is not None and data.startswith(self._plain_head):
            try:
                return [self._plain(data)]
            except (struct.error, UnicodeDecodeError):
                pass  # the slow path below says what is wrong
        flags_end = 1 + self._flag_bytes
        flags, pos, values = data[1:flags_end], flags_end, []
        try:
            for index, (packer, kind) in enumerate(self._packers):
                if flags[index >> 3] & (1 << (index & 7)):
                    values.append(None)
                elif packer is not None:
                    values.append(packer.unpack_from(data, pos)[0])
                    pos += packer.size
                else:
                    (length,) = _LENGTH.unpack_from(data, pos)
                    pos += 4
                    raw = data[pos : pos + length]
                    if len(raw) != length:
                        raise struct.error("truncated string")
                    pos += length
                    value = raw.decode("utf-8")
                    values.append(json.loads(value) if kind == "object" else value)
        except (struct.error, IndexError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EventDecodeError(f"truncated or corrupt binary event: {exc}") from None
        if pos != len(data):
            raise EventDecodeError(f"binary event has {len(data) - pos} unexpected trailing bytes")
        return [tuple(values)]

    def encode_columns(self, rows: Sequence[Sequence[Any]]) -> bytes:
        """Rows as columns (a version-2 batch's values, `batches.py`): per attribute a flag byte (1: a null bitmap
        follows), then its non-null values: fixed-width ones packed together, strings and objects as u32 lengths + UTF-8."""
        if not rows:
            return b""
        if set(map(len, rows)) != {len(self.attributes)}:
            for row in rows:
                self._check_width(row)
        parts: list[bytes] = []
        for (packer, kind), column in zip(self._packers, zip(*rows)):
            if None in column:
                flags = bytearray(self._bitmap_bytes(len(column)))
                for index, value in enumerate(column):
                    if value is None:
                        flags[index >> 3] |= 1 << (index & 7)
                parts += (b"\x01", bytes(flags))
                column = tuple(v for v in column if v is not None)
            else:
                parts.append(b"\x00")
            if packer is not None:
                parts.append(struct.pack(f"<{len(column)}{packer.format[1:]}", *column))
                continue
            if kind == "object":
                texts = [json.dumps(v, default=str) for v in column]
            else:
                texts = column if set(map(type, column)) <= {str} else [v if type(v) is str else str(v) for v in column]
            joined = "".join(texts)
            blob = joined.encode("utf-8")
            lengths = map(len, texts) if len(blob) == len(joined) else [len(t.encode("utf-8")) for t in texts]
            parts += (struct.pack(f"<{len(texts)}I", *lengths), blob)
        return b"".join(parts)

    def decode_columns(self, data: bytes, pos: int, count: int) -> list[tuple]:
        """The rows of `count` events written by encode_columns from `pos` to the end of `data`."""
        columns: list = []
        try:
            for packer, kind in self._packers:
                flag = data[pos]
                pos += 1
                nulls = None
                if flag == 1:
                    end = pos + self._bitmap_bytes(count)
                    bitmap = data[pos:end]
                    pos = end
                    nulls = [bool(bitmap[i >> 3] & (1 << (i & 7))) for i in range(count)]
                elif flag != 0:
                    raise EventDecodeError(f"unknown column flag {flag}")
                present = count - sum(nulls) if nulls else count
                if packer is not None:
                    values = struct.unpack_from(f"<{present}{packer.format[1:]}", data, pos)
                    pos += present * packer.size
                else:
                    values, pos = self._texts(data, pos, present, kind)
                if nulls:
                    taken = iter(values)
                    values = [None if null else next(taken) for null in nulls]
                columns.append(values)
        except (struct.error, IndexError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EventDecodeError(f"truncated or corrupt columns: {exc}") from None
        if pos != len(data):
            raise EventDecodeError(f"{len(data) - pos} unexpected trailing bytes after the columns")
        return list(zip(*columns))

    @staticmethod
    def _texts(data: bytes, pos: int, present: int, kind: str) -> tuple[list, int]:
        """A string (or object) column's values from `pos` on, and where they end."""
        lengths = struct.unpack_from(f"<{present}I", data, pos)
        pos += 4 * present
        end = pos + sum(lengths)
        if end > len(data):
            raise struct.error("truncated strings")
        blob = data[pos:end]
        text = blob.decode("utf-8")
        ends = list(itertools.accumulate(lengths, initial=0))
        if len(text) == len(blob):  # ASCII: a character per byte, cut the text itself
            values = [text[a:b] for a, b in zip(ends, ends[1:])]
        else:
            values = [blob[a:b].decode("utf-8") for a, b in zip(ends, ends[1:])]
        return ([json.loads(v) for v in values] if kind == "object" else values), end

    @staticmethod
    def _bitmap_bytes(count: int) -> int:
        return (count + 7) // 8


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
