"""Siddhi attribute types as Spark and Arrow types, and the metadata columns of topic rows."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pyarrow as pa

from sp_dagster.messaging.codecs import Attribute, schema_of

_SPARK = {"string": "string", "int": "int", "long": "bigint", "float": "float", "double": "double", "bool": "boolean", "object": "string"}
_ARROW = {
    "string": pa.string(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bool": pa.bool_(),
    "object": pa.string(),
}

# Columns every row read from a topic carries besides the stream's attributes.
META_COLUMNS = (("_partition", "int", pa.int32()), ("_offset", "bigint", pa.int64()), ("_timestamp", "bigint", pa.int64()))
# Columns of a rejected (undecodable) message, for the dead-letter path.
REJECT_COLUMNS = (("_error", "string", pa.string()), ("_raw", "binary", pa.binary()))


# Rows of the raw form: messages as they are, decoded later (several streams in one frame).
RAW_COLUMNS = (
    ("_topic", "string", pa.string()),
    ("_partition", "int", pa.int32()),
    ("_offset", "bigint", pa.int64()),
    ("_timestamp", "bigint", pa.int64()),
    ("_key", "binary", pa.binary()),
    ("_value", "binary", pa.binary()),
    ("_origin", "binary", pa.binary()),  # the sp-origin header: which upstream event this one stems from
)
RAW_DDL = ", ".join(f"`{name}` {kind}" for name, kind, _ in RAW_COLUMNS)
RAW_SCHEMA = pa.schema([pa.field(name, arrow_type) for name, _, arrow_type in RAW_COLUMNS])


def attributes_option(attributes: Sequence[Attribute | tuple[str, str]]) -> str:
    """Serialize a stream's attributes for a data source option."""
    return json.dumps([[a.name, a.type] for a in schema_of(attributes)])


def parse_attributes_option(text: str) -> tuple[Attribute, ...]:
    """Read back attributes_option()."""
    return schema_of([tuple(pair) for pair in json.loads(text)])


def spark_ddl(attributes: Sequence[Attribute], with_meta: bool = True) -> str:
    """The Spark DDL schema of a stream's rows (attribute names are back-quoted)."""
    columns = [f"`{a.name}` {_SPARK[a.type]}" for a in attributes]
    if with_meta:
        columns += [f"`{name}` {kind}" for name, kind, _ in META_COLUMNS + REJECT_COLUMNS]
    return ", ".join(columns)


def arrow_schema(attributes: Sequence[Attribute], with_meta: bool = True) -> pa.Schema:
    """The Arrow schema matching spark_ddl()."""
    fields = [pa.field(a.name, _ARROW[a.type]) for a in attributes]
    if with_meta:
        fields += [pa.field(name, arrow_type) for name, _, arrow_type in META_COLUMNS + REJECT_COLUMNS]
    return pa.schema(fields)
