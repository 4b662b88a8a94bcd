"""How far advice may scale each execution group of a recorded app: its maximum parallelism today.
That is the group's declared `@dist(maxParallel)`, or else what a redeploy can do without moving keys
between the partitions of a running topic or breaking the planner's rules (`max_parallel`; see
"Parallelism advice" in docs/operations/scaling.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sp_dagster.siddhi import SiddhiQLError, ast, load
from sp_dagster.topology import plan
from sp_dagster.topology.grouping import DEFAULT_GROUP
from sp_dagster.topology.model import FIELD_GROUPING, ROUND_ROBIN
from sp_dagster.topology.output import to_dict


def max_parallel(app: str, source: str, recorded: dict[str, Any], exec_group: str) -> int | None:
    """The maximum parallelism of `exec_group` in the recorded plan of `app` (None: no maximum).

    Its declared `@dist(maxParallel)` when it has one; otherwise:

    - a keyed group (it reads field-grouped topics): the partitions of those topics (more instances
      would read nothing; more partitions move keys under running consumers);
    - a group that reads round-robin topics: no maximum (None; a redeploy spreads it wider);
    - a group whose every input reaches every instance (broadcast, triggers, its own @source): its
      parallelism (more instances would not share the load);
    - a group at parallel 1: as it would be planned at parallel 2, or 1 when the planner refuses that
      (state outside partitions, in-memory tables, ...).
    """
    group = _group(recorded, app, exec_group)
    if group.get("max_parallelism") is not None:
        return int(group["max_parallelism"])
    parallel = int(group["parallelism"])
    if parallel == 1:
        try:
            widened = to_dict(plan(_with_parallel(load(source, app), exec_group, 2), app))
        except SiddhiQLError:
            return 1
        strategies = {s["strategy"] for s in _group(widened, app, exec_group)["inputs"].values() if s.get("topic")}
        return None if strategies & {FIELD_GROUPING, ROUND_ROBIN} else 1
    inputs = [s for s in group["inputs"].values() if s.get("topic")]
    keyed = {s["topic"] for s in inputs if s["strategy"] == FIELD_GROUPING}
    if keyed:
        partitions = {t["name"]: int(t["partitions"]) for t in recorded.get("topics") or []}
        return max(parallel, min(partitions.get(topic, parallel) for topic in keyed))
    return None if any(s["strategy"] == ROUND_ROBIN for s in inputs) else parallel


def _group(planned: dict[str, Any], app: str, exec_group: str) -> dict[str, Any]:
    return next(g for g in planned["groups"] if g["name"] == f"{app}-{exec_group}")


def _with_parallel(app: ast.App, exec_group: str, parallel: int) -> ast.App:
    """The app with every element of `exec_group` at `parallel`."""

    def widen(annotation: ast.Annotation) -> ast.Annotation:
        if annotation.name.lower() != "dist" or (annotation.get("execGroup") or DEFAULT_GROUP) != exec_group:
            return annotation
        kept = tuple(e for e in annotation.elements if (e.key or "").lower() != "parallel")
        return dataclasses.replace(annotation, elements=(*kept, ast.AnnotationElement(str(parallel), "parallel")))

    elements = []
    for element in app.elements:
        if isinstance(element, ast.Annotated) and element.annotation("dist") is not None:
            element = dataclasses.replace(element, annotations=tuple(widen(a) for a in element.annotations))
        elements.append(element)
    return dataclasses.replace(app, elements=tuple(elements))
