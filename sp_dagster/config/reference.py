"""The configuration reference, generated from the typed model so the docs never drift."""

from __future__ import annotations

import dataclasses
import typing

from sp_dagster.config.model import (
    Carbon,
    ClusterConfig,
    DagsterConfig,
    DeploymentConfig,
    MetricsConfig,
    PersistenceConfig,
    SiddhiConfig,
    SparkConfig,
)

SECTIONS = (
    ("wso2.carbon", Carbon),
    ("cluster.config", ClusterConfig),
    ("deployment.config", DeploymentConfig),
    ("state.persistence", PersistenceConfig),
    ("siddhi", SiddhiConfig),
    ("spark", SparkConfig),
    ("dagster", DagsterConfig),
    ("metrics", MetricsConfig),
)


def _type_name(hint: typing.Any) -> str:
    origin = typing.get_origin(hint)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if origin is tuple:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return "mapping"
    if args and origin is not None:
        return _type_name(args[0])
    return {int: "integer", float: "number", str: "string", bool: "boolean"}.get(hint, "section")


def _default(field: dataclasses.Field) -> str:
    if field.metadata.get("shown"):
        return f"`{field.metadata['shown']}`"
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
        if dataclasses.is_dataclass(value) or value in ({}, ()):
            return ""
        return repr(value)
    if field.default is dataclasses.MISSING:
        return "required"
    return "" if field.default is None else f"`{field.default}`"


def _summary(cls: type) -> str:
    """The first line of a section's docstring, without its leading `key:`."""
    first = (cls.__doc__ or "").strip().splitlines()[0]
    return first.split(": ", 1)[1] if first.startswith("`") and ": " in first else first


def reference_rows(prefix: str, cls: type) -> list[tuple[str, str, str, str]]:
    """(key path, type, default, description) for every key of a section, depth first."""
    rows = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if "key" not in field.metadata:
            continue
        path = f"{prefix}.{field.metadata['key']}"
        hint = hints[field.name]
        inner = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        nested = next((a for a in inner if dataclasses.is_dataclass(a)), None)
        if typing.get_origin(hint) is tuple:
            nested = typing.get_args(hint)[0]
            path += "[]"
        description = field.metadata.get("doc") or ""
        if field.metadata.get("choices"):
            choices = "one of " + ", ".join(f"`{c}`" for c in field.metadata["choices"])
            description = f"{description}: {choices}" if description else choices
        if isinstance(nested, type) and dataclasses.is_dataclass(nested):
            rows.append((path, "section", "", _summary(nested)))
            rows.extend(reference_rows(path, nested))
        else:
            rows.append((path, _type_name(hint), _default(field), description))
    return rows


def reference_markdown() -> str:
    """The whole reference as a Markdown table."""
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, cls in SECTIONS:
        lines.append(f"| **`{name}`** | section | | {_summary(cls)} |")
        for path, kind, default, description in reference_rows(name, cls):
            lines.append(f"| `{path}` | {kind} | {default} | {description} |")
    return "\n".join(lines)
