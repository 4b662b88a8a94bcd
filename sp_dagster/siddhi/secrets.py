"""Secrets in SiddhiQL text: the literal values of secret-bearing annotation options, masked wherever an app is shown.
What is stored and run keeps the real text; only displays (Dagster metadata, `plan`, logs) go
through `mask_secrets`. Which options are secret: docs/sources-sinks.md (Secrets in options).
"""

from __future__ import annotations

import re

MASK = "***"

_SECRET_OPTION = re.compile(
    r"""(?P<key>(?<![\w.])(?:[\w.]*password|sasl\.[\w.]+|ssl\.[\w.]+))(?P<eq>\s*=\s*)(?P<quote>\"\"\"|'|")(?P<value>.*?)(?P=quote)""",
    re.IGNORECASE | re.DOTALL,
)
# Kafka-style properties inside one option's value (optional.configuration='sasl.password:x,ssl.key.password:y').
_SECRET_PROPERTY = re.compile(r"(?P<key>(?<![\w.])(?:[\w.]*password|sasl\.[\w.]+|ssl\.[\w.]+))(?P<eq>\s*:\s*)(?P<value>[^,'\"]*)", re.IGNORECASE)


def _placeholder(value: str) -> bool:
    return value.startswith("${") and value.endswith("}")


def mask_secrets(text: str) -> str:
    """`text` with every literal secret option value replaced by `***` (placeholders kept)."""

    def option(match: re.Match) -> str:
        value = match["value"]
        shown = value if _placeholder(value) or not value else MASK
        return f"{match['key']}{match['eq']}{match['quote']}{shown}{match['quote']}"

    def inner(match: re.Match) -> str:
        value = match["value"].strip()
        return match[0] if not value or _placeholder(value) else f"{match['key']}{match['eq']}{MASK}"

    return _SECRET_PROPERTY.sub(inner, _SECRET_OPTION.sub(option, text))


def resolve_placeholders(value: str | None, where: str) -> str | None:
    """`value` with each `${VAR}` (or `${VAR:-default}`) taken from this process's environment, where the
    partial app runs; ConfigError naming `where` and the variable when one is not set."""
    if value is None or "${" not in value:
        return value
    from sp_dagster.config.yamlsource import resolve_env

    return resolve_env(value, where)


def resolved_properties(properties: tuple[tuple[str, str], ...], where: str) -> tuple[tuple[str, str], ...]:
    """Kafka client properties (`optional.configuration`) with their placeholders resolved."""
    return tuple((key, resolve_placeholders(value, f"{where}: {key}") or "") for key, value in properties)
