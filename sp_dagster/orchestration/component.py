"""sp-dagster as a Dagster Component: a `defs.yaml` naming the app repository and the configuration gives what build_definitions gives.
The component is registered with `dg`; its attributes and the names a `translation:` may use are
in docs/dagster.md (As a Dagster Component).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import dagster as dg
from dagster.components.utils.translation import TranslationFn, TranslationFnResolver
from pydantic import Field

from sp_dagster.orchestration.assets import SiddhiAssetProps, SpDagsterTranslator
from sp_dagster.orchestration.errors import ComponentError


def _template_vars(props: SiddhiAssetProps) -> dict:
    """What a `translation:` block may name."""
    name = {"partial_app": (props.group or {}).get("name"), "topic": (props.topic or {}).get("name"), "aggregation": (props.aggregation or {}).get("name")}
    return {"kind": props.kind, "app": props.app, "name": name.get(props.kind), "props": props}


class _Translated(SpDagsterTranslator):
    """The default specs, then the component's `translation:`."""

    def __init__(self, translation: TranslationFn[SiddhiAssetProps]):
        self.translation = translation

    def get_asset_spec(self, props: SiddhiAssetProps) -> dg.AssetSpec:
        """The default spec with the translation's attributes."""
        return self.translation(super().get_asset_spec(props), props)


class SpDagsterComponent(dg.Component, dg.Resolvable, dg.Model):
    """The sp-dagster definitions (sensor, jobs, schedules, partial apps as assets) from a defs.yaml."""

    app_repository: str | None = Field(default=None, description="the directory of *.siddhi files the sensor deploys (default: dagster.appRepository)")
    conf: str | None = Field(default=None, description="a conf directory or the manager's deployment.yaml (default: the search order)")
    worker_conf: str | None = Field(default=None, description="the workers' deployment.yaml (default: conf's worker/, else the search order)")
    translation: Annotated[TranslationFn[SiddhiAssetProps], TranslationFnResolver[SiddhiAssetProps](_template_vars)] | None = Field(
        default=None, description="asset attributes (key, group_name, owners, tags, metadata, ...) applied to every asset"
    )

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        """build_definitions with this component's paths, relative ones taken from its folder; a path that does not exist is refused."""
        from sp_dagster.orchestration.definitions import build_definitions

        def here(setting: str, value: str | None) -> str | None:
            if not value:
                return None
            path = (Path(context.path) / value).resolve()
            if not path.exists():
                raise ComponentError(
                    f"{Path(context.path) / 'defs.yaml'}: {setting} '{value}' ({path}) does not exist; name "
                    + ("a conf directory or a manager's deployment.yaml" if setting != "app_repository" else "the folder of your .siddhi apps")
                    + " (relative paths start at the defs.yaml's folder)"
                )
            return str(path)

        conf = here("conf", self.conf)
        worker_conf = here("worker_conf", self.worker_conf) or (conf if conf and Path(conf).is_dir() else None)
        translator = _Translated(self.translation) if self.translation is not None else None
        return build_definitions(conf, worker_conf, translator, app_repository=here("app_repository", self.app_repository))
