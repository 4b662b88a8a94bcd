"""YAML documents that remember where each value came from, with `${ENV}` references resolved."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sp_dagster.errors import ConfigError

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# WSO2 Carbon's placeholders: ${sys:java.property}, ${env:VAR}, ${sec:vault.alias}.
_CARBON_REF = re.compile(r"\$\{(sys|env|sec):([^}]*)\}")
# Tabs in the blank run before a comment or the end of a line (WSO2's printed files have them); YAML forbids them there.
_TAB_RUN = re.compile(r"[ \t]*\t[ \t]*(?=#|$)", re.MULTILINE)


def default_home() -> str:
    """The data directory of the embedded defaults: $SP_DAGSTER_HOME, else ~/.sp-dagster."""
    return os.environ.get("SP_DAGSTER_HOME") or str(Path("~/.sp-dagster").expanduser())


@dataclass(frozen=True)
class Mark:
    """A position in a file: 1-based line and column."""

    line: int
    column: int


class LocatedDict(dict):
    """A mapping that also knows the position of each of its values."""

    def __init__(self, mark: Mark | None = None):
        super().__init__()
        self.mark = mark
        self.marks: dict[Any, Mark] = {}
        self.key_marks: dict[Any, Mark] = {}


class LocatedList(list):
    """A sequence that also knows the position of each of its items."""

    def __init__(self, mark: Mark | None = None):
        super().__init__()
        self.mark = mark
        self.marks: dict[int, Mark] = {}


def _mark(node: yaml.Node) -> Mark:
    return Mark(node.start_mark.line + 1, node.start_mark.column + 1)


def _carbon(kind: str, name: str, where: str, env) -> str:
    """One Carbon placeholder: ${sys:carbon.home} is $SP_DAGSTER_HOME, another ${sys:a.b} reads $A_B, ${env:VAR} reads $VAR."""
    if kind == "sec":
        raise ConfigError(
            f"{where}: ${{sec:{name}}} is a WSO2 secure-vault alias, which sp-dagster does not read; put the secret in an environment variable and write ${{VAR}}"
        )
    if kind == "sys" and name == "carbon.home":
        return default_home()
    variable = name if kind == "env" else re.sub(r"\W", "_", name).upper()
    if env.get(variable):
        return env[variable]
    what = f"${{sys:{name}}} is a Java system property; sp-dagster reads it from ${variable}" if kind == "sys" else f"${{env:{name}}} reads ${variable}"
    raise ConfigError(f"{where}: {what}, which is not set; export it (${{sys:carbon.home}} is $SP_DAGSTER_HOME)")


def resolve_env(text: str, where: str, env: Mapping[str, str] | None = None) -> str:
    """Replace each `${VAR}`, `${VAR:-default}` and Carbon `${sys:...}`/`${env:...}` in text; an unset one without default is an error."""
    env = os.environ if env is None else env
    text = _CARBON_REF.sub(lambda match: _carbon(match.group(1), match.group(2), where, env), text)

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env and env[name] != "":
            return env[name]
        if default is not None:
            return default
        if name == "SP_DAGSTER_HOME":
            return default_home()
        raise ConfigError(f"{where}: environment variable {name} is not set; export it, or give a default as ${{{name}:-value}}")

    return _ENV_REF.sub(substitute, text)


class _Builder:
    def __init__(self, filename: str):
        self.filename = filename
        self.loader = yaml.SafeLoader("")

    def where(self, node: yaml.Node) -> str:
        mark = _mark(node)
        return f"{self.filename}:{mark.line}:{mark.column}"

    def build(self, node: yaml.Node) -> Any:
        if isinstance(node, yaml.MappingNode):
            self.loader.flatten_mapping(node)
            result = LocatedDict(_mark(node))
            for key_node, value_node in node.value:
                key = self.loader.construct_object(key_node, deep=True)
                if not isinstance(key, str):
                    key = str(key)
                if key in result:
                    raise ConfigError(f"{self.where(key_node)}: key '{key}' appears twice in the same section")
                result[key] = self.build(value_node)
                result.marks[key] = _mark(value_node)
                result.key_marks[key] = _mark(key_node)
            return result
        if isinstance(node, yaml.SequenceNode):
            result = LocatedList(_mark(node))
            for index, item in enumerate(node.value):
                result.append(self.build(item))
                result.marks[index] = _mark(item)
            return result
        value = self.loader.construct_object(node, deep=True)
        if isinstance(value, str) and "${" in value:
            resolved = resolve_env(value, self.where(node))
            if _ENV_REF.fullmatch(value.strip()):
                # A value that is one reference takes the type its text has: "2000" is a number.
                try:
                    typed = yaml.safe_load(resolved) if resolved.strip() else resolved
                except yaml.YAMLError:
                    typed = resolved
                return typed if isinstance(typed, (int, float, bool, str)) else resolved
            return resolved
        return value


def load_yaml(path: str | Path) -> LocatedDict:
    """Read a YAML file into LocatedDicts; syntax errors name the file, line and column."""
    filename = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{filename}: no such file; pass the path of a deployment.yaml (see conf/)") from None
    except OSError as exc:
        raise ConfigError(f"{filename}: cannot be read: {exc.strerror}") from None
    return parse_yaml(text, filename)


def parse_yaml(text: str, filename: str = "<string>") -> LocatedDict:
    """Parse YAML text into LocatedDicts (an empty document is an empty mapping)."""
    text = _TAB_RUN.sub(lambda match: " " * len(match.group()), text)  # one space per tab: columns stay right
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        position = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        if "'\\t'" in problem:
            problem += " (a tab; YAML indents with spaces)"
        raise ConfigError(f"{filename}{position}: invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{filename}: invalid YAML: {exc}") from None
    if node is None:
        return LocatedDict(Mark(1, 1))
    result = _Builder(filename).build(node)
    if not isinstance(result, LocatedDict):
        raise ConfigError(f"{filename}:1:1: expected a mapping of sections (such as deployment.config:) at the top level")
    return result
