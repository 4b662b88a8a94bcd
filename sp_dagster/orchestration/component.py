"""sp-dagster as a Dagster Component: a `defs.yaml` naming the app repository and the configuration gives what build_definitions gives.

type: sp_dagster.dagster.SpDagsterComponent
attributes:
  app_repository: apps          # relative paths: to the defs.yaml's folder
  conf: conf                    # a conf directory or the manager's deployment.yaml
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import Field


class SpDagsterComponent(dg.Component, dg.Resolvable, dg.Model):
    """The sp-dagster definitions (sensor, jobs, schedules, partial apps as assets) from a defs.yaml."""

    app_repository: str | None = Field(default=None, description="the directory of *.siddhi files the sensor deploys (default: dagster.appRepository)")
    conf: str | None = Field(default=None, description="a conf directory or the manager's deployment.yaml (default: the search order)")
    worker_conf: str | None = Field(default=None, description="the workers' deployment.yaml (default: conf's worker/, else the search order)")

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        """build_definitions with this component's paths, relative ones taken from its folder."""
        from sp_dagster.orchestration.definitions import build_definitions

        def here(value: str | None) -> str | None:
            return str((Path(context.path) / value).resolve()) if value else None

        conf = here(self.conf)
        worker_conf = here(self.worker_conf) or (conf if conf and Path(conf).is_dir() else None)
        return build_definitions(conf, worker_conf, app_repository=here(self.app_repository))
