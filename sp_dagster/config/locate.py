"""Where a command's deployment.yaml comes from: --conf, $SP_DAGSTER_CONF, the stack `up` started, ./conf, $SP_DAGSTER_HOME/conf, the packaged defaults.
A value of --conf or of a variable names a deployment.yaml or a conf directory; workers read
$SP_DAGSTER_WORKER_CONF first (docs/configuration.md has the whole order).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

CONF_ENV = "SP_DAGSTER_CONF"
ROLE_ENV = {"worker": "SP_DAGSTER_WORKER_CONF"}
CONF_FILE = "deployment.yaml"
STACK_RECORD = "up.json"  # under $SP_DAGSTER_HOME: what `sp-dagster up` started, written by orchestration/demo.py
STACK_SOURCE = "the stack `sp-dagster up` started"
SEARCH_ORDER = f"--conf, $SP_DAGSTER_CONF, {STACK_SOURCE} ($SP_DAGSTER_HOME/{STACK_RECORD}), ./conf/, $SP_DAGSTER_HOME/conf/, the packaged defaults"


@dataclass(frozen=True)
class ConfLocation:
    """One role's deployment.yaml and which step of the search order found it."""

    path: Path
    source: str

    def describe(self) -> str:
        """`PATH (from SOURCE)`, and whether it is missing."""
        return f"{self.path} (from {self.source})" + ("" if self.path.is_file() else ": no such file")


def defaults_root() -> Path:
    """The packaged defaults (`conf/`, `apps/`): inside the wheel, else the source tree this package runs from.

    The wheel holds copies of the repository's `conf/` and sample app under `sp_dagster/_defaults`, so an installed
    sp-dagster runs from any directory."""
    packaged = Path(__file__).resolve().parents[1] / "_defaults"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[2]


def _named(value: str, role: str, source: str) -> ConfLocation:
    """A conf directory's `<role>/deployment.yaml`, else the value as a file (a missing one fails when it is loaded)."""
    path = Path(value).expanduser().resolve()
    return ConfLocation(path / role / CONF_FILE if path.is_dir() else path, source)


def stack_record() -> Path:
    """Where `sp-dagster up` records its stack: $SP_DAGSTER_HOME/up.json."""
    from sp_dagster.config.yamlsource import default_home

    return Path(default_home()).expanduser().resolve() / STACK_RECORD


def stack_conf(role: str) -> Path | None:
    """The `role`'s deployment.yaml of the stack `up` recorded, or None (no record, or one naming no such file).

    While `sp-dagster up` runs, its record names the confs it wrote for its stack (its broker's address, its apps
    folder), so `deploy`, `consume` and the rest reach that stack; `down` removes the record."""
    try:
        facts = json.loads(stack_record().read_text(encoding="utf-8")).get("facts")
        path = Path(facts["conf"][role])
    except (OSError, ValueError, AttributeError, KeyError, TypeError):  # no record, or one `down` will report
        return None
    return path if path.is_file() else None


def find_conf(role: str = "manager", explicit: str | os.PathLike | None = None, *, stack: bool = True) -> ConfLocation:
    """The deployment.yaml a `role` node reads, by the search order above (`stack=False`: skipping the stack's, as `up` does)."""
    from sp_dagster.config.yamlsource import default_home

    if explicit:
        return _named(str(explicit), role, "--conf")
    for variable in (ROLE_ENV.get(role), CONF_ENV):
        if variable and os.environ.get(variable):
            return _named(os.environ[variable], role, f"${variable}")
    recorded = stack_conf(role) if stack else None
    if recorded is not None:
        return ConfLocation(recorded, f"{STACK_SOURCE}, recorded in {stack_record()}")
    for directory, source in ((Path.cwd() / "conf", "./conf/"), (Path(default_home()) / "conf", "$SP_DAGSTER_HOME/conf/")):
        if (directory / role / CONF_FILE).is_file():
            return ConfLocation((directory / role / CONF_FILE).resolve(), source)
    return ConfLocation(defaults_root() / "conf" / role / CONF_FILE, "the packaged defaults")


def conf_path(role: str = "manager", explicit: str | os.PathLike | None = None) -> str:
    """find_conf(...).path as a string."""
    return str(find_conf(role, explicit).path)
