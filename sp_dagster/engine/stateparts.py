"""An app's stateful parts by name, each with a fingerprint of its definition, and which saved parts fit a new app.
A part's fingerprint changes exactly when its state may no longer fit: `carry_over(old, new)` says
which parts of a changed app keep their state, and `AppRuntime.restore(..., partial=True)` does it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from sp_dagster.siddhi import ast
from sp_dagster.siddhi.render import render_element, render_partition, render_query

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ElementT = TypeVar("_ElementT", bound=ast.Annotated)


def part_definitions(app: ast.App) -> dict[str, str]:
    """Each stateful part's name (as AppRuntime names it) and its definition's text.

    A snapshot holds one state per part: `query:<name>`, `partition:<i>`, `table:<name>`,
    `aggregation:<name>`, `window:<name>`, `trigger:<name>`.
    """
    parts: dict[str, str] = {}
    counter = 0
    partitions = 0
    for element in app.elements:
        if isinstance(element, ast.Query):
            counter += 1
            parts[f"query:{element.name or f'query_{counter}'}"] = render_query(element)
        elif isinstance(element, ast.Partition):
            counter += len(element.queries)
            parts[f"partition:{partitions}"] = render_partition(element)
            partitions += 1
    kinds = {ast.TableDefinition: "table", ast.AggregationDefinition: "aggregation", ast.WindowDefinition: "window", ast.TriggerDefinition: "trigger"}
    for definition in app.definitions:
        if isinstance(definition, (ast.TableDefinition, ast.AggregationDefinition, ast.WindowDefinition, ast.TriggerDefinition)):
            parts[f"{kinds[type(definition)]}:{definition.name}"] = render_element(_bare(definition))
    return parts


def _bare(definition: _ElementT) -> _ElementT:
    """The definition without its annotations (a @store or @source change keeps its state's shape)."""
    return dataclasses.replace(definition, annotations=()) if getattr(definition, "annotations", None) else definition


def fingerprints(app: ast.App, analysis) -> dict[str, str]:
    """Each stateful part's name and the fingerprint of its definition with the attributes of what it names.

    The definition is hashed without its annotations, together with the attributes of every
    stream, table or window it names.
    """
    result = {}
    for name, text in part_definitions(app).items():
        named = sorted({token for token in _NAME.findall(text)})
        schemas = [f"{n}({', '.join(f'{a.name} {a.type}' for a in attributes)})" for n in named if (attributes := analysis.attributes(n)) is not None]
        body = "\n".join([name.split(":", 1)[0], text, *schemas])
        result[name] = hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]
    return result


def match_parts(mine: Mapping[str, str], saved: Mapping[str, str]) -> dict[str, str]:
    """For each of my parts whose state fits a saved one: my name -> the saved part's name.

    The same name with the same fingerprint first; then a saved part of the same kind with the
    same fingerprint that nothing took (a query whose generated name moved, a partition whose index did)."""
    matched: dict[str, str] = {}
    for name, print_ in mine.items():
        if saved.get(name) == print_:
            matched[name] = name
    taken = set(matched.values())
    for name, print_ in mine.items():
        if name in matched:
            continue
        kind = name.split(":", 1)[0]
        for other, other_print in saved.items():
            if other not in taken and other_print == print_ and other.split(":", 1)[0] == kind:
                matched[name] = other
                taken.add(other)
                break
    return matched


@dataclass(frozen=True)
class CarryOver:
    """Which parts of a changed app keep their state, and which start empty."""

    kept: tuple[str, ...]
    fresh: tuple[str, ...]

    def describe(self) -> str:
        """One line: what keeps its state and what starts empty."""
        kept = ", ".join(self.kept) or "nothing"
        fresh = ", ".join(self.fresh) or "nothing"
        return f"state kept: {kept}; starting empty: {fresh}"


def carry_over(old_text: str, new_text: str) -> CarryOver:
    """What a change from `old_text` to `new_text` keeps of the app's state (both SiddhiQL)."""
    from sp_dagster.siddhi.validate import load_with_analysis

    old, new = (fingerprints(*load_with_analysis(text)) for text in (old_text, new_text))
    matched = match_parts(new, old)
    return CarryOver(tuple(sorted(matched)), tuple(sorted(set(new) - set(matched))))
