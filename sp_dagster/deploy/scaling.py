"""`sp-dagster scale APP GROUP N`: the deployed app's text with one execution group at a new parallelism.
`parallel='N'` is written into every `@dist` of the group (added where a `@dist` names the group without
it), keeping the rest of the text as written, and the result is deployed as any new version is
(deploy.steps), which moves keyed state (deploy.rescale).
"""

from __future__ import annotations

import dataclasses
import re

from sp_dagster.deploy.errors import DeployError
from sp_dagster.deploy.steps import LoadedApp
from sp_dagster.siddhi import ast
from sp_dagster.topology.grouping import DEFAULT_GROUP
from sp_dagster.topology.model import USER

_PARALLEL = re.compile(r"(?<![A-Za-z_])parallel\s*=\s*(['\"])[^'\"]*\1", re.IGNORECASE)


def scaled_text(loaded: LoadedApp, exec_group: str, parallel: int) -> str:
    """The loaded app's text with `exec_group` at `parallel` instances; DeployError when it cannot be."""
    text, source, topology = loaded.text, loaded.source, loaded.topology
    group = next((g for g in topology.groups if g.exec_group == exec_group), None)
    user_groups = sorted(g.exec_group for g in topology.groups if g.kind == USER)
    if group is None or group.kind != USER:
        raise DeployError(f"{topology.app} has no execution group '{exec_group}' to scale; its groups are: {', '.join(user_groups) or 'none'}")
    if parallel < 1:
        raise DeployError(f"a group runs at least 1 instance, not {parallel}")
    if group.max_parallelism is not None and parallel > group.max_parallelism:
        raise DeployError(
            f"{exec_group} may grow to its maxParallel ({group.max_parallelism}), not to {parallel}: raise @dist(maxParallel) in "
            f"{source} and deploy it (its topics grow then; the embedded broker cannot add partitions to topics holding events)"
        )
    dists = [a for a in _dists(loaded.app) if (a.get("execGroup") or DEFAULT_GROUP) == exec_group]
    if not dists:
        raise DeployError(f"{exec_group} has no @dist to set its parallelism in; add @dist(execGroup='{exec_group}', parallel='{parallel}') in {source}")
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    edits = []
    for dist in dists:
        begin = starts[dist.line - 1] + dist.column - 1
        end = _closing(text, begin)
        inside = text[begin:end]
        found = _PARALLEL.search(inside)
        replacement = f"parallel='{parallel}'"
        edits.append((begin + found.start(), begin + found.end(), replacement) if found else (end, end, f", {replacement}"))
        if group.max_parallelism is not None and dist.get("maxParallel") is None:
            # The room came from deployment.config.maxParallelism: written down, it stays at any parallel.
            edits.append((end, end, f", maxParallel='{group.max_parallelism}'"))
    for begin, end, replacement in sorted(edits, reverse=True):
        text = text[:begin] + replacement + text[end:]
    return text


def _dists(app: ast.App) -> list[ast.Annotation]:
    return [d for e in app.elements if isinstance(e, ast.Annotated) and (d := e.annotation("dist")) is not None]


def _closing(text: str, begin: int) -> int:
    """The offset of the `)` that closes the annotation starting at `begin` (quotes respected)."""
    depth, quote = 0, None
    for at in range(begin, len(text)):
        char = text[at]
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return at
    raise DeployError("an @dist annotation of the deployed app is not closed")  # the text parsed: cannot happen


def scaled_app(plane, app: str, exec_group: str, parallel: int, max_parallelism: int | None = None):
    """The recorded `app` with `exec_group` at `parallel` instances, loaded (a deploy.steps.LoadedApp) and ready to deploy;
    `max_parallelism` is the cluster's default room (deployment.config.maxParallelism)."""
    from sp_dagster.cluster.store.deployments import get_deployment
    from sp_dagster.deploy.steps import load_app, plan_app

    record = get_deployment(plane, app)
    if record is None:
        raise DeployError(f"no deployment named '{app}'; `sp-dagster apps` lists the deployments")
    source = f"{app} (deployed)"
    deployed = load_app(text=record.source, source=source)
    deployed = dataclasses.replace(deployed, topology=plan_app(deployed, max_parallelism))
    return load_app(text=scaled_text(deployed, exec_group, parallel), source=source)


def scale(config, app: str, exec_group: str, parallel: int, *, wait: bool = True, timeout: float = 120.0, progress=None):
    """Deploy the recorded `app` with `exec_group` at `parallel` instances (deploy.steps.deploy's result)."""
    from sp_dagster.cluster.db import ControlPlane
    from sp_dagster.deploy.steps import deploy

    with ControlPlane.from_config(config) as plane:
        loaded = scaled_app(plane, app, exec_group, parallel, config.deployment.max_parallelism)
    return deploy(loaded, config, wait=wait, timeout=timeout, progress=progress)
